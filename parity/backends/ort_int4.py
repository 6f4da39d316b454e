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

Own error: not measured (own_unsupported). Runner.mixed (the plan): model.onnx quantized with the kept
layers' weight MatMuls in the quantizer's nodes_to_exclude (the same graph, assembled from one full
quantization per runner: assemble); candidates are the leaf modules holding at least one weight MatMul
(plan_units). Never imports torch.
"""

from __future__ import annotations

import logging
from pathlib import Path

from parity.backends.ort_cpu import OrtRunner

INT4_MODES = ("int4_weight",)
DEFAULTS = {"block_size": 32, "accuracy_level": 4, "is_symmetric": True, "gemm_to_matmul": True}
BLOCK_SIZES = (16, 32, 64, 128, 256)
ACCURACY_LEVELS = (0, 1, 2, 3, 4)
QUANTIZER_LOGGER = "onnxruntime.quantization.matmul_nbits_quantizer"


def options(provider_cfg: dict) -> dict:
    """The cell's int4 options: the conf's `options:` over DEFAULTS."""
    o = provider_cfg.get("options") or {}
    return {k: o.get(k, v) for k, v in DEFAULTS.items()}


def _attr(node, name: str, default):
    import onnx

    a = next((a for a in node.attribute if a.name == name), None)
    return default if a is None else onnx.helper.get_attribute_value(a)


def _gemm_ok(node, inits: dict) -> bool:
    """A Gemm the rewrite takes: a constant 2-D B, A not transposed, alpha = beta = 1."""
    b = inits.get(node.input[1]) if len(node.input) > 1 else None
    return (node.op_type == "Gemm" and b is not None and len(b.dims) == 2 and _attr(node, "transA", 0) == 0
            and _attr(node, "alpha", 1.0) == 1.0 and _attr(node, "beta", 1.0) == 1.0)


def weight_matmuls(m, gemm: bool, exclude=()) -> list[str]:
    """Node names the quantizer turns into MatMulNBits, in graph order: MatMuls with a 2-D constant
    initializer as B (and, with `gemm`, Gemms the rewrite takes), not in `exclude`."""
    inits = {t.name: t for t in m.graph.initializer}
    out = []
    for n in m.graph.node:
        if n.name in exclude:
            continue
        b = inits.get(n.input[1]) if len(n.input) > 1 else None
        if n.op_type == "MatMul" and b is not None and len(b.dims) == 2 or gemm and _gemm_ok(n, inits):
            out.append(n.name)
    return out


def gemm_to_matmul(m, exclude=()) -> int:
    """Rewrite, in place, each Gemm `weight_matmuls` takes (not in `exclude`) as MatMul(A, B') with the
    Gemm's name (B' = B transposed when transB) plus Add(C) named `<gemm>_bias`. Returns how many."""
    import onnx
    from onnx import numpy_helper

    inits = {t.name: t for t in m.graph.initializer}
    nodes, n_done = [], 0
    for n in m.graph.node:
        if n.name in exclude or not _gemm_ok(n, inits):
            nodes.append(n)
            continue
        b = n.input[1]
        if _attr(n, "transB", 0):
            w = numpy_helper.to_array(inits[b]).T.copy()
            b = f"{n.input[1]}_t_{n.name}"
            m.graph.initializer.append(numpy_helper.from_array(w, b))
        has_c = len(n.input) > 2 and n.input[2]
        mm_out = f"{n.output[0]}_matmul" if has_c else n.output[0]
        nodes.append(onnx.helper.make_node("MatMul", [n.input[0], b], [mm_out], name=n.name))
        if has_c:
            nodes.append(onnx.helper.make_node("Add", [mm_out, n.input[2]], [n.output[0]], name=f"{n.name}_bias"))
        n_done += 1
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return n_done


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


def assemble(m, q_full, opts: dict, exclude=()):
    """`m` (changed in place) as quantize(m, opts, exclude) makes it, from `q_full` = quantize(a copy
    of m, opts): each weight is quantized on its own, so its MatMulNBits node and tensors are taken
    from q_full instead of quantizing it again (a plan runs dozens of mixed models; quantizing a 1B
    model's weights takes minutes). Nodes in `exclude` keep their float32 weights."""
    import onnx

    del m.graph.value_info[:]
    if opts["gemm_to_matmul"]:
        gemm_to_matmul(m, set(exclude))
    want = set(weight_matmuls(m, False, set(exclude)))
    by_out = {n.output[0]: n for n in q_full.graph.node if n.op_type == "MatMulNBits"}
    q_inits = {t.name: t for t in q_full.graph.initializer}
    nodes, add = [], {}
    for n in m.graph.node:
        qn = by_out.get(n.output[0]) if n.name in want else None
        if n.name in want and qn is None:
            raise ValueError(f"no quantized node for {n.name} in the fully quantized model")
        nodes.append(qn if qn is not None else n)
        add.update({i: q_inits[i] for i in (qn.input[1:] if qn is not None else []) if i in q_inits})
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    used = _used(m.graph) | {o.name for o in m.graph.output}
    keep = [t for t in m.graph.initializer if t.name in used]
    del m.graph.initializer[:]
    m.graph.initializer.extend(keep + [add[k] for k in sorted(add)])
    if want and not any(o.domain == "com.microsoft" for o in m.opset_import):
        m.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return m


def _used(graph) -> set[str]:
    """Every name a node of `graph` or of its subgraphs reads."""
    import onnx

    names = set()
    for n in graph.node:
        names.update(n.input)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                names |= _used(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    names |= _used(g)
    return names


def _quantizer():
    """MatMulNBitsQuantizer. Its module calls logging.basicConfig(level=INFO) on import: the root
    logger's handlers and level are put back as they were."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

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
        if job.dtype_cfg.get("mode", "cast") not in INT4_MODES:
            return {}
        import onnx

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
        mode = self.job.dtype_cfg.get("mode", "cast")
        if mode not in INT4_MODES:
            raise ValueError(f"{type(self).__name__} runs precision modes {INT4_MODES}, not '{mode}' "
                             f"(dtypes.{self.job.dtype}.mode)")

    def activate(self) -> None:
        self._check_mode()
        super().activate()

    def _convert(self, path):
        """(the graph quantized, serialised with its weights inline, None): the MatMulNBits quantizer
        needs a whole model in memory, so the weights are read in (parity.models.onnx_weights.with_data;
        the quantized graph is about a quarter of the float32 one)."""
        from parity.models import onnx_weights

        base = Path(path).parent if isinstance(path, (str, Path)) else Path(self.job.model_dir)
        src = onnx_weights.load_graph(path) if isinstance(path, (str, Path)) else path
        if onnx_weights.has_external(src):
            src = onnx_weights.with_data(src, base)
        if self._fault():
            from parity.backends import fault

            src = fault.inject(src, self._fault(), base)
        want = [(o.name, o.type.tensor_type.elem_type) for o in src.graph.output]
        q, names = quantize(src, self._opts())
        if not names:
            raise ValueError(f"no MatMul with a constant 2-D weight to quantize in {Path(str(path)).name} "
                             f"(int4 weight-only would run the fp32 model; Gemms count only with "
                             f"providers.{self.job.provider}.options.gemm_to_matmul: true)")
        got = [(o.name, o.type.tensor_type.elem_type) for o in q.graph.output]
        if got != want:
            raise ValueError(f"quantizing {Path(str(path)).name} changed its outputs")
        return q.SerializeToString(), None

    # -- the plan (Runner.mixed through OrtRunner.mixed): items are node names of model.onnx --
    @classmethod
    def plan_units(cls, units: dict, model_dir: Path, provider_cfg: dict) -> dict:
        """Only the weight MatMuls of each candidate leaf: the other nodes are float32 anyway. A leaf
        with none is no candidate."""
        import onnx

        m = onnx.load(str(Path(model_dir) / "model.onnx"), load_external_data=False)
        w = set(weight_matmuls(m, bool(options(provider_cfg)["gemm_to_matmul"])))
        return {k: [n for n in v if n in w] for k, v in units.items() if any(n in w for n in v)}

    def _mixed_model(self, m, fp32_nodes):
        """`m` with the weight MatMuls outside `fp32_nodes` in 4 bits: every weight is quantized once
        per runner (the first call), each mixed model assembled from those (assemble)."""
        import onnx

        from parity.models import onnx_weights

        self._check_mode()
        m = onnx_weights.with_data(m, self.job.model_dir)  # the kept nodes' float32 weights, inline
        if getattr(self, "_q_full", None) is None:
            full = onnx.ModelProto()
            full.CopyFrom(m)
            self._q_full, _ = quantize(full, self._opts())
        return assemble(m, self._q_full, self._opts(), set(fp32_nodes)), None

    def deactivate(self) -> None:
        super().deactivate()
        self._q_full = None
