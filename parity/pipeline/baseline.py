"""The trusted backend (torch CPU eager) at one dtype, on the same inputs as every cell: the fp64
oracle's yardstick (parity.core.oracle), shared by every provider of that model and dtype. The
torch run is parity.pipeline.baseline_torch; the fp32 one is made with the reference
(parity.pipeline.fold) and published by parity.pipeline.publish.publish_fold."""

from __future__ import annotations

import time
from pathlib import Path

from parity.analysis import sums
from parity.core.oracle import has_baseline
from parity.pipeline.sink import write_own
from parity.core import modelfiles, store
from parity.pipeline.baseline_torch import BASELINE_PROVIDER, done, torch_baseline
from parity.pipeline.inputs import load


def capture_baseline(p: dict, model: str, dtype: str, model_dir: Path, inputs: Path, out: Path,
                     reference: Path | None = None) -> str:
    """The trusted backend at `dtype` (layers.parquet, own.parquet, status.json under `out`): the
    oracle's yardstick. UNSUPPORTED for precision modes torch CPU eager does not reproduce."""
    dc = p["dtypes"][dtype]
    key = f"{model}-{dtype}"
    t0 = time.perf_counter()
    res = None
    if not has_baseline(dc):
        res_status, reason, rows = "UNSUPPORTED", (f"dtypes.{dtype}.mode is {dc.get('mode')!r}: torch CPU eager "
                                                  "has no such mode; cells of this dtype are judged by tolerance"), []
    elif modelfiles.is_onnx_file(p["models"][model]):  # an ONNX file: ORT CPU, no optimisation
        # lazy: ONNX-source models only; loads onnxruntime (+0.14 s, BENCHMARKS 22) that a torch baseline never uses
        from parity.pipeline import onnx_reference

        res = onnx_reference.ort_capture(p, model, load(inputs), dtype)
        res_status, reason = res.status, res.reason
        rows = [t for k, named in enumerate(res.samples) for t in store.rows_from(k, named)
                if not t.name.startswith(store.PLAIN)]
    else:  # torch CPU eager (parity.pipeline.baseline_torch; the reference stage runs it too)
        return torch_baseline(p, model, dtype, dc, model_dir, inputs, out, reference, t0=t0)
    store.write(out / "layers.parquet", rows if res_status == "OK" else [], {"baseline": key, "status": res_status})
    own = write_own(out / "own.parquet", res, key) if res_status == "OK" else {"measured": False}
    if res is not None:
        sums.write_for(out, res, reference, dc)
    else:
        (out / sums.FILE).unlink(missing_ok=True)
    provider = "ort_cpu_noopt" if modelfiles.is_onnx_file(p["models"][model]) else BASELINE_PROVIDER
    return done(out, key, provider, res_status, reason, own, len(rows), t0)
