"""Parity's own int8 *static* quantisation (ort_int8's int8_static: onnxruntime's quantize_static, QDQ
format), independent of onnxruntime's quantiser (issue 35 item 3: the quantised oracle).

What parity computes itself, with the provider's settings (per_channel, reduce_range, weight_type,
activation_type; MinMax calibration):
- placement: which tensors get a QuantizeLinear/DequantizeLinear pair, by the rules onnxruntime's QDQ
  quantiser documents per op type (`QUANT_OPS`: its QLinear and QDQ registries), nodes in graph order:
  MatMul / Gemm / Conv / ConvTranspose: the activation input and output, the weight (an initializer)
  as a weight, a Gemm's / Conv's constant bias as int32 (scale = input scale x weight scale); the
  normalisations (Layer-, Instance-, BatchNormalization): input, outputs, the scale as a weight (per
  tensor), the bias as int32; Reshape, Transpose, Squeeze, Unsqueeze, Flatten, Slice, AveragePool,
  TopK, MaxPool, Resize: the output shares the input's parameters when the input is already
  quantised; Split: the input, the outputs sharing it; Gather: a float table is quantised as an activation and the
  output shares it; Relu / Clip: input and output when the input is quantised (the input's range
  becomes the output's when it has one consumer); Where: the output when both data inputs are
  quantised; every other op of `QUANT_OPS` (Add, Mul, Sigmoid, Softmax, Concat, ...): all its float
  inputs and outputs (a float initializer there is quantised with the activation type). A tensor once
  quantised is quantised for every consumer and for the graph output of the same name.
- calibration (MinMax): each tensor's min and max over the calibration feeds, from the float32 graph
  run by onnxruntime with optimisation off (what onnxruntime's calibrator runs); Softmax outputs
  [0, 1]. The ops `UNSUPPORTED` (Pad: onnxruntime's rule depends on the pad mode and constant;
  EmbedLayerNormalization, a contrib op) have placement rules parity does not reproduce: a graph with
  one gets no oracle (judged by tolerance), as does a calibration other than MinMax (Entropy and Percentile
  histogram the values; their bins are onnxruntime's own choice).
- parameters (onnxruntime's compute_scale_zp): range widened to include 0; activations asymmetric
  (QInt8 [-128, 127], QUInt8 [0, 255]), scale = (max - min) / (qmax - qmin) in float64 then float32,
  zero point round(qmin - min / scale); weights symmetric for QInt8 ([-127, 127], [-64, 64] with
  reduce_range; per output channel with per_channel), asymmetric for QUInt8; q = clip(round(w /
  scale) + zp) in float32.
The simulated graph replaces each quantised tensor by (clip(round(x / s) + z) - z) x s in ONNX ops and
each quantised initializer by its integers times its scale, so it runs in float64 (exactly) and in
float32. onnxruntime runs the QDQ graph with integer kernels where its optimiser fuses a group
(QLinearMatMul, QGemm, QLinearAdd, QLinearMul, QLinearSigmoid, QLinearConcat: measured equal to the
QDQ arithmetic to float32 rounding); QLinearSoftmax is not: it quantises its output with the integer
scale floor(1 / y_scale) (254 for [0, 1] over 255 steps), so the Softmax outputs onnxruntime fuses
(`fused_softmax`, read from its optimised graph) are simulated that way (measured: exact; without it
1-2% off at the Softmax). Never imports torch.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

QUANT_OPS = frozenset({
    "Add", "ArgMax", "AveragePool", "BatchNormalization", "Clip", "Concat", "Conv", "ConvTranspose", "CumSum",
    "EmbedLayerNormalization", "Flatten", "Gather", "GatherElements", "Gemm", "GlobalAveragePool",
    "InstanceNormalization", "LayerNormalization", "LeakyRelu", "MatMul", "MaxPool", "Mul", "Pad", "Relu",
    "Reshape", "Resize", "Sigmoid", "Slice", "Softmax", "Split", "Squeeze", "TopK", "Transpose", "Unsqueeze",
    "Where"})
DIRECT = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "AveragePool", "TopK",
                    "MaxPool", "Resize"})
NORMS = frozenset({"BatchNormalization", "InstanceNormalization", "LayerNormalization"})
UNSUPPORTED = frozenset({"Pad", "EmbedLayerNormalization"})
FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16)


def qrange(signed: bool, symmetric: bool, reduce: bool) -> tuple[int, int]:
    """(qmin, qmax) of onnxruntime's get_qmin_qmax_for_qType."""
    if reduce:
        return (-64, 64) if signed else (0, 127)
    if symmetric and signed:
        return -127, 127
    return (-128, 127) if signed else (0, 255)


