"""baseline@model-dtype: the trusted backend (torch CPU eager) at one dtype, on the same inputs as
every cell: per-layer values to Parquet. The fp64 oracle (parity.analysis.oracle) measures each
cell's error against fp64 relative to this baseline's error at the same precision, so one baseline
serves every provider of that model and dtype.

Writes, under --out: layers.parquet, own.parquet (each layer's own values, with --reference) and
status.json (status OK, or UNSUPPORTED for precision modes
torch CPU eager does not reproduce: int8, fp8, tf32; those cells are judged by tolerance).
"""

from __future__ import annotations

import time
from pathlib import Path

from parity import config, store
from parity.analysis.oracle import has_baseline
from parity.backends.base import CaptureJob, run_capture, write_own
from parity.io import write_json

PROVIDER = "torch_cpu"  # the trusted backend
RUNNER = "parity.backends.torch_cpu:TorchCpuRunner"


def main(argv=None) -> int:
    ap = config.stage_parser("stages.baseline", __doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", required=True)
    ap.add_argument("--model-dir", required=True, help="export stage output (unused by torch; kept for the job)")
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--reference", help="fp64.parquet of the reference stage: each layer's own error")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    p = config.load_or_die(a.params)
    from stages.inputs import load

    dc = p["dtypes"][a.dtype]
    key = f"{a.model}-{a.dtype}"
    out = Path(a.out)
    t0 = time.perf_counter()
    if not has_baseline(dc):
        res_status, reason, rows = "UNSUPPORTED", (f"dtypes.{a.dtype}.mode is {dc.get('mode')!r}: torch CPU eager "
                                                  "has no such mode; cells of this dtype are judged by tolerance"), []
    elif p["models"][a.model]["arch"]["source"] == "onnx":  # an ONNX file: ORT CPU, no optimisation
        from parity.pipeline import onnx_reference

        res = onnx_reference.ort_capture(p, a.model, load(a.inputs), a.dtype)
        res_status, reason = res.status, res.reason
        rows = [t for k, named in enumerate(res.samples) for t in store.rows_from(k, named)
                if not t.name.startswith(store.PLAIN)]
    else:
        from parity.backends.torch_cpu import TorchCpuRunner

        job = CaptureJob(model=a.model, model_cfg=p["models"][a.model], dtype=a.dtype, dtype_cfg=dc,
                         provider=PROVIDER, provider_cfg={"runner": RUNNER, "dtypes": [a.dtype], "options": {}},
                         model_dir=Path(a.model_dir), seed=p.get("seed", 0),
                         threads=p.get("capture", {}).get("threads", 0),
                         reference=Path(a.reference) if a.reference else None)
        res = run_capture(TorchCpuRunner, job, load(a.inputs), 0, 0)
        res_status, reason = res.status, res.reason
        rows = [t for k, named in enumerate(res.samples) for t in store.rows_from(k, named)
                if not t.name.startswith(store.PLAIN)]
    store.write(out / "layers.parquet", rows if res_status == "OK" else [], {"baseline": key, "status": res_status})
    own = write_own(out / "own.parquet", res, key) if res_status == "OK" else {"measured": False}
    provider = "ort_cpu_noopt" if p["models"][a.model]["arch"]["source"] == "onnx" else PROVIDER
    write_json(out / "status.json", {"baseline": key, "provider": provider, "status": res_status, "reason": reason,
                                     "own": own})
    print(f"baseline@{key}: {res_status}{' (' + reason + ')' if reason else ''}, {len(rows)} tensors, "
          f"{time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    from parity.io import exit_now

    exit_now(main())  # outputs are in place; skip torch's interpreter teardown
