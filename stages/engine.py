"""engine@model-dtype-provider: build the serialized TensorRT engines of one cell (providers with
`engine: true`; dvc.yaml's matrix iterates engine_providers, empty unless trt is selected).

Writes, under --out: plain.plan (from model.onnx: the engine under test), layers.plan (from
layers.onnx: every layer an output, for per-layer values) and build.json (precision, flags, the
engine's layers and which layer outputs fusion removed in plain.plan). --timing-cache is read before
and written after the build (a DVC `persist` out, so a rebuild reuses the tactic timings). When the
cell cannot be built here, build.json records the status (UNSUPPORTED / UNAVAILABLE / EXPORT_FAIL)
and the reason, and capture_engine@cell reports it: a result, not a failed pipeline. Never imports torch.
"""

from __future__ import annotations

import time
from pathlib import Path

from parity.config import params as config
from parity.core.io import write_json
from parity.pipeline.engine import build_cell


def main(argv=None) -> int:
    ap = config.stage_parser("stages.engine", __doc__, cell=True)
    ap.add_argument("--model-dir", required=True, help="export stage output (model.onnx, layers.onnx, layers.json)")
    ap.add_argument("--calibration", required=True, help="INT8 calibration samples (inputs stage)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--timing-cache", required=True)
    a = ap.parse_args(argv)
    p = config.load_or_die(a.params)

    key = config.cell_key(a.model, a.dtype, a.provider)
    out, tc = Path(a.out), Path(a.timing_cache)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    info = build_cell(p, a.dtype, a.provider, Path(a.model_dir), Path(a.calibration), out, tc)
    if not tc.exists():  # the persisted timing cache is a declared out: it must exist
        tc.parent.mkdir(parents=True, exist_ok=True)
        tc.write_bytes(b"")
    write_json(out / "build.json", {"cell": key, **info})
    print(f"engine@{key}: {info['status']}{' (' + info['reason'] + ')' if info.get('reason') else ''}, "
          f"{time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
