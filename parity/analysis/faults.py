"""Fault injection into an exported model directory (onnx only, no torch, no runtime).

Reads `layers.onnx` (every leaf call a graph output, as the export stage writes it), applies one named
fault, and writes a complete model directory: the modified `layers.onnx`, `model.onnx` derived from it
exactly as the export stage derives it (same model outputs, dead nodes dropped, so both carry the same
fault), `layers.json` copied, `ops.json` recomputed, and `fault.json` (what was changed). Used to check
that a verdict locates a known fault (issue 9's acceptance table):

  python -m parity.analysis.faults --model-dir artifacts/models/resnet18 --fault weight_scale \\
      --target layer1.0.conv1 --value 1.05 --out /tmp/resnet18-fault

Targets: a leaf call name as captured (`layer1.0.conv1`, `layer1.0.relu#1`, `fc`), a node name
(`node_Softmax_53`), or an op type present once in the graph (`Softmax`). A leaf's nodes are found
from the exporter's node metadata (`pkg.torch.onnx.name_scopes` holds `model.<leaf>`), walking back
from the leaf's graph output; Identity (clone) outputs are followed to the value they copy, so a
fault "after a leaf" changes every consumer of that value and every graph output naming it.
Without that metadata (the legacy exporter) a leaf is only the node producing its output, so
faults that replace a multi-node leaf (gelu_tanh on the Erf form) report that they cannot.
Initializers are shared between nodes by the exporter (resnet18's BatchNorms all read
`model.bn1.weight`); a fault never edits a shared initializer in place, it adds a modified copy.

Faults (value: default):
  weight_scale     the leaf's Conv/Gemm/MatMul weight x value (1.05)
  bn_epsilon       the leaf's BatchNormalization (or Layer/Instance/GroupNorm) epsilon := value
                   (default: 100x the exported epsilon)
  channel_scale    a Mul after the leaf: one channel x value (1.1); --channel (0), --axis (1 for rank 4,
                   else the last axis)
  gelu_tanh        the leaf's GELU becomes the tanh approximation (Gelu: approximate="tanh"; the opset-18
                   Erf decomposition is replaced by 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))))
  bias_shift       the leaf's Conv/Gemm bias (or the Add after its MatMul) + value (1e-3); a Conv or
                   Gemm without bias gets one
  hardswish_relu   the leaf's HardSwish becomes Relu
  softmax_axis     a Softmax node's axis := value (default: -2 if it was the last axis, else -1)
  transpose        a Transpose after the leaf, --perm (0,1,3,2); the leaf's output is transposed
  output_offset    an Add after the leaf: + value (5e-5)
  fp16_round       a Cast to float16 and back after the leaf: its output rounded to fp16 in an fp32 graph;
                   --format bf16: rounded to bf16 (narrower than an fp16 cell's own format)
  channel_swap     a Gather after the leaf: two output channels swapped, --channels (0,1), --axis (1 for
                   rank >= 3, else the last axis)
  hardsigmoid_sigmoid  the leaf's HardSigmoid becomes Sigmoid
  relu_leaky       the leaf's Relu becomes LeakyRelu(alpha = value) (0.01)
  fp16_weights     the leaf's Conv/Gemm/MatMul weight rounded to fp16, stored in its own format
  norm_epsilon     the leaf's normalisation epsilon := value (100x the exported one): a norm op's
                   attribute, or the constant a decomposed RMSNorm/LayerNorm adds before its Sqrt
  mask_leak        a causal-mask leak: row --token (10) of the constant additive mask read by the Add
                   before Softmax `target` (a node name) opened, in a copy (that attention only)
  silu_sigmoid     the leaf's SiLU (x * Sigmoid(x)) becomes Sigmoid

--plain-only writes the fault into model.onnx alone (layers.onnx as exported, both reading one
weights.bin): a fault only the shipped graph has, which the diff locates by comparing the two graphs
(parity.analysis.plaindiff).
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from parity.core.io import atomic_path, dumps, read_json, write_json
from parity.models import onnx_weights
from parity.models.onnx_graph import op_inventory, prune_outputs

SCOPES = "pkg.torch.onnx.name_scopes"
SUFFIX = "__fault"
WEIGHT_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
NORM_OPS = ("BatchNormalization", "LayerNormalization", "InstanceNormalization", "GroupNormalization",
            "RMSNormalization")


class FaultError(ValueError):
    """A fault that cannot be applied as asked (bad target, no such op in the leaf)."""


class Graph:
    """Index over one ModelProto's main graph: producers, initializers, leaf outputs."""

    def __init__(self, model: onnx.ModelProto):
        self.model, self.g = model, model.graph
        self.producer = {o: n for n in self.g.node for o in n.output if o}
        self.inits = {t.name: t for t in self.g.initializer}
        self.outputs = [o.name for o in self.g.output]
        self.names = set(self.producer) | set(self.inits) | {i.name for i in self.g.input}
        self._n = 0

    def fresh(self, base: str) -> str:
        while True:
            self._n += 1
            name = f"{base}{SUFFIX}{self._n}"
            if name not in self.names:
                self.names.add(name)
                return name

    def real_value(self, value: str) -> str:
        """The value a leaf output names, through Identity (clone) copies."""
        while value in self.producer and self.producer[value].op_type == "Identity":
            value = self.producer[value].input[0]
        return value

    def leaf_nodes(self, leaf: str) -> list[onnx.NodeProto]:
        """The nodes of leaf call `leaf`, in graph order: walking back from its output through nodes
        whose name scopes hold the leaf's module (only its producer without metadata)."""
        scope = "model." + leaf.split("#")[0].split(":")[0]
        start = self.producer.get(self.real_value(leaf))
        if start is None:
            raise FaultError(f"leaf {leaf!r}: its output is not computed by any node")
        found, todo = {id(start): start}, [start]
        while todo:
            for i in todo.pop().input:
                p = self.producer.get(i)
                if p is not None and id(p) not in found and scope in _scopes(p):
                    found[id(p)] = p
                    todo.append(p)
        return [n for n in self.g.node if id(n) in found]

    def leaf_op(self, leaf: str, ops: tuple) -> onnx.NodeProto:
        nodes = [n for n in self.leaf_nodes(leaf) if n.op_type in ops]
        if not nodes:
            have = sorted({n.op_type for n in self.leaf_nodes(leaf)})
            raise FaultError(f"leaf {leaf!r} has no {'/'.join(ops)} node (its nodes: {', '.join(have)})")
        return nodes[0]

    def copy_init(self, name: str, values: np.ndarray) -> str:
        """A new initializer holding `values` (the original, maybe shared, is left alone)."""
        new = self.fresh(name)
        self.g.initializer.append(numpy_helper.from_array(values, new))
        self.inits[new] = self.g.initializer[-1]
        return new

    def const(self, base: str, values) -> str:
        return self.copy_init(base, np.asarray(values, dtype=self.dtype_of(base)))

    def dtype_of(self, value: str):
        for vi in list(self.g.value_info) + list(self.g.output) + list(self.g.input):
            if vi.name == value and vi.type.tensor_type.elem_type:
                return helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        return np.float32

    def shape_of(self, value: str) -> list[int] | None:
        for vi in list(self.g.value_info) + list(self.g.output) + list(self.g.input):
            if vi.name == value and vi.type.tensor_type.HasField("shape"):
                return [d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim]
        return None

    def insert_after(self, value: str, op: str, extra: list[str], fault: str, **attrs) -> onnx.NodeProto:
        """Make `value` the output of a new node op(value before, *extra): every consumer of `value`
        and every graph output of that name now sees the fault. The node takes its producer's metadata
        (so it belongs to the same leaf) and is placed right after it."""
        prod = self.producer.get(value)
        if prod is None:
            raise FaultError(f"{value!r} is a graph input or initializer: nothing to insert after")
        before = self.fresh(value)
        prod.output[list(prod.output).index(value)] = before
        node = helper.make_node(op, [before, *extra], [value], name=self.fresh(f"{fault}_{op}"), **attrs)
        node.metadata_props.extend(prod.metadata_props)
        pos = list(self.g.node).index(prod)
        self.g.node.insert(pos + 1, node)
        self.producer[before], self.producer[value] = prod, self.g.node[pos + 1]
        return self.g.node[pos + 1]

    def replace_nodes(self, old: list[onnx.NodeProto], new: list[onnx.NodeProto]) -> None:
        meta = list(old[-1].metadata_props)
        pos = min(list(self.g.node).index(n) for n in old)
        for n in old:
            self.g.node.remove(n)
        for k, n in enumerate(new):
            n.metadata_props.extend(meta)
            self.g.node.insert(pos + k, n)
        self.producer = {o: n for n in self.g.node for o in n.output if o}


