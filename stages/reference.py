"""reference@model: torch CPU fp32 outputs, whole model and per layer, to Parquet (fp32.parquet);
with `reference.fp64: true` also an fp64 golden run (fp64.parquet), which also holds each leaf call's
first floating input as `pre:<call>` (what the capture stage feeds each layer to measure its own
error; fp32.parquet has leaf outputs only, so the diff's layer names are unchanged).
For the models built in torch (params torch_models); a model given as an ONNX file gets
reference_onnx@model (stages/reference_onnx.py) instead: dvc.yaml dispatches on the source, so this
stage depends on no onnxruntime code.
--staged: these files as the export stage made them (parity.pipeline.fold), published when made for
--out; else computed here (with --baseline-out, the fp32 baseline too, under --out/baseline-fp32)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from parity.config.stageargs import stage_parser
from parity.core import memory
from parity.pipeline.publish import keep_mb, made_by, made_for, publish_tree


def main(argv=None) -> int:
    ap = stage_parser("stages.reference", __doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--timing", help="peak RSS and the memory estimate (parity.core.memory), apart from the values")
    ap.add_argument("--staged", help="the export stage's staging of these files (published when made for --out)")
    ap.add_argument("--baseline-out", help="baseline@<model>-fp32's folder: make that baseline here too")
    a = ap.parse_args(argv)
    t0, out = time.perf_counter(), Path(a.out)
    if a.staged and made_for(Path(a.staged), out):
        by = made_by(Path(a.staged))
        print(f"reference@{a.model}: {publish_tree(Path(a.staged), out)} files made by {by} -> {out}")
        memory.record(a.timing, "reference", a.model, t0, {"made_by": by})
        return 0
    # lazy: params' code (+0.1 s) only where computed (the export that staged the files validated them)
    from parity.config import params as config
    # lazy: torch (+1.84 s, BENCHMARKS 22) only where the reference is computed here, not published
    from parity.pipeline import fold, memsize, reference

    p = config.load_or_die(a.params)
    sized = memsize.guard("reference", a.model, p, a.model, like="baseline" if a.baseline_out else None)
    if sized is None:
        return 1
    # the fp32 baseline too only where the fp64 reference stays decoded (else its stage runs it: a baseline
    # on top of a streaming reference's peak passes 3 W + 1 GiB, resnet50)
    with_base = a.baseline_out and keep_mb(sized.get("w_bytes"), sized.get("sa_bytes")) is not None
    try:
        print(fold.reference_and_baseline(p, a.model, reference.build(p, a.model), Path(a.inputs), out, out,
                                          Path(a.baseline_out) if with_base else None, sized))
    except reference.TinyOutput as e:  # the message says what proves nothing and how to fix it
        print(e, file=sys.stderr)
        return 1
    memory.record(a.timing, "reference", a.model, t0, sized)
    return 0


if __name__ == "__main__":
    from parity.core.io import exit_now

    exit_now(main())  # outputs are in place; skip torch's interpreter teardown
