"""export@model: torch -> ONNX with every leaf-module call as a named output, checked, plus the
plain graph and an op inventory.

Writes, under --out: layers.onnx (per-layer graph), model.onnx (the same graph, model outputs only),
weights.bin (the weights of both graphs, stored once as ONNX external data),
layers.json (output names in execution order, module types, `regions`: per leaf call the leaf calls
whose outputs feed it and the op types between them, e.g. Softmax between qkv and out), ops.json
(op types and counts, opset).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from parity.config import params as config
from parity.core import memory
from parity.pipeline import memsize
from parity.pipeline.export import ExportError, export_model


def main(argv=None) -> int:
    ap = config.stage_parser("stages.export", __doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--timing", help="peak RSS and the memory estimate (parity.core.memory), apart from the values")
    a = ap.parse_args(argv)
    p = config.load_or_die(a.params)
    t0 = time.perf_counter()

    sized = memsize.guard("export", a.model, p, a.model)
    if sized is None:
        return 1

    try:
        line = export_model(p, a.model, Path(a.out))
    except ExportError as e:
        print(f"export@{a.model}: {e}", file=sys.stderr)
        return 1
    print(f"export@{a.model}: {line}")
    memory.record(a.timing, "export", a.model, t0, sized)
    return 0


if __name__ == "__main__":
    from parity.core.io import exit_now

    exit_now(main())  # outputs are in place; skip torch's interpreter teardown