def scale_zp(rmin, rmax, signed: bool, symmetric: bool, reduce: bool) -> tuple[np.float32, int]:
    """(scale float32, zero point) of the range [rmin, rmax] (onnxruntime's compute_scale_zp)."""
    qmin, qmax = qrange(signed, symmetric, reduce)
    lo, hi = min(np.float32(rmin), np.float32(0)), max(np.float32(rmax), np.float32(0))
    if symmetric:
        a = max(abs(lo), abs(hi))
        lo, hi = -a, a
    scale = (np.float64(hi) - np.float64(lo)) / np.float64(qmax - qmin)
    if scale < np.finfo(np.float32).tiny:
        return np.float32(1.0), 0
    zp = np.round((qmin + qmax) / 2.0) if symmetric else np.round(qmin - np.float64(lo) / scale)
    return np.float32(scale), int(zp)


def quantize_array(a: np.ndarray, scale, zp, signed: bool) -> np.ndarray:
    """round(a / scale) + zp clipped to the type's full range, in float32 (quantize_nparray)."""
    lo, hi = (-128, 127) if signed else (0, 255)
    return np.clip(np.round(np.asarray(a, np.float32) / np.asarray(scale, np.float32)) + zp, lo, hi)


def weight_params(w: np.ndarray, signed: bool, symmetric: bool, reduce: bool, axis: int | None):
    """(scales (C,) or (), zero points, q, axis) of an initializer, per tensor or per channel along `axis`."""
    w = np.asarray(w, np.float32)
    if axis is None:
        s, z = scale_zp(w.min(initial=0), w.max(initial=0), signed, symmetric, reduce)
        return np.float32(s), np.float64(z), quantize_array(w, s, z, signed), None
    ch = [scale_zp(w.take(i, axis).min(), w.take(i, axis).max(), signed, True, reduce) for i in range(w.shape[axis])]
    shape = [1] * w.ndim
    shape[axis] = -1
    s = np.array([c[0] for c in ch], np.float32)
    z = np.array([c[1] for c in ch], np.float64)
    return s, z, quantize_array(w, s.reshape(shape), z.reshape(shape), signed), axis


