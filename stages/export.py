"""export@model: torch -> ONNX with every leaf-module call as a named output, checked, plus the plain graph
and an op inventory. Writes, under --out: layers.onnx (per-layer graph), model.onnx (the same graph, model
outputs only), weights.bin (both graphs' weights, stored once as ONNX external data), layers.json (output
names in execution order, module types, `regions`: per leaf call the leaf calls whose outputs feed it and
the op types between them, e.g. Softmax between qkv and out), ops.json (op types and counts, opset).
With --inputs and --reference-out (a torch model): the reference's files (and with --baseline-out the fp32
baseline's), made in this process on the model it built, staged for reference@model (parity.pipeline.fold).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from parity.config import params as config
from parity.core import memory, modelfiles
from parity.models.onnx_source import OnnxSourceError
from parity.pipeline import memsize
from parity.pipeline.export import ExportError, export_model
from parity.pipeline.onnx_export import export_file
from parity.pipeline.publish import keep_mb


def main(argv=None) -> int:
    ap = config.stage_parser("stages.export", __doc__)
    for arg in ("--model", "--out"):
        ap.add_argument(arg, required=True)
    ap.add_argument("--timing", help="peak RSS and the memory estimate (parity.core.memory), apart from the values")
    ap.add_argument("--inputs", help="the model's inputs: with --reference-out, the reference runs here too")
    ap.add_argument("--reference-out", help="reference@model's folder (its files are made here for it)")
    ap.add_argument("--baseline-out", help="baseline@model-fp32's folder (the fp32 baseline made here too)")
    a = ap.parse_args(argv)
    p = config.load_or_die(a.params)
    t0, fold = time.perf_counter(), bool(a.inputs and a.reference_out)
    # with the reference and the baseline, the process holds their runs too: sized by the largest stage
    sized = memsize.guard("export", a.model, p, a.model, like="baseline" if fold else None)
    if sized is None:
        return 1
    if fold and keep_mb(sized.get("w_bytes"), sized.get("sa_bytes")) is None:  # parity.pipeline.fold says why
        fold = False
        print(f"export@{a.model}: the reference streams (too large to stay decoded): reference@ makes it")
    built: dict = {}
    m = p["models"][a.model]
    try:  # an ONNX file is checked and instrumented, no torch; a torch model is exported
        line = (export_file(a.model, m, Path(a.out)) if modelfiles.is_onnx_file(m)
                else export_model(p, a.model, Path(a.out), built))
    except (ExportError, OnnxSourceError) as e:
        print(f"export@{a.model}: {e}", file=sys.stderr)
        return 1
    print(f"export@{a.model}: {line}")
    if fold and built.get("net") is not None:
        # lazy: the reference loads torch's runners; an ONNX-file model's export has no torch on its path
        from parity.pipeline.fold import in_export

        in_export(p, a.model, built["net"], Path(a.inputs), Path(a.out), Path(a.reference_out),
                  Path(a.baseline_out) if a.baseline_out else None, sized)
    memory.record(a.timing, "export", a.model, t0, sized)
    return 0


if __name__ == "__main__":
    from parity.core.io import exit_now

    exit_now(main())  # outputs are in place; skip torch's interpreter teardown