def _scopes(node) -> str:
    return next((p.value for p in node.metadata_props if p.key == SCOPES), "")


def _attr(node, name: str, default=None):
    a = next((a for a in node.attribute if a.name == name), None)
    return default if a is None else helper.get_attribute_value(a)


def _set_attr(node, name: str, value) -> None:
    for a in list(node.attribute):
        if a.name == name:
            node.attribute.remove(a)
    node.attribute.append(helper.make_attribute(name, value))


def _leaf_io(g: Graph, leaf: str) -> tuple[list[onnx.NodeProto], str, str]:
    """The leaf's nodes, its one non-constant input value and its output value."""
    nodes = g.leaf_nodes(leaf)
    made = {o for n in nodes for o in n.output}
    ins = [i for n in nodes for i in n.input if i and i not in made and i not in g.inits]
    ins = list(dict.fromkeys(i for i in ins if not (i in g.producer and g.producer[i].op_type == "Constant")))
    if len(ins) != 1:
        raise FaultError(f"leaf {leaf!r}: expected one input value, found {ins}")
    return nodes, ins[0], g.real_value(leaf)


# ---- the faults: each takes (graph, target, options) and returns what it changed ----------------

def weight_scale(g: Graph, target: str, value=None, **_) -> dict:
    value = 1.05 if value is None else float(value)
    node, w, arr = _weight(g, target)
    node.input[1] = g.copy_init(w, (arr * value).astype(arr.dtype))
    return {"node": node.name, "op": node.op_type, "initializer": w, "new_initializer": node.input[1],
            "value": value, "change": f"{node.op_type} {node.name}: weight {w} x{value}"}


