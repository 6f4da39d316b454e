"""The trusted backend (torch CPU eager) at one dtype, on the same inputs as every cell: the fp64
oracle's yardstick (parity.analysis.oracle), shared by every provider of that model and dtype."""

from __future__ import annotations

import time
from pathlib import Path

from parity.analysis import sums
from parity.analysis.oracle import has_baseline
from parity.backends.base import CaptureJob, run_capture, write_own
from parity.core import store
from parity.core.io import write_json
from parity.pipeline.inputs import load
from parity.pipeline.sink import StoreSink
from parity.config import schema

BASELINE_PROVIDER = "torch_cpu"  # the trusted backend
BASELINE_RUNNER = "parity.backends.torch_cpu:TorchCpuRunner"


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
    elif p["models"][model]["arch"]["source"] == "onnx":  # an ONNX file: ORT CPU, no optimisation
        # lazy: ONNX-source models only; loads onnxruntime (+0.14 s, BENCHMARKS 22) that a torch baseline never uses
        from parity.pipeline import onnx_reference

        res = onnx_reference.ort_capture(p, model, load(inputs), dtype)
        res_status, reason = res.status, res.reason
        rows = [t for k, named in enumerate(res.samples) for t in store.rows_from(k, named)
                if not t.name.startswith(store.PLAIN)]
    else:
        job = CaptureJob(model=model, model_cfg=p["models"][model], dtype=dtype, dtype_cfg=dc,
                         provider=BASELINE_PROVIDER,
                         provider_cfg={"runner": BASELINE_RUNNER, "dtypes": [dtype], "options": {}},
                         model_dir=Path(model_dir), seed=schema.of(p).seed,
                         threads=schema.of(p).capture.threads, reference=reference)
        # streamed sample by sample (parity.pipeline.sink); the plain graph's outputs stay out of
        # layers.parquet (they are in the oracle's sums, as before). Its metadata is the reference's
        # (model, torch dtype): at fp32 the values are the reference's fp32.parquet's, so the two files
        # are the same bytes and DVC's cache keeps them once (issue 23)
        meta = {"model": model, "dtype": dc.get("torch", dtype), **({"mode": dc["mode"]} if dc.get("mode", "cast") != "cast" else {})}
        sink = StoreSink(out, meta, {"cell": key, "kind": "own"},
                         reference is not None and Path(reference).exists(), plain=False)
        # lazy: the torch runner imports torch (+1.84 s, BENCHMARKS 22); an ONNX-file model's baseline runs without it
        from parity.backends.torch_cpu import TorchCpuRunner

        res = run_capture(TorchCpuRunner, job, load(inputs), 0, 0, sink)
        res_status, reason = res.status, res.reason
        own = sink.finish(res) if res_status == "OK" else (sink.finish(res), {"measured": False})[1]
        n = sink.layers.count if res_status == "OK" else 0
        return _done(out, key, BASELINE_PROVIDER, res_status, reason, own, n, t0)
    store.write(out / "layers.parquet", rows if res_status == "OK" else [], {"baseline": key, "status": res_status})
    own = write_own(out / "own.parquet", res, key) if res_status == "OK" else {"measured": False}
    if res is not None:
        sums.write_for(out, res, reference, dc)
    else:
        (out / sums.FILE).unlink(missing_ok=True)
    provider = "ort_cpu_noopt" if p["models"][model]["arch"]["source"] == "onnx" else BASELINE_PROVIDER
    return _done(out, key, provider, res_status, reason, own, len(rows), t0)


def _done(out: Path, key: str, provider: str, res_status: str, reason: str, own: dict, n: int, t0: float) -> str:
    write_json(out / "status.json", {"baseline": key, "provider": provider, "status": res_status,
                                     "reason": reason, "own": own})
    return (f"baseline@{key}: {res_status}{' (' + reason + ')' if reason else ''}, {n} tensors, "
            f"{time.perf_counter() - t0:.1f}s")
