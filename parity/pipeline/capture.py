"""Capture of one cell (model x dtype x provider) through the provider's runner: per-layer values,
own values, status and timing files."""

from __future__ import annotations

import time
from pathlib import Path

from parity.core.oracle import has_baseline
from parity.backends import CaptureJob, fingerprint, load_runner
from parity.backends.capture_driver import latency_stats, onnx_file_unsupported, write_own
from parity.backends.runner import CaptureResult
from parity.config import imports, inputspec, params as config
from parity.core import modelfiles, store
from parity.core.io import read_json, write_json
from parity.pipeline.inputs import load
from parity.pipeline.shapes import capture_by_shape
from parity.pipeline.sink import StoreSink
from parity.config import schema

def capture_cell(p: dict, model: str, dtype: str, provider: str, model_dir: Path, inputs: Path, out: Path,
                 timing: Path, calibration: Path | None = None, engine_dir: Path | None = None,
                 reference: Path | None = None, background: bool = False) -> list[str]:
    """Write layers.parquet, own.parquet, status.json under `out` and the timing file; the lines to print.
    `background`: Parquet encoded on a thread beside the runs (StoreSink), where memory is to spare."""
    c = schema.of(p)
    timed = bool(c.capture.latency)  # capture.latency: opt-in
    pc = p["providers"][provider]
    job = CaptureJob(model=model, model_cfg=p["models"][model], dtype=dtype, dtype_cfg=p["dtypes"][dtype],
                     provider=provider, provider_cfg=pc, model_dir=Path(model_dir), seed=c.seed,
                     threads=c.capture.threads, calibration=calibration, engine_dir=engine_dir,
                     reference=reference)
    key = config.cell_key(model, dtype, provider)
    t0 = time.perf_counter()
    # the values stream to Parquet sample by sample (and the oracle's sums with them)
    sink = StoreSink(out, {"cell": key, "status": "OK"}, {"cell": key, "kind": "own"},
                     reference is not None and Path(reference).exists() and has_baseline(p["dtypes"][dtype]),
                     background=background)
    res, settings, by_shape = _run(p, job, provider, inputs, sink, timed)
    if res.samples:  # the shapes ran one by one after a failure: their values were kept in memory
        rows = [t for k, named in enumerate(res.samples) for t in store.rows_from(k, named)]
        store.write(out / "layers.parquet", rows, {"cell": key, "status": res.status})
        first = min((t.sample for t in rows), default=0)  # sample 0's shape may have failed
        n_layers = sum(1 for t in rows if t.sample == first and not store.is_output(t.name))
        own = write_own(out / "own.parquet", res, key)
        (out / "oracle_sums.json").unlink(missing_ok=True)
    else:
        own = sink.finish(res)
        n_layers = sink.first_layers or 0 if res.status == "OK" else 0
    status = {"cell": key, "model": model, "dtype": dtype, "provider": provider,
              "status": res.status, "reason": res.reason, "layers": n_layers, "own": own}
    if by_shape:  # models.<m>.shapes: each shape's status (a failure at one shape names it)
        status["shapes"] = by_shape
    if settings:  # what the runner resolved on this machine (ort_int8: reduce_range)
        status["settings"] = settings
    node = fingerprint.cluster_node(pc["uses"], config.runner_components(pc))
    if node:  # parity repro --cluster: where the numbers come from (absent off a cluster: same bytes)
        status["node"] = node
    if engine_dir is not None and (engine_dir / "build.json").exists():
        status["engine"] = _engine_info(engine_dir)
    write_json(out / "status.json", status)
    lat = latency_stats(res.latency_ms)
    write_json(timing, {"cell": key, "status": res.status, "latency": timed, "warmup": res.warmup, **lat})
    quant = []
    if res.status == "OK" and not by_shape and schema.mode(job.dtype_cfg) in ("int4_weight", "int8_dynamic", "int8_static"):
        # lazy: int4 / int8 cells only: their quantised oracle (issue 35; the ONNX reference evaluator)
        from parity.pipeline import quant_reference
        quant = quant_reference.write(job, load(inputs), out, reference, settings)
    return _lines(key, res, n_layers, lat, status, settings, time.perf_counter() - t0) + quant


def _run(p: dict, job, provider: str, inputs: Path, sink, timed: bool):
    """The provider's runner on every input shape: (CaptureResult, runner settings, status by shape)."""
    c, pc = schema.of(p), p["providers"][provider]
    unavailable = fingerprint.cluster_unavailable(provider)  # parity repro --cluster: no node offers it
    if not unavailable and _torch_runner_on_onnx_file(job, pc):  # decided without importing the runner (torch)
        res = CaptureResult("UNSUPPORTED", onnx_file_unsupported(job))
        sets = inputspec.sample_sets(p["models"][job.model], c.inputs.samples)
        return res, {}, None if sets[0][0] is None else {lab: {"status": res.status, "reason": res.reason}
                                                         for lab, _ in sets}
    try:
        cls = load_runner(pc["runner"], pc.get("import"))
    except ValueError as e:
        return CaptureResult("UNAVAILABLE", f"{e} <providers.{provider}.runner>"), {}, None
    m = p["models"][job.model]  # several input shapes: a failure says which (parity.pipeline.shapes)
    if unavailable:
        res, by_shape = CaptureResult("UNAVAILABLE", unavailable), None
    else:
        res, by_shape = capture_by_shape(
            cls, job, load(inputs), inputspec.sample_sets(m, c.inputs.samples),
            c.capture.warmup if timed else 0, c.capture.repeats if timed else 0,
            lambda label: inputspec.describe(m, label), sink)
    settings = cls.settings(job) if res.status != "UNSUPPORTED" and not unavailable else {}
    return res, settings, by_shape


def _torch_runner_on_onnx_file(job, pc: dict) -> bool:
    """An ONNX-file model on a runner that takes torch models only, read from the runner's source (its
    class attributes onnx_based and engine_build, as Python would find them; never imported): the
    cell is UNSUPPORTED without loading torch (run_capture says the same after an import). False
    when the source cannot tell."""
    if not modelfiles.is_onnx_file(job.model_cfg):
        return False
    mod, _, name = str(pc.get("runner", "")).partition(":")
    found = [imports.class_value(mod, name, a) for a in ("onnx_based", "engine_build")] if name else [None]
    return found == [False, False]


def _lines(key: str, res, n_layers: int, lat: dict, status: dict, settings: dict, seconds: float) -> list[str]:
    extra = f", median {lat['median_ms']:.3f} ms" if lat else ""
    lines = [f"capture@{key}: {res.status}{' (' + res.reason + ')' if res.reason else ''}, "
             f"{n_layers} layers{extra}, own error {'measured' if status['own']['measured'] else 'not measured'}, "
             f"{seconds:.1f}s"]
    if settings.get("reduce_range_from"):
        lines.append(f"capture@{key}: reduce_range={str(settings['reduce_range']).lower()} "
                     f"({settings['reduce_range_from']})")
    return lines


def _engine_info(engine_dir: Path) -> dict:
    """Which engine each number comes from, and what fusion removed in the engine under test."""
    b = read_json(engine_dir / "build.json")
    return {k: b[k] for k in ("per_layer_values_from", "plain_output_and_latency_from", "fused_away_in_plain",
                              "precision") if k in b}