def bn_epsilon(g: Graph, target: str, value=None, **_) -> dict:
    node = g.leaf_op(target, NORM_OPS)
    old = float(_attr(node, "epsilon", 1e-5))
    value = old * 100 if value is None else float(value)
    _set_attr(node, "epsilon", value)
    return {"node": node.name, "op": node.op_type, "old": old, "value": value,
            "change": f"{node.op_type} {node.name}: epsilon {old:.3g} -> {value:.3g}"}


def channel_scale(g: Graph, target: str, value=None, channel=None, axis=None, **_) -> dict:
    value, channel = 1.1 if value is None else float(value), 0 if channel is None else int(channel)
    out = g.real_value(target)
    shape = g.shape_of(out) or g.shape_of(target)
    if not shape or len(shape) < 2:
        raise FaultError(f"leaf {target!r}: output shape unknown or rank < 2 ({shape})")
    axis = (1 if len(shape) == 4 else len(shape) - 1) if axis is None else int(axis) % len(shape)
    n = shape[axis]
    if not 0 <= channel < n:
        raise FaultError(f"--channel {channel}: leaf {target!r} has {n} channels on axis {axis}")
    factor = np.ones([n] + [1] * (len(shape) - 1 - axis), dtype=g.dtype_of(out))
    factor[channel] = value
    node = g.insert_after(out, "Mul", [g.copy_init(f"{out}.channel_scale", factor)], "channel_scale")
    return {"node": node.name, "value_name": out, "axis": axis, "channel": channel, "value": value,
            "change": f"Mul after {out}: channel {channel} of axis {axis} x{value}"}


