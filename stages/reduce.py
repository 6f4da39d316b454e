"""reduce@model-dtype-provider (analysis.reduce: true): for a cell whose verdict is FAIL, first check
the exported graphs against torch's recorded per-layer values (parity.analysis.torch_reduce: an
exporter bug is cut at its origin, torch's values the expectation); else shrink the plain graph to
the smallest subgraph that still fails on the provider against the reference
(parity.analysis.reduce). Either way it writes a vendor's repro bundle: reduced.onnx, inputs.npz,
expected.npz, repro.py (and reduced.source.onnx against the provider). Always writes reduce.json (status REDUCED,
NOT_REPRODUCED, or SKIPPED with the reason: the cell passed, or the provider runs no ONNX graphs);
the time it took goes to --timing (measured, so apart from the deterministic folder).
"""

from __future__ import annotations

import time
from pathlib import Path

from parity.config import params as config
from parity.core.io import write_json
from parity.pipeline.reduce_cell import reduce_cell


def main(argv=None) -> int:
    ap = config.stage_parser("stages.reduce", __doc__, cell=True)
    ap.add_argument("--model-dir", required=True, help="export output (model.onnx: the plain graph)")
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--diff", required=True, help="the cell's diff folder (metrics.json: its verdict)")
    ap.add_argument("--reference", help="the reference folder (fp64.parquet: torch's per-layer inputs and outputs)")
    ap.add_argument("--baseline", help="the baseline folder at the cell's dtype (own.parquet: torch's own error)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--timing", required=True)
    a = ap.parse_args(argv)
    p = config.load_or_die(a.params)

    key = config.cell_key(a.model, a.dtype, a.provider)
    t0 = time.perf_counter()
    res = reduce_cell(p, a.model, a.dtype, a.provider, Path(a.model_dir), Path(a.inputs), Path(a.diff), Path(a.out),
                       Path(a.reference) if a.reference else None, Path(a.baseline) if a.baseline else None)
    seconds = time.perf_counter() - t0
    write_json(a.timing, {"cell": key, "status": res["status"], "seconds": round(seconds, 3),
                          "trials": res.get("trials", 0)})
    nodes = f": {len(res['nodes'])} node(s) {', '.join(res['nodes'][:3])}" if res.get("nodes") else ""
    print(f"reduce@{key}: {res['status']}{nodes}{' (' + res['reason'] + ')' if res.get('reason') else ''}, "
          f"{res.get('trials', 0)} trials, {seconds:.1f}s -> {a.out}")
    return 0


if __name__ == "__main__":
    from parity.core.io import exit_now

    exit_now(main())
