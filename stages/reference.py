"""reference@model: torch CPU fp32 outputs, whole model and per layer, to Parquet (fp32.parquet);
with `reference.fp64: true` also an fp64 golden run (fp64.parquet), which also holds each leaf call's
first floating input as `pre:<call>` (what the capture stage feeds each layer to measure its own
error; fp32.parquet has leaf outputs only, so the diff's layer names are unchanged).
For the models built in torch (params torch_models); a model given as an ONNX file gets
reference_onnx@model (stages/reference_onnx.py) instead: dvc.yaml dispatches on the source, so this
stage depends on no onnxruntime code.

--baseline-out: also the fp32 baseline, in this process on the model it built, under --out/baseline-fp32
for that stage to publish (parity.pipeline.baseline_torch.fold)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from parity.config import params as config
from parity.core import memory
from parity.pipeline import memsize, reference
from parity.pipeline.baseline_torch import fold, keep_mb
from parity.pipeline.inputs import load
from parity.config import schema


def main(argv=None) -> int:
    ap = config.stage_parser("stages.reference", __doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--timing", help="peak RSS and the memory estimate (parity.core.memory), apart from the values")
    ap.add_argument("--baseline-out", help="baseline@<model>-fp32's folder: make that baseline here too (fold)")
    a = ap.parse_args(argv)
    p = config.load_or_die(a.params)
    t0 = time.perf_counter()

    # with the fold, the process holds the baseline's run too: sized by the larger of the two stages
    sized = memsize.guard("baseline" if a.baseline_out else "reference", a.model, p, a.model)
    if sized is None:
        return 1
    code = _run(p, a, sized)
    if code == 0:
        memory.record(a.timing, "reference", a.model, t0, sized)
    return code


def _run(p: dict, a, sized: dict) -> int:
    feeds, out = load(a.inputs), Path(a.out)
    try:
        net = reference.build(p, a.model)
        kept = {"mb": keep_mb(sized.get("w_bytes"))} if a.baseline_out else None
        print(reference.write(p, a.model, feeds, out, bool(schema.of(p).reference.fp64), net, kept))
    except reference.TinyOutput as e:  # the message says what proves nothing and how to fix it
        print(e, file=sys.stderr)
        return 1
    if a.baseline_out:
        print(fold(p, a.model, net, Path(a.inputs), out, Path(a.baseline_out), sized.get("w_bytes"),
                   kept.get("groups")))
    return 0


if __name__ == "__main__":
    from parity.core.io import exit_now

    exit_now(main())  # outputs are in place; skip torch's interpreter teardown