def gelu_tanh(g: Graph, target: str, **_) -> dict:
    gelu = [n for n in g.leaf_nodes(target) if n.op_type == "Gelu"]
    if gelu:
        _set_attr(gelu[0], "approximate", "tanh")
        return {"node": gelu[0].name, "change": f"Gelu {gelu[0].name}: approximate='tanh'"}
    nodes, x, y = _leaf_io(g, target)
    if "Erf" not in {n.op_type for n in nodes}:
        raise FaultError(f"leaf {target!r} has no Gelu or Erf node (its nodes: "
                         f"{', '.join(n.op_type for n in nodes)})")
    c = {k: g.const(f"{target}.gelu_tanh.{k}", v) for k, v in
         {"k": 0.044715, "s": math.sqrt(2 / math.pi), "one": 1.0, "half": 0.5}.items()}
    t = [g.fresh(f"{target}.gelu_tanh") for _ in range(8)]
    mk = lambda op, i, o: helper.make_node(op, i, [o], name=g.fresh(f"gelu_tanh_{op}"))  # noqa: E731
    new = [mk("Mul", [x, x], t[0]), mk("Mul", [t[0], x], t[1]), mk("Mul", [t[1], c["k"]], t[2]),
           mk("Add", [x, t[2]], t[3]), mk("Mul", [t[3], c["s"]], t[4]), mk("Tanh", [t[4]], t[5]),
           mk("Add", [t[5], c["one"]], t[6]), mk("Mul", [x, t[6]], t[7]), mk("Mul", [t[7], c["half"]], y)]
    g.replace_nodes(nodes, new)
    return {"removed": [n.name for n in nodes], "added": [n.name for n in new],
            "change": f"GELU of {target} ({len(nodes)} nodes, Erf form) -> tanh approximation ({len(new)} nodes)"}


def bias_shift(g: Graph, target: str, value=None, **_) -> dict:
    value = 1e-3 if value is None else float(value)
    node = g.leaf_op(target, ("Conv", "ConvTranspose", "Gemm", "MatMul"))
    if node.op_type == "MatMul":  # Linear as MatMul + Add(bias)
        adds = [n for n in g.leaf_nodes(target) if n.op_type == "Add" and any(i in g.inits for i in n.input)]
        if not adds:
            raise FaultError(f"leaf {target!r}: MatMul {node.name} has no bias Add")
        node = adds[0]
        k = next(k for k, i in enumerate(node.input) if i in g.inits)
    else:
        k = 2
        if len(node.input) < 3 or not node.input[2]:  # no bias: give it one holding the shift
            while len(node.input) < 3:
                node.input.append("")
            n_out, dt = _n_out(g, node), g.dtype_of(node.output[0])
            node.input[2] = g.copy_init(f"{node.input[1]}.bias", np.full(n_out, value, dtype=dt))
            return {"node": node.name, "op": node.op_type, "initializer": None, "new_initializer": node.input[2],
                    "value": value, "change": f"{node.op_type} {node.name}: new bias {value:g} (had none)"}
    b = node.input[k]
    arr = numpy_helper.to_array(g.inits[b])
    node.input[k] = g.copy_init(b, (arr + value).astype(arr.dtype))
    return {"node": node.name, "op": node.op_type, "initializer": b, "new_initializer": node.input[k],
            "value": value, "change": f"{node.op_type} {node.name}: bias {b} + {value:g}"}


def _n_out(g: Graph, node) -> int:
    """Output channels of a Conv/ConvTranspose/Gemm from its weight's shape."""
    w = g.inits[node.input[1]].dims
    if node.op_type == "Conv":
        return w[0]
    if node.op_type == "ConvTranspose":
        return w[1] * int(_attr(node, "group", 1))
    return w[0] if _attr(node, "transB", 0) else w[1]


def hardswish_relu(g: Graph, target: str, **_) -> dict:
    hs = [n for n in g.leaf_nodes(target) if n.op_type == "HardSwish"]
    if hs:
        hs[0].op_type = "Relu"
        del hs[0].attribute[:]
        return {"node": hs[0].name, "change": f"HardSwish {hs[0].name} -> Relu"}
    nodes, x, y = _leaf_io(g, target)
    if "HardSigmoid" not in {n.op_type for n in nodes}:
        raise FaultError(f"leaf {target!r} has no HardSwish node (its nodes: {', '.join(n.op_type for n in nodes)})")
    new = [helper.make_node("Relu", [x], [y], name=g.fresh("hardswish_relu"))]
    g.replace_nodes(nodes, new)
    return {"removed": [n.name for n in nodes], "added": [new[0].name],
            "change": f"Hardswish of {target} ({len(nodes)} nodes) -> Relu"}


def softmax_axis(g: Graph, target: str, value=None, **_) -> dict:
    node = _node(g, target, "Softmax")
    old = int(_attr(node, "axis", -1))
    rank = len(g.shape_of(node.input[0]) or []) or None
    last = old == -1 or (rank is not None and old == rank - 1)
    value = (-2 if last else -1) if value is None else int(value)
    _set_attr(node, "axis", value)
    return {"node": node.name, "old": old, "value": value, "scopes": _scopes(node),
            "change": f"Softmax {node.name}: axis {old} -> {value}"}


