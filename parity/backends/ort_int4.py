"""ONNX Runtime CPU on INT4 weight-only graphs (onnxruntime.quantization.matmul_nbits_quantizer), the
way LLMs ship on ORT CPU: every MatMul whose weight (input B) is a constant 2-D initializer becomes a
com.microsoft MatMulNBits node holding 4-bit weights, quantized block by block along K (each block of
`block_size` weights of one output column shares one float32 scale; `is_symmetric: false` adds a
4-bit zero point per block). Round to nearest (the quantizer's DEFAULT algorithm), no calibration.
Activations, graph inputs and outputs stay float32; MatMuls of two activations (attention's QK^T
and PV) and every other op are untouched.

Precision mode (conf/dtypes `mode:`): int4_weight.

Options (conf/providers/ort_int4.yaml, checked at compose against OrtInt4Runner.options_schema):
  block_size      16 | 32 | 64 | 128 | 256 (default 32: the ORT model builder's int4 default)
  accuracy_level  0..4: the minimum compute precision MatMulNBits may use for the activations
                  (0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8: activations quantized per block to int8
                  at run time; default 4, what the ORT model builder ships for CPU)
  is_symmetric    true: signed 4-bit weights, no zero points (default); false: unsigned + zero point
  gemm_to_matmul  true (default): a Gemm with a constant weight (nn.Linear on 2-D inputs, as the
                  exporters write it) is rewritten MatMul (+ Add of its bias) first, keeping the
                  Gemm's node name, so the quantizer (MatMul only) takes it too; false: Gemms stay float32
  plus graph_optimization_level of ort_cpu.

A cell whose graph has no weight MatMul to quantize is EXPORT_FAIL (it would be the fp32 model).
The quantized weight MatMuls of the plain graph (model.onnx) are counted in the capture's status.json
(`settings.quantized_matmuls`, by reading the graph; the quantizer's own count is checked against it
when it runs). The per-layer graph (layers.onnx) is quantized with the same settings, so every layer
compares against the fp32 reference by the same name.

Streaming: the graphs are quantized weight by weight (parity.models.onnx_int4: the quantizer's own
per-tensor function and the graph it writes, byte for byte, without holding the model in one protobuf,
so a 1.1B model quantizes in about three times its largest weight of memory), into a temp weights file
the cell's graphs share. `quantize` (the MatMulNBitsQuantizer on an in-memory model) is what it is
checked against.

Own error: not measured (own_unsupported). Runner.mixed (the plan): model.onnx quantized with the kept
layers' weight MatMuls excluded (the quantizer's nodes_to_exclude; each weight quantized once per
runner, the temp file keeps it); candidates are the leaf modules holding at least one weight MatMul
(plan_units). Never imports torch.
"""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

from parity.backends import fault
from parity.backends.ort_cpu import OrtRunner
from parity.models import onnx_int4, onnx_weights
from parity.config import schema

INT4_MODES = ("int4_weight",)
DEFAULTS = onnx_int4.DEFAULTS
QUANTIZER_LOGGER = "onnxruntime.quantization.matmul_nbits_quantizer"


def options(provider_cfg: dict) -> dict:
    """The cell's int4 options: the conf's `options:` over DEFAULTS (parity.models.onnx_int4.options)."""
    return onnx_int4.options(provider_cfg)


def weight_matmuls(m, gemm: bool, exclude=()) -> list[str]:
    """The weight MatMuls the quantizers take (parity.models.onnx_int4.weight_matmuls)."""
    return onnx_int4.weight_matmuls(m, gemm, exclude)


def gemm_to_matmul(m, exclude=()) -> int:
    """The Gemm rewrite (parity.models.onnx_int4.gemm_to_matmul), weights inline."""
    return onnx_int4.gemm_to_matmul(m, exclude)


def quantize(m, opts: dict, exclude=()):
    """`m` (a ModelProto, changed in place) with its weight MatMuls (weight_matmuls) as MatMulNBits,
    the nodes in `exclude` left float32. Returns (quantized model, names of the quantized nodes)."""
    del m.graph.value_info[:]  # the dynamo exporter's stale entries; the quantizer needs none
    if opts["gemm_to_matmul"]:
        gemm_to_matmul(m, set(exclude))
    want = weight_matmuls(m, False, set(exclude))
    Q = _quantizer()
    q = Q(m, bits=4, block_size=int(opts["block_size"]), is_symmetric=bool(opts["is_symmetric"]),
          accuracy_level=int(opts["accuracy_level"]), nodes_to_exclude=sorted(exclude))
    log = logging.getLogger(QUANTIZER_LOGGER)
    level = log.level
    log.setLevel(logging.WARNING)  # an INFO line per node otherwise
    try:
        q.process()
    finally:
        log.setLevel(level)
    out = q.model.model
    got = [n.name for n in out.graph.node if n.op_type == "MatMulNBits"]
    if len(got) != len(want):
        raise ValueError(f"the int4 quantizer replaced {len(got)} MatMuls, {len(want)} expected "
                         f"(weight MatMuls: {want[:8]})")
    return out, want


