"""reference_onnx@model: the reference of a model given as an ONNX file (`arch.source: onnx`):
onnxruntime CPU with every graph optimisation disabled, fp32, per node output (fp32.parquet), and with
`reference.fp64: true` an fp64 golden run by the ONNX reference evaluator, node by node with fallbacks,
or the fp32 yardstick where none can be made (fp64.parquet; its metadata says which); a model output
~0 is refused; parity.pipeline.onnx_reference. The same outputs as reference@model (stages/reference.py,
the models built in torch), in the same folder: dvc.yaml dispatches on the source (params onnx_models).
"""

from __future__ import annotations

import time
from pathlib import Path

from parity.config import params as config
from parity.core import memory
from parity.pipeline import memsize, onnx_reference
from parity.pipeline.inputs import load


def main(argv=None) -> int:
    ap = config.stage_parser("stages.reference_onnx", __doc__)
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
    code = onnx_reference.reference(p, a.model, load(a.inputs), Path(a.out))
    if code == 0:
        memory.record(a.timing, "reference", a.model, t0, sized)
    return code


if __name__ == "__main__":
    from parity.core.io import exit_now

    exit_now(main())  # outputs are in place; skip onnxruntime's interpreter teardown
