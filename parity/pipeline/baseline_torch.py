"""The trusted backend's run in torch (CPU eager) for baseline@<model>-<dtype> (and for the fp32 baseline
made with the reference, parity.pipeline.fold). No onnxruntime code: the export and reference stages
import this module, and an onnxruntime change must not re-run them (tests/test_deps.py)."""

from __future__ import annotations

import time
from pathlib import Path

from parity.backends.capture_driver import run_capture
from parity.backends.runner import CaptureJob
from parity.config import schema
from parity.core import store
from parity.core.io import write_json
from parity.pipeline.inputs import load
from parity.pipeline.sink import StoreSink

BASELINE_PROVIDER = "torch_cpu"  # the trusted backend
BASELINE_RUNNER = "parity.backends.torch_cpu:TorchCpuRunner"

def torch_baseline(p: dict, model: str, dtype: str, dc: dict, model_dir: Path | None, inputs: Path, out: Path,
                   reference: Path | None = None, net=None, base_dir: Path | None = None,
                   base_path: Path | None = None, t0: float | None = None, background: bool = False,
                   replay: Path | None = None) -> str:
    """layers.parquet, own.parquet, oracle_sums.json and status.json of the torch CPU eager run at
    `dtype` (config `dc`) under `out`; the summary line. `net`: a model built already; `base_dir` and
    `base_path`: the folder own.parquet's reference path is relative to (default `out`) and that path
    (default `reference`): where the files will be published (parity.pipeline.fold); `background`:
    Parquet encoded on a thread beside the runs (StoreSink), where memory is to spare; `replay`: the
    fp32 reference's fp32.parquet made in this process on `net` from the same inputs (replaying)."""
    t0 = time.perf_counter() if t0 is None else t0
    key = f"{model}-{dtype}"
    job = CaptureJob(model=model, model_cfg=p["models"][model], dtype=dtype, dtype_cfg=dc,
                     provider=BASELINE_PROVIDER,
                     provider_cfg={"runner": BASELINE_RUNNER, "dtypes": [dtype], "options": {}},
                     model_dir=Path(model_dir) if model_dir is not None else None, seed=schema.of(p).seed,
                     threads=schema.of(p).capture.threads, reference=reference, net=net)
    # streamed sample by sample (parity.pipeline.sink); the plain graph's outputs stay out of
    # layers.parquet (they are in the oracle's sums, as before). Its metadata is the reference's
    # (model, torch dtype): at fp32 the values are the reference's fp32.parquet's, so the two files
    # are the same bytes and DVC's cache keeps them once (issue 23)
    meta = {"model": model, "dtype": dc.get("torch", dtype), **({"mode": dc["mode"]} if dc.get("mode", "cast") != "cast" else {})}
    sink = StoreSink(out, meta, {"cell": key, "kind": "own"},
                     reference is not None and Path(reference).exists(), plain=False, base_dir=base_dir, base_path=base_path,
                     background=background)
    # lazy: the torch runner imports torch (+1.84 s, BENCHMARKS 22); baseline@ imports this module to publish without it
    from parity.backends.torch_cpu import TorchCpuRunner

    feeds = load(inputs)
    res = run_capture(replaying(TorchCpuRunner, feeds, replay) if replay else TorchCpuRunner, job, feeds, 0, 0, sink)
    res_status, reason = res.status, res.reason
    own = sink.finish(res) if res_status == "OK" else (sink.finish(res), {"measured": False})[1]
    n = sink.layers.count if res_status == "OK" else 0
    return done(out, key, BASELINE_PROVIDER, res_status, reason, own, n, t0)


def replaying(cls, feeds: list, fp32: Path):
    """`cls` (the torch CPU runner, at fp32) with its per-layer and plain runs read from `fp32`, the fp32
    reference's values, made in this process on the same model and inputs with the same recorder:
    the values those runs would make, the same bytes (issue 38: four bert_base forwards saved; the
    plain run's outputs are the per-layer run's model outputs, hooks only read them). The own-error
    passes still run the model (they feed it the fp64 reference's values)."""
    k_of = {id(f): k for k, f in enumerate(feeds)}
    by_sample = dict(store.Rows(fp32).by_sample())  # values read when asked for, a row group or two held

    def named(f, outputs_only: bool) -> list:
        s = by_sample[k_of[id(f)]]
        outs = [(n, s[n]) for n in s if store.is_output(n)]
        return outs if outputs_only else outs + [(n, s[n]) for n in s if not store.is_output(n)]

    class Replaying(cls):
        def infer(self, feeds):
            return named(feeds, False)

        def infer_plain(self, feeds):
            return named(feeds, True)

    return Replaying


def done(out: Path, key: str, provider: str, res_status: str, reason: str, own: dict, n: int, t0: float) -> str:
    """status.json of a baseline; the summary line."""
    write_json(out / "status.json", {"baseline": key, "provider": provider, "status": res_status,
                                     "reason": reason, "own": own})
    return (f"baseline@{key}: {res_status}{' (' + reason + ')' if reason else ''}, {n} tensors, "
            f"{time.perf_counter() - t0:.1f}s")
