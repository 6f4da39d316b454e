"""Capture of one cell (model x dtype x provider) through the provider's runner: per-layer values,
own values, status and timing files."""

from __future__ import annotations

import time
from pathlib import Path

from parity.backends import CaptureJob, fingerprint
from parity.config import inputspec, params as config, schema
from parity.core.io import read_json, write_json
from parity.core.oracle import has_baseline
from parity.pipeline.shapes import run_cell
from parity.pipeline.sink import StoreSink


def capture_cell(p: dict, model: str, dtype: str, provider: str, model_dir: Path, inputs: Path, out: Path,
                 timing: Path, calibration: Path | None = None, engine_dir: Path | None = None,
                 reference: Path | None = None, background: bool = False) -> list[str]:
    """Write layers.parquet, own.parquet, status.json under `out` and the timing file; the lines to print.
    `background`: Parquet encoded on a thread beside the runs (StoreSink), where memory is to spare. The
    config is read here, once (the model's inputs as an InputPlan, the cluster node, the engine built);
    parity.pipeline.shapes runs the provider on every input shape, the sink writes the values."""
    c, pc = schema.of(p), p["providers"][provider]
    timed = bool(c.capture.latency)  # capture.latency: opt-in
    plan = inputspec.plan(p["models"][model], c.inputs.samples)
    node = fingerprint.cluster_node(pc["uses"], config.runner_components(pc))
    unavailable = fingerprint.cluster_unavailable(provider)  # parity repro --cluster: no node offers it
    engine = _engine_info(engine_dir) if engine_dir is not None and (engine_dir / "build.json").exists() else None
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
    res, settings, by_shape, lat = run_cell(job, plan, inputs, sink, (c.capture.warmup, c.capture.repeats) if timed
                                            else (0, 0), unavailable)
    own, n_layers = sink.finish_cell(res, key)
    status = {"cell": key, "model": model, "dtype": dtype, "provider": provider,
              "status": res.status, "reason": res.reason, "layers": n_layers, "own": own}
    # each shape's status (models.<m>.shapes), what the runner resolved here (ort_int8: reduce_range), the
    # node (parity repro --cluster; absent off a cluster: same bytes), the engine's build
    status.update({k: v for k, v in (("shapes", by_shape), ("settings", settings), ("node", node)) if v})
    if engine is not None:
        status["engine"] = engine
    quant = []
    if res.status == "OK" and not by_shape and schema.mode(job.dtype_cfg) in ("int4_weight", "int8_dynamic", "int8_static"):
        # lazy: int4 / int8 cells only: their quantised oracle (issue 35; the ONNX reference evaluator)
        from parity.pipeline import inputs as feeds, quant_reference
        quant = quant_reference.write(job, feeds.load(inputs), out, reference, settings)
    write_json(out / "status.json", status)
    write_json(timing, {"cell": key, "status": res.status, "latency": timed, "warmup": res.warmup, **lat})
    extra = f", median {lat['median_ms']:.3f} ms" if lat else ""
    lines = [f"capture@{key}: {res.status}{' (' + res.reason + ')' if res.reason else ''}, "
             f"{n_layers} layers{extra}, own error {'measured' if own['measured'] else 'not measured'}, "
             f"{time.perf_counter() - t0:.1f}s"]
    if settings.get("reduce_range_from"):
        lines.append(f"capture@{key}: reduce_range={str(settings['reduce_range']).lower()} "
                     f"({settings['reduce_range_from']})")
    return lines + quant


def _engine_info(engine_dir: Path) -> dict:
    """Which engine each number comes from, and what fusion removed in the engine under test."""
    b = read_json(engine_dir / "build.json")
    return {k: b[k] for k in ("per_layer_values_from", "plain_output_and_latency_from", "fused_away_in_plain",
                              "precision") if k in b}