def transpose(g: Graph, target: str, perm=None, **_) -> dict:
    perm = [0, 1, 3, 2] if perm is None else [int(i) for i in perm]
    out = g.real_value(target)
    shape = g.shape_of(out) or g.shape_of(target)
    if shape is not None and len(shape) != len(perm):
        raise FaultError(f"--perm {perm}: leaf {target!r} has rank {len(shape)}")
    node = g.insert_after(out, "Transpose", [], "transpose", perm=perm)
    permuted = shape is not None and [shape[i] for i in perm] != shape
    if permuted:  # declared shapes of the value and of graph outputs naming it follow the transpose
        for vi in list(g.g.value_info) + list(g.g.output):
            if vi.name in (out, target) or g.real_value(vi.name) == out:
                dims = vi.type.tensor_type.shape.dim
                vals = [dims[i].dim_value for i in perm]
                for d, v in zip(dims, vals):
                    d.dim_value = v
    return {"node": node.name, "value_name": out, "perm": perm, "shape_changed": permuted,
            "change": f"Transpose{perm} after {out}"}


def output_offset(g: Graph, target: str, value=None, **_) -> dict:
    value = 5e-5 if value is None else float(value)
    out = g.real_value(target)
    node = g.insert_after(out, "Add", [g.const(f"{out}.offset", value)], "output_offset")
    return {"node": node.name, "value_name": out, "value": value, "change": f"Add after {out}: + {value:g}"}


NARROW = {"fp16": onnx.TensorProto.FLOAT16, "bf16": onnx.TensorProto.BFLOAT16}


def fp16_round(g: Graph, target: str, fmt=None, **_) -> dict:
    """A Cast to fp16 (or `fmt` bf16: a narrower format than an fp16 cell's) and back after the leaf."""
    fmt = fmt or "fp16"
    if fmt not in NARROW:
        raise FaultError(f"--format {fmt!r}: expected one of {', '.join(NARROW)}")
    out = g.real_value(target)
    half = g.insert_after(out, "Cast", [], "fp16_round", to=NARROW[fmt])
    mid = g.fresh(f"{out}.fp16")
    half.output[0] = mid
    back = helper.make_node("Cast", [mid], [out], name=g.fresh("fp16_round_Cast"),
                            to=helper.np_dtype_to_tensor_dtype(np.dtype(g.dtype_of(out))))
    back.metadata_props.extend(half.metadata_props)
    pos = list(g.g.node).index(half)
    g.g.node.insert(pos + 1, back)
    g.producer[mid], g.producer[out] = g.g.node[pos], g.g.node[pos + 1]
    return {"node": half.name, "value_name": out, "format": fmt, "change": f"Cast to {fmt} and back after {out}"}


def channel_swap(g: Graph, target: str, channels=None, axis=None, **_) -> dict:
    out = g.real_value(target)
    shape = g.shape_of(out) or g.shape_of(target)
    if not shape or len(shape) < 2:
        raise FaultError(f"leaf {target!r}: output shape unknown or rank < 2 ({shape})")
    axis = (1 if len(shape) >= 3 else len(shape) - 1) if axis is None else int(axis) % len(shape)
    i, j = (0, 1) if channels is None else (int(c) for c in channels)
    n = shape[axis]
    if not (0 <= i < n and 0 <= j < n and i != j):
        raise FaultError(f"--channels {i},{j}: leaf {target!r} has {n} channels on axis {axis} (two different ones)")
    index = np.arange(n, dtype=np.int64)
    index[[i, j]] = [j, i]
    node = g.insert_after(out, "Gather", [g.copy_init(f"{out}.channel_swap", index)], "channel_swap", axis=axis)
    return {"node": node.name, "value_name": out, "axis": axis, "channels": [i, j],
            "change": f"Gather after {out}: channels {i} and {j} of axis {axis} swapped"}