def _quantizer():
    """MatMulNBitsQuantizer. Its module calls logging.basicConfig(level=INFO) on import: the root
    logger's handlers and level are put back as they were."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level

    for h in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(h)
    root.setLevel(level)
    return MatMulNBitsQuantizer


class OrtInt4Runner(OrtRunner):
    ep = "CPUExecutionProvider"
    precision_modes = INT4_MODES
    options_schema = {**OrtRunner.options_schema, "block_size": (16, 32, 64, 128, 256),
                      "accuracy_level": (0, 1, 2, 3, 4), "is_symmetric": "bool", "gemm_to_matmul": "bool"}
    own_unsupported = ("int4 weight-only: own error not measured (the quantized graph is not fed from "
                       "the reference; the per-layer drift against fp32 names the quantized layers)")

    @classmethod
    def settings(cls, job) -> dict:
        """The options the cell ran with and the weight MatMuls of model.onnx it quantizes (read from
        the graph, no weights loaded)."""
        if schema.mode(job.dtype_cfg) not in INT4_MODES:
            return {}

        o = options(job.provider_cfg)
        path = Path(job.model_dir) / "model.onnx"
        if not path.exists():
            return {**o}
        m = onnx.load(str(path), load_external_data=False)
        names = weight_matmuls(m, bool(o["gemm_to_matmul"]))
        gemms = {n.name for n in m.graph.node if n.op_type == "Gemm"}
        left = [] if o["gemm_to_matmul"] else [n for n in weight_matmuls(m, True) if n in gemms]
        n_mm = sum(1 for n in m.graph.node if n.op_type in ("MatMul", "Gemm"))
        why = (f"weight MatMuls of model.onnx's {n_mm} MatMul/Gemm nodes, as 4-bit blocks of "
               f"{o['block_size']} ({'symmetric' if o['is_symmetric'] else 'with zero points'}, "
               f"accuracy_level {o['accuracy_level']}) <providers.{job.provider}.options>")
        return {**o, "quantized_matmuls": len(names), "quantized_matmuls_from": why,
                "from_gemm": len(gemms & set(names)), "gemms_left_fp32": len(left), "quantized_nodes": names}

    def _opts(self) -> dict:
        return options(self.job.provider_cfg)

    def _check_mode(self) -> None:
        mode = schema.mode(self.job.dtype_cfg)
        if mode not in INT4_MODES:
            raise ValueError(f"{type(self).__name__} runs precision modes {INT4_MODES}, not '{mode}' "
                             f"(dtypes.{self.job.dtype}.mode)")

    def activate(self) -> None:
        self._check_mode()
        super().activate()

    def _convert(self, path):
        """(the graph quantized and serialised weightless, the folder of its external data): the
        weights are quantized one at a time by parity.models.onnx_int4 (onnxruntime's own per-tensor
        quantization, the graph its MatMulNBitsQuantizer would write) into this runner's temp weights
        file, shared by the cell's graphs, so no model meets protobuf's 2 GiB limit. A graph given with
        its weights inline (reduce) stays inline: (serialised graph, None)."""
        base = Path(path).parent if isinstance(path, (str, Path)) else Path(self.job.model_dir)
        src = onnx_weights.load_graph(path) if isinstance(path, (str, Path)) else path
        if self._fault():
            src = fault.inject(src, self._fault(), base)
        want = [(o.name, o.type.tensor_type.elem_type) for o in src.graph.output]
        q, names = self._quantized(src, base, ())
        if not names:
            raise ValueError(f"no MatMul with a constant 2-D weight to quantize in {Path(str(path)).name} "
                             f"(int4 weight-only would run the fp32 model; Gemms count only with "
                             f"providers.{self.job.provider}.options.gemm_to_matmul: true)")
        got = [(o.name, o.type.tensor_type.elem_type) for o in q.graph.output]
        if got != want:
            raise ValueError(f"quantizing {Path(str(path)).name} changed its outputs")
        external = onnx_weights.has_external(q)
        return q.SerializeToString(), (self._converted().dir if external else None)

    def quantized(self, path):
        """(the graph at `path` as this cell runs it: fault applied, quantized; the folder of its
        external data, None when inline): what the quantised oracle compares the packed weights of
        (parity.pipeline.quant_reference.packed_check). Call deactivate() after reading the weights."""
        data, folder = self._convert(path)
        return onnx.ModelProto.FromString(data), folder

    def _quantized(self, m, base: Path, exclude):
        """onnx_int4.quantize of `m` (external data under `base`; into this runner's Converted store
        when it has any, else inline)."""
        store = self._converted() if onnx_weights.has_external(m) else None
        return onnx_int4.quantize(m, base, store, self._opts(), exclude)

    # -- the plan (Runner.mixed through OrtRunner.mixed): items are node names of model.onnx --
    @classmethod
    def plan_units(cls, units: dict, model_dir: Path, provider_cfg: dict) -> dict:
        """Only the weight MatMuls of each candidate leaf: the other nodes are float32 anyway. A leaf
        with none is no candidate."""
        m = onnx.load(str(Path(model_dir) / "model.onnx"), load_external_data=False)
        w = set(weight_matmuls(m, bool(options(provider_cfg)["gemm_to_matmul"])))
        return {k: [n for n in v if n in w] for k, v in units.items() if any(n in w for n in v)}

    def _mixed_model(self, m, fp32_nodes):
        """(`m` with the weight MatMuls outside `fp32_nodes` in 4 bits, the folder of its external
        data): each weight is quantized once per runner (the Converted store keeps it), so the plan's
        mixed models cost a graph rewrite each; the kept nodes' float32 weights are copied there."""
        self._check_mode()
        q, _ = self._quantized(m, Path(self.job.model_dir), set(fp32_nodes))
        return q, self._converted().dir
