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
A failing cell is a result (EXPORT_FAIL / INFER_FAIL / UNAVAILABLE / UNSUPPORTED), not a failed stage.
"""

from __future__ import annotations

import time
from pathlib import Path

from parity.config import params as config
from parity.core import memory
from parity.core.store import reuse_pool
from parity.pipeline.capture import capture_cell
from parity.pipeline.publish import keep_mb
from parity.config import schema


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
    t0 = time.perf_counter()
    key = config.cell_key(a.model, a.dtype, a.provider)
    # W: the exported graph's initialisers; SA: the reference's fp32 values (beside --reference)
    sized = memory.guard_graph("capture", key, schema.of(p).inputs.samples, a.model, Path(a.model_dir) / "model.onnx",
                               Path(a.reference).with_name("fp32.parquet") if a.reference else None)
    if sized is None:
        return 1
    # memory to spare (the fp64 reference stays decoded): decoded buffers reused (store.reuse_pool) and
    # Parquet encoded beside the runs; not for resnet50, whose peak they take to its bound
    spare = keep_mb(sized.get("w_bytes"), sized.get("sa_bytes")) is not None
    if spare:
        reuse_pool()

    opt = {k: Path(v) if v else None for k, v in (("calibration", a.calibration), ("engine_dir", a.engine_dir),
                                                  ("reference", a.reference))}
    for line in capture_cell(p, a.model, a.dtype, a.provider, Path(a.model_dir), Path(a.inputs), Path(a.out),
                             Path(a.timing), background=spare, **opt):
        print(line)
    memory.record(a.timing, "capture", key, t0, sized, merge=True)  # peak RSS beside the latency
    return 0


if __name__ == "__main__":
    from parity.core.io import exit_now

    exit_now(main())  # outputs are in place; skip torch's interpreter teardown