def _swap_op(g: Graph, target: str, old: str, new: str, **attrs) -> dict:
    nodes = [n for n in g.leaf_nodes(target) if n.op_type == old]
    if not nodes:
        raise FaultError(f"leaf {target!r} has no {old} node (its nodes: "
                         f"{', '.join(n.op_type for n in g.leaf_nodes(target))})")
    nodes[0].op_type = new
    del nodes[0].attribute[:]
    for k, v in attrs.items():
        nodes[0].attribute.append(helper.make_attribute(k, v))
    return {"node": nodes[0].name, "change": f"{old} {nodes[0].name} -> {new}{attrs or ''}"}


def hardsigmoid_sigmoid(g: Graph, target: str, **_) -> dict:
    return _swap_op(g, target, "HardSigmoid", "Sigmoid")


def relu_leaky(g: Graph, target: str, value=None, **_) -> dict:
    return _swap_op(g, target, "Relu", "LeakyRelu", alpha=0.01 if value is None else float(value))


def _weight(g: Graph, target: str) -> tuple[onnx.NodeProto, str, np.ndarray]:
    node = g.leaf_op(target, WEIGHT_OPS)
    w = node.input[1]
    if w not in g.inits:
        raise FaultError(f"{node.name}: weight {w!r} is not an initializer")
    return node, w, numpy_helper.to_array(g.inits[w])


def fp16_weights(g: Graph, target: str, **_) -> dict:
    """The leaf's weight rounded to fp16 and stored back in its own format (an fp32 graph holding weights
    that went through fp16 once: a converter's or a checkpoint's narrowing)."""
    node, w, arr = _weight(g, target)
    node.input[1] = g.copy_init(w, arr.astype(np.float16).astype(arr.dtype))
    return {"node": node.name, "op": node.op_type, "initializer": w, "new_initializer": node.input[1],
            "change": f"{node.op_type} {node.name}: weight {w} rounded to fp16"}


def _decomposed_epsilon(g: Graph, target: str) -> tuple[onnx.NodeProto, int]:
    """The Add of a scalar constant that feeds a Sqrt in the leaf (RMSNorm/LayerNorm as the exporter
    decomposes them: x * 1/sqrt(mean(x^2) + eps)), and which of its inputs is the epsilon."""
    nodes = g.leaf_nodes(target)
    feeds_sqrt = {i for n in nodes if n.op_type in ("Sqrt", "Rsqrt") for i in n.input}
    for n in nodes:
        if n.op_type == "Add" and n.output[0] in feeds_sqrt:
            for k, i in enumerate(n.input):
                if i in g.inits and numpy_helper.to_array(g.inits[i]).size == 1:
                    return n, k
    have = sorted({n.op_type for n in nodes})
    raise FaultError(f"leaf {target!r} has no normalisation epsilon (no {'/'.join(NORM_OPS)} node, no Add of "
                     f"a constant before a Sqrt; its nodes: {', '.join(have)})")


def norm_epsilon(g: Graph, target: str, value=None, **_) -> dict:
    """A normalisation's epsilon := value (default 100x the exported one): the attribute of a norm op, or
    the constant added before the Sqrt of a decomposed RMSNorm/LayerNorm (a copy: the exporter shares
    one epsilon constant between every norm of the model)."""
    ops = [n for n in g.leaf_nodes(target) if n.op_type in NORM_OPS]
    if ops:
        return bn_epsilon(g, target, value)
    node, k = _decomposed_epsilon(g, target)
    arr = numpy_helper.to_array(g.inits[node.input[k]])
    old = float(arr.ravel()[0])
    value = old * 100 if value is None else float(value)
    node.input[k] = g.copy_init(node.input[k], np.full(arr.shape, value, dtype=arr.dtype))
    return {"node": node.name, "op": node.op_type, "old": old, "value": value,
            "change": f"{node.op_type} {node.name} (decomposed norm): epsilon {old:.3g} -> {value:.3g}"}


