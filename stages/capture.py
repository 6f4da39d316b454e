"""capture@model-dtype-provider: run the model on one provider at one dtype, per layer, to Parquet.

Writes, under --out: layers.parquet (every layer and the model output, per sample; empty when the
cell did not run), status.json (status, reason; `own`: whether each layer's own error was measured;
`settings`: what the runner resolved on this machine, e.g. ort_int8's reduce_range)
and, when the runner measures it from --reference (the fp64 reference, with leaf inputs `pre:<call>`),
own.parquet: per sample `<leaf>` (the leaf run on the reference's input to it) and `between:<leaf>`
(the ops between leaves run on the reference's leaf outputs). No own.parquet: own error not measured.
Latency (median/p90 of the plain graph after warm-up) is measured only with capture.latency: true
(opt-in: a validation run and a re-run pay nothing for timing). It goes to --timing, apart from the
values, because it is the one non-deterministic result: the diff stage does not read it, so timing
noise never re-runs a diff. With latency off, --timing says so (no median_ms; the report shows none).
A failing cell is a result (status EXPORT_FAIL / INFER_FAIL / UNAVAILABLE / UNSUPPORTED), not a
failed stage.
"""

from __future__ import annotations

import time
from pathlib import Path

from parity import config


def main(argv=None) -> int:
    ap = config.stage_parser("stages.capture", __doc__, cell=True)
    ap.add_argument("--model-dir", required=True, help="export stage output (model.onnx, layers.onnx)")
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--calibration", help="INT8 calibration samples (inputs stage), for int8_static")
    ap.add_argument("--engine-dir", help="engine stage output, for providers with `engine: true` (trt)")
    ap.add_argument("--reference", help="the fp64 reference (reference stage's fp64.parquet): own error")
    ap.add_argument("--out", required=True)
    ap.add_argument("--timing", required=True)
    a = ap.parse_args(argv)
    p = config.load_or_die(a.params)
    # numpy, pyarrow and the backends after the arguments: `--help` and a bad argument stay quick
    from parity import store
    from parity.backends import CaptureJob, load_runner
    from parity import inputspec
    from parity.backends.base import CaptureResult, latency_stats, write_own
    from parity.shapecapture import capture_by_shape
    from parity.io import write_json
    from stages.inputs import load

    cap = p.get("capture", {})
    timed = bool(cap.get("latency", False))  # capture.latency: opt-in
    pc = p["providers"][a.provider]
    job = CaptureJob(model=a.model, model_cfg=p["models"][a.model], dtype=a.dtype,
                     dtype_cfg=p["dtypes"][a.dtype], provider=a.provider, provider_cfg=pc,
                     model_dir=Path(a.model_dir), seed=p.get("seed", 0), threads=cap.get("threads", 0),
                     calibration=Path(a.calibration) if a.calibration else None,
                     engine_dir=Path(a.engine_dir) if a.engine_dir else None,
                     reference=Path(a.reference) if a.reference else None)
    key = config.cell_key(a.model, a.dtype, a.provider)
    t0 = time.perf_counter()
    try:
        cls = load_runner(pc["runner"], pc.get("import"))
    except ValueError as e:
        res, settings, by_shape = CaptureResult("UNAVAILABLE", f"{e} <providers.{a.provider}.runner>"), {}, None
    else:
        m = p["models"][a.model]  # several input shapes: a failure says which (parity.shapecapture)
        res, by_shape = capture_by_shape(cls, job, load(a.inputs), inputspec.sample_sets(m, p.get("inputs", {}).get(
            "samples", 1)), cap.get("warmup", 0) if timed else 0, cap.get("repeats", 1) if timed else 0,
            lambda label: inputspec.describe(m, label))
        settings = cls.settings(job) if res.status != "UNSUPPORTED" and hasattr(cls, "settings") else {}
    rows = [t for k, named in enumerate(res.samples) for t in store.rows_from(k, named)]
    out = Path(a.out)
    store.write(out / "layers.parquet", rows if res.status == "OK" or by_shape else [],
                {"cell": key, "status": res.status})
    first = min((t.sample for t in rows), default=0)  # sample 0's shape may have failed (models.<m>.shapes)
    n_layers = sum(1 for t in rows if t.sample == first and not store.is_output(t.name))
    status = {"cell": key, "model": a.model, "dtype": a.dtype, "provider": a.provider,
              "status": res.status, "reason": res.reason, "layers": n_layers,
              "own": write_own(out / "own.parquet", res, key)}
    if by_shape:  # models.<m>.shapes: each shape's status (a failure at one shape names it)
        status["shapes"] = by_shape
    if settings:  # what the runner resolved on this machine (ort_int8: reduce_range)
        status["settings"] = settings
    if job.engine_dir is not None and (job.engine_dir / "build.json").exists():
        # which engine each number comes from, and what fusion removed in the engine under test
        from parity.io import read_json

        b = read_json(job.engine_dir / "build.json")
        status["engine"] = {k: b[k] for k in ("per_layer_values_from", "plain_output_and_latency_from",
                                              "fused_away_in_plain", "precision") if k in b}
    write_json(out / "status.json", status)
    write_json(a.timing, {"cell": key, "status": res.status, "latency": timed,
                          "warmup": res.warmup, **latency_stats(res.latency_ms)})
    lat = latency_stats(res.latency_ms)
    extra = f", median {lat['median_ms']:.3f} ms" if lat else ""
    print(f"capture@{key}: {res.status}{' (' + res.reason + ')' if res.reason else ''}, "
          f"{n_layers} layers{extra}, own error {'measured' if status['own']['measured'] else 'not measured'}, "
          f"{time.perf_counter() - t0:.1f}s")
    if settings.get("reduce_range_from"):
        print(f"capture@{key}: reduce_range={str(settings['reduce_range']).lower()} ({settings['reduce_range_from']})")
    return 0


if __name__ == "__main__":
    from parity.io import exit_now

    exit_now(main())  # outputs are in place; skip torch's interpreter teardown
