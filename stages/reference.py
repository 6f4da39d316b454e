"""reference@model: torch CPU fp32 outputs, whole model and per layer, to Parquet (fp32.parquet);
with `reference.fp64: true` also an fp64 golden run (fp64.parquet), which also holds each leaf call's
first floating input as `pre:<call>` (what the capture stage feeds each layer to measure its own
error; fp32.parquet has leaf outputs only, so the diff's layer names are unchanged).
For the models built in torch (params torch_models); a model given as an ONNX file gets
reference_onnx@model (stages/reference_onnx.py) instead: dvc.yaml dispatches on the source, so this
stage depends on no onnxruntime code."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from parity.config import params as config
from parity.core import memory
from parity.pipeline import memsize, reference
from parity.pipeline.inputs import load
from parity.config import schema
from parity.pipeline import reference


def main(argv=None) -> int:
    ap = config.stage_parser("stages.reference", __doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--timing", help="peak RSS and the memory estimate (parity.core.memory), apart from the values")
    a = ap.parse_args(argv)
    p = config.load_or_die(a.params)
    t0 = time.perf_counter()

    sized = memsize.guard("reference", a.model, p, a.model)
    if sized is None:
        return 1
    code = _run(p, a)
    if code == 0:
        memory.record(a.timing, "reference", a.model, t0, sized)
    return code


def _run(p: dict, a) -> int:
    feeds = load(a.inputs)
    out = Path(a.out)
    try:
        print(reference.write(p, a.model, feeds, out, bool(schema.of(p).reference.fp64)))
    except reference.TinyOutput as e:
        print(f"reference@{a.model}: model output max |value| {e} <= {reference.MIN_OUTPUT_ABS:g}: a diff "
              f"against it proves nothing (any actual within atol of zero passes). Initialise the "
              f"model's head, set models.{a.model}.arch.calibrate for BatchNorm nets, or change its "
              f"inputs.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from parity.core.io import exit_now

    exit_now(main())  # outputs are in place; skip torch's interpreter teardown