def mask_leak(g: Graph, target: str, token=None, **_) -> dict:
    """A causal-mask leak at one token: the additive mask (a constant read by the Add before Softmax
    `target`) gets row `token` (10) all zeros in a copy, so that token attends to every later one in
    that attention only."""
    token = 10 if token is None else int(token)
    soft = _node(g, target, "Softmax")
    add = g.producer.get(soft.input[0])
    k = None if add is None or add.op_type != "Add" else next(
        (k for k, i in enumerate(add.input) if i in g.inits and numpy_helper.to_array(g.inits[i]).ndim >= 2), None)
    if k is None:
        raise FaultError(f"Softmax {soft.name}: its input is not an Add of a constant mask (a mask computed at "
                         f"run time cannot be edited here)")
    mask = numpy_helper.to_array(g.inits[add.input[k]]).copy()
    if not 0 <= token < mask.shape[-2]:
        raise FaultError(f"--token {token}: the mask of {soft.name} has {mask.shape[-2]} rows")
    hidden = int((mask[..., token, :] < 0).sum())
    mask[..., token, :] = 0
    add.input[k] = g.copy_init(add.input[k], mask)
    return {"node": add.name, "softmax": soft.name, "token": token, "unmasked": hidden, "scopes": _scopes(soft),
            "change": f"mask of {soft.name}: row {token} unmasked ({hidden} later positions visible)"}


def silu_sigmoid(g: Graph, target: str, **_) -> dict:
    """The leaf's SiLU (x * Sigmoid(x), as the exporter decomposes it) becomes Sigmoid(x)."""
    nodes, x, y = _leaf_io(g, target)
    ops = sorted(n.op_type for n in nodes)
    if ops != ["Mul", "Sigmoid"]:
        raise FaultError(f"leaf {target!r} is not a SiLU (x * Sigmoid(x)); its nodes: {', '.join(ops)}")
    new = [helper.make_node("Sigmoid", [x], [y], name=g.fresh("silu_sigmoid"))]
    g.replace_nodes(nodes, new)
    return {"removed": [n.name for n in nodes], "added": [new[0].name], "change": f"SiLU of {target} -> Sigmoid"}


FAULTS = {f.__name__: f for f in (weight_scale, bn_epsilon, channel_scale, gelu_tanh, bias_shift,
                                  hardswish_relu, softmax_axis, transpose, output_offset, fp16_round,
                                  channel_swap, hardsigmoid_sigmoid, relu_leaky, fp16_weights, norm_epsilon,
                                  mask_leak, silu_sigmoid)}
NODE_FAULTS = ("softmax_axis", "mask_leak")  # their target is a node (or a unique op type), not a leaf


def _node(g: Graph, target: str, op: str) -> onnx.NodeProto:
    """A node by name, or the only node of op type `target`, or the leaf's one `op` node."""
    by_name = [n for n in g.g.node if n.name == target]
    if by_name:
        return by_name[0]
    by_type = [n for n in g.g.node if n.op_type == target]
    if len(by_type) == 1:
        return by_type[0]
    if target in g.outputs:
        return g.leaf_op(target, (op,))
    names = [n.name for n in g.g.node if n.op_type == op]
    raise FaultError(f"target {target!r}: no node of that name, op type or leaf; {op} nodes: {names}")


def _used(g) -> set[str]:
    """Every value name read by a node of `g` or of its subgraphs, and its outputs."""
    names = {o.name for o in g.output}
    for n in g.node:
        names.update(n.input)
        for sub in onnx_weights.subgraphs(n):
            names |= _used(sub)
    return names