class Placement:
    """The tensors parity quantises (module docstring): `marks` {tensor: ("act",) | ("weight", axis) |
    ("share", source)}, `bias` {bias: (input, weight)}, `unsupported` node names."""

    def __init__(self, m: onnx.ModelProto, floats: set, per_channel: bool):
        self.inits = {t.name: t for t in m.graph.initializer}
        self.floats, self.marks, self.bias, self.unsupported = floats, {}, {}, []
        for n in m.graph.node:
            if n.op_type in QUANT_OPS:
                self._node(n, per_channel)

    def quantizable(self, t: str) -> bool:
        i = self.inits.get(t)
        return i.data_type in FLOATS if i is not None else t in self.floats

    def quantized(self, t: str) -> bool:
        return t in self.marks or t in self.bias

    def act(self, t: str) -> None:
        if t and self.quantizable(t) and t not in self.marks:
            self.marks[t] = ("act",)

    def share(self, out: str, src: str) -> None:
        if self.quantizable(out):
            self.marks[out] = ("share", src)

    def weight(self, t: str, axis: int | None) -> None:
        if t in self.inits and self.quantizable(t) and (axis is not None or t not in self.marks):
            self.marks[t] = ("weight", axis)

    def _bias(self, n) -> None:
        """The node's constant float bias (its third input) as int32; one already a bias of another
        node is copied under the name onnxruntime gives the copy (`<name>0`, `<name>1`, ...): its
        scale is this node's input scale x weight scale."""
        if len(n.input) < 3 or n.input[2] not in self.inits or self.inits[n.input[2]].data_type not in FLOATS:
            return
        b, name, k = n.input[2], n.input[2], 0
        while name in self.bias or (name != b and name in self.inits):
            name, k = f"{b}{k}", k + 1
        self.bias[name] = (n.input[0], n.input[1], b, n.name)

    def _node(self, n, per_channel: bool) -> None:
        op, ins, out = n.op_type, list(n.input), n.output[0]
        if op in UNSUPPORTED:
            self.unsupported.append(n.name or out)
        elif op == "MatMul":
            for t in ins + [out]:
                self.weight(t, 1 if per_channel else None) if t in self.inits else self.act(t)
        elif op in ("Gemm", "Conv", "ConvTranspose"):
            trans = any(a.name == "transB" and a.i for a in n.attribute)
            self.act(ins[0])
            self.act(out)
            self.weight(ins[1], (0 if trans or op == "Conv" else 1) if per_channel else None)
            self._bias(n)
        elif op in NORMS:  # the scale per tensor: its rank-1 shape has no axis 1 to be per channel on
            self.act(ins[0])
            self.weight(ins[1], None) if ins[1] in self.inits else self.act(ins[1])
            self._bias(n)
            for o in n.output:
                self.act(o)
        elif op == "Split":
            if not self.quantized(ins[0]):
                self.act(ins[0])
            for o in n.output:
                self.share(o, ins[0])
        elif op in DIRECT:
            if self.quantized(ins[0]):
                self.share(out, ins[0])
        elif op in ("Gather", "GatherElements"):
            if ins[0] in self.inits and self.quantizable(ins[0]):
                self.act(ins[0])
                self.share(out, ins[0])
            elif self.quantized(ins[0]):
                self.share(out, ins[0])
        elif op in ("Relu", "Clip"):
            if self.quantized(ins[0]):
                self.act(ins[0])
                self.act(out)
        elif op == "Where":
            if self.quantized(ins[1]) and self.quantized(ins[2]):
                for o in n.output:
                    self.act(o)
        else:
            for t in ins + list(n.output):
                self.act(t)


