"""suite_run@suite-dtype-provider: run every case of a suite on one provider at one dtype, in a pool
of isolated long-lived workers (parity.suites.pool), next to its fp32 reference.

Writes, under --out: outputs.parquet (every case's provider outputs and gradients, named
`<case>/<tensor>`), reference.parquet (the same names from the fp32 reference on the dtype-rounded
inputs), gold.parquet (float64: the fp64 oracle's values) and floor.parquet (the oracle's trusted
backend at the cell's dtype, where it is not the outputs or the reference), results.json (one row per case: status, reason, ONNX ops, gradcheck); --timing gets the
latencies (measured, so kept apart: no diff reads them). This process never imports torch.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

from parity.config import params as config
from parity.core import store
from parity.core.io import exit_now, write_json
from parity.pipeline.suite_run import run_cell
from parity.suites import spec


def main(argv=None) -> int:
    ap = config.stage_parser("stages.suite_run", __doc__)
    for k in ("suite", "dtype", "provider", "out", "timing"):
        ap.add_argument(f"--{k}", required=True)
    ap.add_argument("--workers", type=int, default=None)
    a = ap.parse_args(argv)
    p = spec.load_or_die(a.params)  # and the selected suites checked
    key = f"{a.suite}-{a.dtype}-{a.provider}"
    t0 = time.perf_counter()
    try:
        rows, outs, refs, timing, stats = run_cell(p, a.suite, a.dtype, a.provider, a.workers)
    except spec.SuiteError as e:
        config.die(e)
    out = Path(a.out)
    md = {"suite": a.suite, "dtype": a.dtype, "provider": a.provider}
    store.write(out / "outputs.parquet", outs, md)
    for what, ts in refs.items():  # reference, gold (fp64), floor: parity.pipeline.suite_run.run_cell
        store.write(out / f"{what}.parquet", ts, md)
    write_json(out / "results.json", {"suite": a.suite, "dtype": a.dtype, "provider": a.provider, "cases": rows},
               sort_keys=False)
    wall = time.perf_counter() - t0
    write_json(a.timing, {"cases": timing, "wall_s": wall, "pool": stats})
    counts = Counter(r["status"] for r in rows)
    print(f"suite_run@{key}: {len(rows)} cases in {wall:.1f} s ({len(rows) / max(wall, 1e-9):.1f}/s): "
          + ", ".join(f"{s}={n}" for s, n in sorted(counts.items())), file=sys.stdout)
    exit_now(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