def inject(model: onnx.ModelProto, fault: str, target: str, **options) -> tuple[onnx.ModelProto, dict]:
    """A copy of the per-layer model with `fault` applied at `target`, and what changed."""
    if fault not in FAULTS:
        raise FaultError(f"unknown fault {fault!r}: expected one of {', '.join(FAULTS)}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = Graph(out)
    if fault not in NODE_FAULTS and target not in g.outputs:
        leaves = [o for o in g.outputs if o != "output" and not o.startswith("output:")]
        raise FaultError(f"target {target!r} is not a leaf output of this graph; leaves: "
                         f"{', '.join(leaves[:20])}{', ...' if len(leaves) > 20 else ''}")
    used = _used(out.graph)
    change = FAULTS[fault](g, target, **options)
    dead = used - _used(out.graph)  # initializers the fault replaced (their copies are in use)
    keep = [t for t in out.graph.initializer if t.name not in dead]
    if len(keep) != len(out.graph.initializer):
        del out.graph.initializer[:]
        out.graph.initializer.extend(keep)
    onnx.checker.check_model(out, full_check=True)
    return out, {"fault": fault, "target": target,
                 "options": {k: v for k, v in options.items() if v is not None}, **change}


def _with_originals(faulty: onnx.ModelProto, original: onnx.ModelProto) -> onnx.ModelProto:
    """`faulty` plus the original initializers the fault replaced (unused by its nodes), so that one
    weights file serves both the faulty graph and the original one."""
    have = {t.name for t in faulty.graph.initializer}
    faulty.graph.initializer.extend(t for t in original.graph.initializer if t.name not in have)
    return faulty


def _restored(original: onnx.ModelProto, packed: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the original graph whose initializers point where `packed` put them (same names)."""
    out = onnx.ModelProto()
    out.CopyFrom(original)
    by_name = {t.name: t for t in packed.graph.initializer}
    for t in out.graph.initializer:
        t.CopyFrom(by_name[t.name])
    return out


def inject_dir(model_dir, out_dir, fault: str, target: str, plain_only: bool = False, **options) -> dict:
    """Write a faulty copy of an exported model directory (see the module docstring). plain_only: the
    fault in model.onnx only, layers.onnx as exported (a fault in the shipped graph alone)."""
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    layers = onnx_weights.load_with_data(model_dir / "layers.onnx")  # with its weights (weights.bin): small models
    plain_outputs = [o.name for o in onnx_weights.load_graph(model_dir / "model.onnx").graph.output]
    meta = read_json(model_dir / "layers.json")
    faulty, change = inject(layers, fault, target, **options)
    if plain_only:
        faulty = _with_originals(faulty, layers)
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_path(out_dir / onnx_weights.WEIGHTS, allow_empty=True) as w:
        onnx_weights.pack(faulty, model_dir, w)  # as the export writes them: one weights.bin, shared
    plain = prune_outputs(faulty, plain_outputs)
    per_layer = _restored(layers, faulty) if plain_only else faulty
    if plain_only:
        change = {**change, "plain_only": True, "change": change["change"] + " (model.onnx only)"}
    for name, m in (("layers.onnx", per_layer), ("model.onnx", plain)):
        onnx_weights.write_checked(m, out_dir / name)
    write_json(out_dir / "layers.json", meta, sort_keys=False)
    write_json(out_dir / "ops.json", op_inventory(plain))
    write_json(out_dir / "fault.json", change)
    for extra in sorted(model_dir.iterdir()):  # anything else the export wrote, unchanged
        if extra.is_file() and not (out_dir / extra.name).exists():
            shutil.copy2(extra, out_dir / extra.name)
    return change


def main(argv=None) -> int:
    ap = argparse.ArgumentParser("python -m parity.analysis.faults", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True, help="an export directory (layers.onnx, model.onnx, layers.json)")
    ap.add_argument("--fault", required=True, choices=list(FAULTS))
    ap.add_argument("--target", required=True, help="leaf call name, node name, or an op type found once")
    ap.add_argument("--value", type=float, help="the fault's number (see the list above for defaults)")
    ap.add_argument("--channel", type=int, help="channel_scale: which channel (0)")
    ap.add_argument("--axis", type=int, help="channel_scale: channel axis (1 for rank 4, else last)")
    ap.add_argument("--perm", help="transpose: comma-separated permutation (0,1,3,2)")
    ap.add_argument("--channels", help="channel_swap: the two channels, comma-separated (0,1)")
    ap.add_argument("--token", type=int, help="mask_leak: the token whose mask row is opened (10)")
    ap.add_argument("--format", choices=list(NARROW), help="fp16_round: the format rounded to (fp16)")
    ap.add_argument("--plain-only", action="store_true",
                    help="the fault in model.onnx only; layers.onnx stays as exported")
    ap.add_argument("--out", required=True, help="directory to write (may be --model-dir itself)")
    a = ap.parse_args(argv)

    perm = [int(i) for i in a.perm.split(",")] if a.perm else None
    channels = [int(i) for i in a.channels.split(",")] if a.channels else None
    try:
        change = inject_dir(a.model_dir, a.out, a.fault, a.target, plain_only=a.plain_only, value=a.value,
                            channel=a.channel, axis=a.axis, perm=perm, channels=channels, token=a.token,
                            fmt=a.format)
    except (FaultError, FileNotFoundError) as e:
        print(f"faults: {e}", file=sys.stderr)
        return 2
    print(dumps(change), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
