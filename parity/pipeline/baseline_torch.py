"""The trusted backend's run in torch (CPU eager) for baseline@<model>-<dtype>, and the fp32 baseline
made in the reference stage's process (fold). No onnxruntime code: the reference stage imports this
module, and an onnxruntime change must not re-run it (tests/test_deps.py)."""

from __future__ import annotations

import time
from pathlib import Path

from parity.backends.base import WHOLE_MAX_MB, CaptureJob, gold_rows, run_capture
from parity.config import schema
from parity.core import store
from parity.core.io import write_json
from parity.pipeline.inputs import load
from parity.pipeline.sink import StoreSink

BASELINE_PROVIDER = "torch_cpu"  # the trusted backend
BASELINE_RUNNER = "parity.backends.torch_cpu:TorchCpuRunner"

# The fp32 baseline is made in the reference stage's process (issue 23): the same torch CPU eager run at
# float32 that the reference makes, on the model it has built, with torch and the model's libraries
# imported once instead of in a process of their own (bert_base: 4.9 s of imports and build), and the
# fp64 reference it has just written still decoded (store.Writer keep_mb). The reference writes it
# under its own folder (FOLD_DIR, a staging copy: own.parquet's reference path is already relative to
# the baseline's folder), and baseline@<model>-fp32 publishes those files in its folder without
# importing torch (parity.pipeline.baseline.publish_fold). It is made whatever the dtypes swept (the
# reference cannot depend on the dtype list without re-running on every sweep): a sweep without fp32
# pays for it (resnet18 1.3 s, bert_base ~4 s) for nothing.
FOLD_DTYPE = "fp32"
FOLD_CFG = {"torch": "float32", "mode": "cast"}
FOLD_DIR = "baseline-fp32"
FOLD_FILE = "fold.json"


def torch_baseline(p: dict, model: str, dtype: str, dc: dict, model_dir: Path | None, inputs: Path, out: Path,
                   reference: Path | None = None, net=None, base_dir: Path | None = None,
                   t0: float | None = None) -> str:
    """layers.parquet, own.parquet, oracle_sums.json and status.json of the torch CPU eager run at
    `dtype` (config `dc`) under `out`; the summary line. `net`: a model built already; `base_dir`:
    the folder own.parquet's reference path is relative to (default `out`)."""
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
                     reference is not None and Path(reference).exists(), plain=False, base_dir=base_dir)
    # lazy: the torch runner imports torch (+1.84 s, BENCHMARKS 22); an ONNX-file model's baseline runs without it
    from parity.backends.torch_cpu import TorchCpuRunner

    res = run_capture(TorchCpuRunner, job, load(inputs), 0, 0, sink)
    res_status, reason = res.status, res.reason
    own = sink.finish(res) if res_status == "OK" else (sink.finish(res), {"measured": False})[1]
    n = sink.layers.count if res_status == "OK" else 0
    return done(out, key, BASELINE_PROVIDER, res_status, reason, own, n, t0)


def done(out: Path, key: str, provider: str, res_status: str, reason: str, own: dict, n: int, t0: float) -> str:
    """status.json of a baseline; the summary line."""
    write_json(out / "status.json", {"baseline": key, "provider": provider, "status": res_status,
                                     "reason": reason, "own": own})
    return (f"baseline@{key}: {res_status}{' (' + reason + ')' if reason else ''}, {n} tensors, "
            f"{time.perf_counter() - t0:.1f}s")


def keep_mb(weight_bytes: int | None) -> float:
    """How many MB of the fp64 reference the fold keeps decoded: parity.backends.base.gold_rows' bound."""
    return min(max((weight_bytes or 0) / 2**20, store.KEEP_MB), WHOLE_MAX_MB)


def folds(dtype: str, dc: dict) -> bool:
    """Whether baseline@<model>-`dtype` is the reference stage's fold (torch float32, cast mode)."""
    return dtype == FOLD_DTYPE and dc.get("torch") == FOLD_CFG["torch"] and schema.mode(dc) == FOLD_CFG["mode"]


def fold(p: dict, model: str, net, inputs: Path, reference_out: Path, baseline_out: Path,
         weight_bytes: int | None, kept: list | None = None) -> str:
    """The fp32 baseline of `model` in the reference's process, on its model `net`, written under
    `reference_out`/FOLD_DIR for `baseline_out` (the baseline stage's folder). `kept`: the fp64
    reference's values as its writer kept them (store.Writer keep_mb; None: decoded from the file).
    The summary line."""
    staging = Path(reference_out) / FOLD_DIR
    staging.mkdir(parents=True, exist_ok=True)
    gold = Path(reference_out) / "fp64.parquet"
    if gold.exists():
        gold_rows(gold, weight_bytes=weight_bytes).prime(kept)
    line = torch_baseline(p, model, FOLD_DTYPE, FOLD_CFG, None, inputs, staging, gold, net, baseline_out)
    write_json(staging / FOLD_FILE, {"for": str(baseline_out), "dtype": FOLD_CFG})
    return line