def calibrate(m: onnx.ModelProto, feeds: list[dict]) -> dict:
    """{tensor: (min float32, max float32)} of every float value of `m` (node outputs and graph
    inputs) over `feeds`: the float32 graph on onnxruntime, optimisation off."""
    c = onnx.ModelProto()
    c.CopyFrom(m)
    have = {o.name for o in c.graph.output}
    for n in c.graph.node:
        for o in n.output:
            if o and o not in have:
                c.graph.output.append(helper.make_empty_tensor_value_info(o))
                have.add(o)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(c.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    out: dict = {}
    for f in feeds:
        vals = {**dict(zip(names, sess.run(names, f))), **f}
        for n, v in vals.items():
            v = np.asarray(v)
            if v.dtype == np.float32 and v.size:
                lo, hi = np.float32(v.min()), np.float32(v.max())
                old = out.get(n)
                out[n] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
    return out


def adjust_ranges(m: onnx.ModelProto, ranges: dict) -> dict:
    """onnxruntime's adjust_tensor_ranges: a Relu / Clip input with one consumer takes its output's
    range; a Softmax output is [0, 1]."""
    out = dict(ranges)
    consumers: dict = {}
    for n in m.graph.node:
        for i in n.input:
            consumers[i] = consumers.get(i, 0) + 1
    for n in m.graph.node:
        if n.op_type in ("Clip", "Relu"):
            if consumers.get(n.input[0]) == 1 and n.input[0] in out and n.output[0] in out:
                out[n.input[0]] = out[n.output[0]]
        elif n.op_type == "Softmax":
            out[n.output[0]] = (np.float32(0.0), np.float32(1.0))
    return out


def params(m: onnx.ModelProto, feeds: list[dict], opts: dict, read) -> dict:
    """Parity's quantisation of `m` for int8_static: {"act": {tensor: (scale, zp)}, "weights": {name:
    (scale, zp, q, axis)}, "bias": {name: (scale, q, initializer, node)}, "shared": {tensor: the tensor whose parameters it
    takes}, "signed": {tensor: bool}, "unsupported": [node names], "is_weight": {the weights proper}}.
    `read(initializer)`: its float array (external data resolved). Raises ValueError naming a tensor
    it cannot quantise."""
    ranges = calibrate(m, feeds)
    floats = set(ranges) | {i.name for i in m.graph.input if i.type.tensor_type.elem_type in FLOATS}
    p = Placement(m, floats, bool(opts.get("per_channel")))
    ranges = adjust_ranges(m, ranges)
    a_signed = opts.get("activation_type", "QInt8") == "QInt8"
    w_signed = opts.get("weight_type", "QInt8") == "QInt8"
    rr = bool(opts.get("reduce_range"))
    act, weights, bias, signed = {}, {}, {}, {}
    for t, mark in p.marks.items():
        if mark[0] == "share":
            continue
        if t in p.inits:
            is_w = mark[0] == "weight"
            sg = w_signed if is_w else a_signed
            axis = mark[1] if is_w else None
            weights[t] = weight_params(read(p.inits[t]), sg, (is_w and w_signed) or axis is not None, rr, axis)
            signed[t] = sg
        elif t in ranges:
            act[t] = scale_zp(*ranges[t], a_signed, False, False)
            signed[t] = a_signed
        else:
            raise ValueError(f"int8_static: no calibrated range for '{t}' (not a float value of the calibration run)")
    shared = {}
    for t, mark in p.marks.items():
        if mark[0] == "share":
            src = mark[1]
            while p.marks.get(src, ("",))[0] == "share":
                src = p.marks[src][1]
            shared[t] = src
            signed[t] = signed.get(src, a_signed)
    for b, (x, w, src, node) in p.bias.items():
        bs = np.float32(_scale_of(x, act, weights, shared)) * np.asarray(_scale_of(w, act, weights, shared), np.float32)
        q = np.clip(np.round(np.asarray(read(p.inits[src]), np.float64) / np.asarray(bs, np.float64)),
                    np.iinfo(np.int32).min, np.iinfo(np.int32).max)
        bias[b] = (bs, q, src, node)
    return {"act": act, "weights": weights, "bias": bias, "shared": shared, "signed": signed,
            "unsupported": p.unsupported, "is_weight": {t for t, k in p.marks.items() if k[0] == "weight"}}


def _scale_of(t: str, act: dict, weights: dict, shared: dict):
    src = shared.get(t, t)
    if src in act:
        return act[src][0]
    if src in weights:
        return weights[src][0]
    raise ValueError(f"int8_static: the bias of a node whose input '{t}' is not quantised")


def _qdq(nodes: list, inits: list, x: str, y: str, scale, zp, signed: bool, fused_softmax: bool = False) -> None:
    """y = (clip(round(x / scale) + zp) - zp) x scale, as ONNX ops (names under y). `fused_softmax`:
    round(x x floor(1 / scale)) instead of round(x / scale), as onnxruntime's QLinearSoftmax kernel
    quantises its output (its integer scale is floor(1 / y_scale): 254 for 1/255, outputs up to 0.4% low)."""
    lo, hi = (-128.0, 127.0) if signed else (0.0, 255.0)
    c = {k: f"quant_static/{y}/{k}" for k in ("s", "z", "lo", "hi", "f")}
    for k, v in (("s", scale), ("z", zp), ("lo", lo), ("hi", hi), ("f", np.floor(np.float32(1) / np.float32(scale)))):
        inits.append(numpy_helper.from_array(np.asarray(v, np.float32), c[k]))
    p = f"quant_static/{y}/"
    first = helper.make_node("Mul", [x, c["f"]], [p + "div"]) if fused_softmax else \
        helper.make_node("Div", [x, c["s"]], [p + "div"])
    nodes += [first, helper.make_node("Round", [p + "div"], [p + "round"]),
              helper.make_node("Add", [p + "round", c["z"]], [p + "add"]),
              helper.make_node("Clip", [p + "add", c["lo"], c["hi"]], [p + "q"]),
              helper.make_node("Sub", [p + "q", c["z"]], [p + "sub"]), helper.make_node("Mul", [p + "sub", c["s"]], [y])]


def _dequantised_inits(par: dict) -> tuple[list, list]:
    """(Mul nodes, their initializers): each quantised weight and bias as its integers (float32:
    exact) x its scale, under the initializer's name."""
    nodes, inits = [], []
    for name, (s, z, q, axis) in par["weights"].items():
        shape = [1] * q.ndim
        if axis is not None:
            shape[axis] = -1
        inits += [numpy_helper.from_array((q - np.reshape(z, shape)).astype(np.float32), f"quant_static/{name}/q"),
                  numpy_helper.from_array(np.reshape(np.asarray(s, np.float32), shape if axis is not None else []),
                                          f"quant_static/{name}/s")]
        nodes.append(helper.make_node("Mul", [f"quant_static/{name}/q", f"quant_static/{name}/s"], [name]))
    for name, (s, q, _, _) in par["bias"].items():
        inits += [numpy_helper.from_array(q.astype(np.float32), f"quant_static/{name}/q"),
                  numpy_helper.from_array(np.asarray(s, np.float32), f"quant_static/{name}/s")]
        nodes.append(helper.make_node("Mul", [f"quant_static/{name}/q", f"quant_static/{name}/s"], [name]))
    return nodes, inits


def simulated(m: onnx.ModelProto, par: dict, read) -> onnx.ModelProto:
    """A copy of `m` computing the quantised model `par` (params()): each quantised initializer
    replaced by its integers x its scale, each quantised activation by its quantise-dequantise. Weights inline."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    g = out.graph
    inputs = {i.name for i in g.input}
    nodes, inits = _dequantised_inits(par)
    copies = {node: (src, name) for name, (_, _, src, node) in par["bias"].items() if name != src}
    acts = {t: par["act"][par["shared"].get(t, t)] if par["shared"].get(t, t) in par["act"] else None
            for t in list(par["act"]) + list(par["shared"])}
    renamed = {}
    for t, sz in acts.items():
        src = par["shared"].get(t, t)
        if sz is None:  # shares an initializer's parameters (a Gather's table)
            s, z = par["weights"][src][:2]
            sz = (s, z)
        if t in inputs:
            renamed[t] = f"quant_static/{t}/dq"
            _qdq(nodes, inits, t, renamed[t], sz[0], sz[1], par["signed"][t])
        else:
            renamed[t] = None
            _qdq(nodes, inits, f"{t}/float", t, sz[0], sz[1], par["signed"][t], t in par.get("fused_softmax", ()))
    body = []
    for n in g.node:
        n2 = onnx.NodeProto()
        n2.CopyFrom(n)
        for k, o in enumerate(n2.output):
            if o in renamed and renamed[o] is None:
                n2.output[k] = f"{o}/float"
        for k, i in enumerate(n2.input):
            if renamed.get(i):
                n2.input[k] = renamed[i]
            elif n.name in copies and i == copies[n.name][0]:  # a bias onnxruntime copies for this node
                n2.input[k] = copies[n.name][1]
        body.append(n2)
    quantised_inits = set(par["weights"]) | {v[2] for v in par["bias"].values()}
    keep = [t for t in g.initializer if t.name not in quantised_inits]
    for t in keep:
        if t.data_location == TensorProto.EXTERNAL:
            t.CopyFrom(numpy_helper.from_array(read(t), t.name))
    del g.initializer[:]
    g.initializer.extend(keep + inits)
    del g.node[:]
    g.node.extend(_ordered(body + nodes))
    del g.value_info[:]
    return out


def _ordered(nodes: list) -> list:
    """`nodes` in a topological order: each after the producers of its inputs (depth first, in the
    given order otherwise)."""
    producer = {o: k for k, n in enumerate(nodes) for o in n.output}
    done, out = [False] * len(nodes), []
    for start in range(len(nodes)):
        stack = [(start, False)]
        while stack:
            k, expanded = stack.pop()
            if done[k]:
                continue
            if expanded:
                done[k] = True
                out.append(nodes[k])
                continue
            stack.append((k, True))
            stack.extend((producer[i], False) for i in reversed(nodes[k].input)
                         if i in producer and not done[producer[i]])
    return out


def fused_softmax(q: onnx.ModelProto, level: str = "all") -> set:
    """The Softmax outputs onnxruntime computes with its QLinearSoftmax kernel when it optimises the
    provider's QDQ graph `q` at `level` (disabled | basic | extended | all): a DQ -> Softmax -> Q group
    it fuses (its own graph optimiser decides; read from the optimised graph)."""
    if level == "disabled" or not any(n.op_type == "Softmax" for n in q.graph.node):
        return set()
    with tempfile.TemporaryDirectory(prefix="parity-qdq-") as d:
        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, {
            "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED"}.get(level, "ORT_ENABLE_ALL"))
        so.optimized_model_filepath = os.path.join(d, "opt.onnx")
        so.log_severity_level = 3
        ort.InferenceSession(q.SerializeToString(), so, providers=["CPUExecutionProvider"])
        opt = onnx.load(so.optimized_model_filepath, load_external_data=False)
    # the fused node's y_scale is the initializer onnxruntime's quantiser named `<output>_scale` (its
    # tensors may be renamed: the optimiser turns s8 Q/DQ pairs into u8 ones first)
    return {n.input[3].removesuffix("_scale") for n in opt.graph.node
            if n.op_type == "QLinearSoftmax" and len(n.input) > 3 and n.input[3].endswith("_scale")}


def provider_params(q: onnx.ModelProto) -> dict:
    """{tensor: (scale, zero point, integers or None)} of a QDQ graph written by onnxruntime's
    quantize_static: each DequantizeLinear named `<tensor>_DequantizeLinear` (its input an initializer
    for a weight or bias, a QuantizeLinear's output for an activation)."""
    inits = {t.name: t for t in q.graph.initializer}
    out = {}
    for n in q.graph.node:
        if n.op_type != "DequantizeLinear" or not n.name.endswith("_DequantizeLinear"):
            continue
        arr = [numpy_helper.to_array(inits[i]) if i in inits else None for i in n.input]
        z = arr[2] if len(arr) > 2 and arr[2] is not None else np.zeros((), np.int8)
        out[n.name[: -len("_DequantizeLinear")]] = (arr[1], z, arr[0])
    return out


def compare(par: dict, prov: dict) -> dict:
    """Parity's quantisation against the provider's (provider_params): {"placement": {"parity_only",
    "provider_only"}, "initializers": {name: {"scales", "zero_points", "packed": share differing}},
    "activations": {"compared": n, "differ": [tensors whose scale or zero point differ]}}."""
    mine = {**{t: par["act"][t] for t in par["act"]},
            **{t: (par["act"].get(s) or par["weights"][s][:2]) for t, s in par["shared"].items()}}
    inits = {**{t: v[:3] for t, v in par["weights"].items()}, **{t: (v[0], 0, v[1]) for t, v in par["bias"].items()}}
    names = set(mine) | set(inits)
    res = {"placement": {"parity_only": sorted(names - set(prov)), "provider_only": sorted(set(prov) - names)},
           "initializers": {}, "activations": {"compared": 0, "differ": []}}
    for t, (s, z, q) in inits.items():
        if t in prov:
            ps, pz, pq = prov[t]
            res["initializers"][t] = {"scales": _differ(ps, s), "zero_points": _differ(pz, z),
                                      "packed": _differ(pq, q) if pq is not None else 1.0}
    for t, (s, z) in mine.items():
        if t in prov:
            res["activations"]["compared"] += 1
            if _differ(prov[t][0], s) or _differ(prov[t][1], z):
                res["activations"]["differ"].append(t)
    return res


def _differ(got, want) -> float:
    """The share of elements of `got` unequal to `want` (a single value: to each; 1.0 when the sizes differ)."""
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if w.size == 1 and g.size:
        return float(np.mean(g.reshape(-1) != w.reshape(-1)[0]))
    if g.size != w.size:
        return 1.0
    return float(np.mean(g.reshape(-1) != w.reshape(-1))) if g.size else 0.0
