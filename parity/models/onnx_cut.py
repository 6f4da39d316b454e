"""Each layer's own error on ONNX backends: one "cut" graph fed from the reference. onnx only, no torch.

The per-layer graph (layers.onnx) names every leaf call's output; the dynamo exporter keeps which
torch module made each node in its metadata (`pkg.torch.onnx.name_scopes`, e.g.
['', 'model', 'model.layer1', 'model.layer1.0', 'model.layer1.0.relu', 'relu_2']: `model` is the
LayerRecorder's attribute). From that:
- a leaf call's nodes: walk back from the node making its output through nodes in the leaf module's
  scope (so `relu` and `relu#1`, one module called twice, get their own node sets);
- its input: the non-initializer, non-constant tensor entering that node set from outside (when
  several, the one with the reference input's shape, else the first). When that tensor's shape is
  not the reference input's, the exporter folded a reshape between the leaves into the leaf's own
  first Reshape (GPT-2's attention output (b, s, h, d) is `reshape`d to (b, s, h*d) outside
  transformers' Conv1D `c_proj`, whose `view(-1, nx)` then reads the 4-d tensor): if the leaf reads
  it only as the data of Reshapes to a constant shape, with as many elements, feeding the reference
  input there computes the same (a Reshape reads the elements in order, whatever their shape), and
  the call is noted in `Leaves.reshaped`; otherwise the leaf is skipped, with both shapes named;
- the ops between leaves: the nodes in no leaf's node set.

The cut graph (`cut`) replaces, for its consumers, every leaf output by a graph input `ref:<call>` and
every identified leaf input, for that leaf's nodes only, by a graph input `pre:<call>`. One run then
gives, for every leaf, its output computed from the reference input (graph output `<call>`: its own
error) and, for every leaf input, the value the between-leaf ops compute from the reference leaf
outputs (graph output `between:<call>`; `between:output` for the ops after the last leaf). All graph
I/O stays float32, as in layers.onnx. Leaves whose input cannot be identified are listed in
`Leaves.skipped` (their own output then comes from the between-leaf value instead).

`regions` names the between-leaf ops per leaf (export stage, layers.json): "Softmax between qkv and out".
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

import onnx
import numpy as np
from onnx import helper, numpy_helper

SCOPES = "pkg.torch.onnx.name_scopes"
PREFIX = "model."  # LayerRecorder keeps the wrapped model as `self.model`
REF, PRE, BETWEEN = "ref:", "pre:", "between:"
OUTPUT = "output"


def is_output(name: str) -> bool:
    return name == OUTPUT or name.startswith(OUTPUT + ":")


def module_of(call: str) -> str:
    """`layer1.0.relu#1` -> `layer1.0.relu`; `name:1` -> `name`."""
    return call.split("#")[0].split(":")[0]


def scopes(node: onnx.NodeProto) -> list[str]:
    for p in node.metadata_props:
        if p.key == SCOPES:
            try:
                v = ast.literal_eval(p.value)
            except (ValueError, SyntaxError):
                return []
            return [str(s) for s in v] if isinstance(v, (list, tuple)) else []
    return []


@dataclass
class Leaves:
    calls: list[str]                      # leaf outputs (graph outputs that are not model outputs)
    outputs: list[str]                    # model outputs
    src: dict[str, str]                   # call -> the tensor its consumers read
    clone: dict[str, set[int]]            # call -> nodes of the Identity chain src -> graph output
    nodes: dict[str, set[int]]            # call (no `:i`) -> its node set
    inputs: dict[str, str] = field(default_factory=dict)    # call -> its input tensor
    skipped: dict[str, str] = field(default_factory=dict)   # call -> why its input is not cut
    # call -> its reference input's shape, where the input tensor has another (a folded reshape)
    reshaped: dict[str, tuple] = field(default_factory=dict)


class _Graph:
    def __init__(self, g: onnx.GraphProto):
        self.g = g
        self.producer = {o: i for i, n in enumerate(g.node) for o in n.output if o}
        self.inits = {t.name for t in g.initializer}
        self.consts = {o for n in g.node if n.op_type == "Constant" for o in n.output}
        self.types = {v.name: v.type for v in list(g.input) + list(g.output) + list(g.value_info)}

    def shape(self, t: str):
        ty = self.types.get(t)
        if ty is None or not ty.tensor_type.HasField("shape"):
            return None
        dims = ty.tensor_type.shape.dim
        return tuple(d.dim_value if d.HasField("dim_value") else None for d in dims)

    def const(self, t: str):
        """The value of initializer or Constant output `t` (numpy), None when it is neither."""
        if t in self.inits:
            return numpy_helper.to_array(next(i for i in self.g.initializer if i.name == t))
        if t in self.consts:
            node = self.g.node[self.producer[t]]
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            return numpy_helper.to_array(value) if value is not None else None
        return None

    def is_float(self, t: str) -> bool:
        ty = self.types.get(t)
        if ty is None:
            return True  # unknown: assume so (the shape check narrows it down)
        return ty.tensor_type.elem_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16,
                                            onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)


def analyse(m: onnx.ModelProto, pre_shapes: dict[str, tuple] | None = None) -> Leaves:
    """Leaf calls, their node sets and inputs in the per-layer graph `m` (see the module doc)."""
    g = _Graph(m.graph)
    names = [o.name for o in m.graph.output]
    calls = [n for n in names if not is_output(n)]
    lv = Leaves(calls, [n for n in names if is_output(n)], {}, {}, {})
    for c in calls:
        t, chain = c, set()
        scope = PREFIX + module_of(c)
        while _clone_of(m.graph, g, t, scope) is not None:
            chain.add(g.producer[t])
            t = _clone_of(m.graph, g, t, scope)
        lv.src[c], lv.clone[c] = t, chain
    stops = set(lv.src.values())
    for c in calls:
        base = c.split(":")[0]
        lv.nodes.setdefault(base, set()).update(_walk(m.graph, g, lv.src[c], PREFIX + module_of(c), stops))
    for c in [c for c in calls if ":" not in c]:
        _find_input(m.graph, g, lv, c, (pre_shapes or {}).get(c))
    return lv


def _clone_of(graph, g: _Graph, t: str, scope: str) -> str | None:
    """The tensor `t` copies when `t` is the LayerRecorder's clone (an Identity in the leaf's scope of
    a value made in that scope); None otherwise (an Identity-like leaf, Dropout, keeps its node)."""
    i = g.producer.get(t)
    if i is None or graph.node[i].op_type != "Identity" or scope not in scopes(graph.node[i]):
        return None
    x = graph.node[i].input[0]
    j = g.producer.get(x)
    return x if j is not None and scope in scopes(graph.node[j]) else None


def _walk(graph, g: _Graph, start: str, scope: str, stops: set[str]) -> set[int]:
    """Nodes in `scope` reached backwards from tensor `start`, not crossing other leaves' outputs."""
    seen: set[int] = set()
    todo = [start]
    while todo:
        t = todo.pop()
        i = g.producer.get(t)
        if i is None or i in seen or scope not in scopes(graph.node[i]):
            continue
        seen.add(i)
        todo += [x for x in graph.node[i].input if x and (x not in stops or x == start)]
    return seen


def _find_input(graph, g: _Graph, lv: Leaves, c: str, shape) -> None:
    nodes = lv.nodes.get(c, set())
    if not nodes:
        lv.skipped[c] = "no node of this module in the graph's metadata (name_scopes)"
        return
    made = {o for i in nodes for o in graph.node[i].output}
    cands = []
    for i in sorted(nodes):
        for t in graph.node[i].input:
            if t and t not in made and t not in g.inits and t not in g.consts and t not in cands \
                    and g.is_float(t):
                cands.append(t)
    if shape is not None and len(cands) > 1:
        cands = [t for t in cands if g.shape(t) == tuple(shape)] or cands
    if not cands:
        lv.skipped[c] = "no floating tensor enters its nodes from outside"
        return
    t, have = cands[0], g.shape(cands[0])
    if shape is not None and have is not None and not _fits(have, tuple(shape)):
        if not _read_by_reshapes(graph, g, nodes, t, have, tuple(shape)):
            lv.skipped[c] = (f"its input in the graph ({t}, shape {list(have)}) has not the reference "
                             f"input's shape {list(shape)}, and is not only reshaped")
            return
        lv.reshaped[c] = tuple(shape)
    lv.inputs[c] = t


def _fits(have: tuple, want: tuple) -> bool:
    """Shape `have` (None: a dynamic dim) can hold a tensor of shape `want`."""
    return len(have) == len(want) and all(h is None or h == w for h, w in zip(have, want))


def _read_by_reshapes(graph, g: _Graph, nodes: set[int], t: str, have: tuple, want: tuple) -> bool:
    """Every node of `nodes` reading `t` reads it as the data of a Reshape to a constant shape that
    does not copy input dims (no 0 unless allowzero), and `have` holds as many elements as `want`
    (when all its dims are known): those Reshapes give the same from a tensor of shape `want`."""
    if None not in have and int(np.prod(have)) != int(np.prod(want)):
        return False
    readers = [(graph.node[i], j) for i in sorted(nodes) for j, x in enumerate(graph.node[i].input) if x == t]
    for node, j in readers:
        target = g.const(node.input[1]) if node.op_type == "Reshape" and j == 0 else None
        allowzero = next((a.i for a in node.attribute if a.name == "allowzero"), 0)
        if target is None or (not allowzero and (np.asarray(target) == 0).any()):
            return False
    return bool(readers)


def _vi(name: str, like: onnx.TypeProto | None, rank: int | None = None) -> onnx.ValueInfoProto:
    """A float32 graph input/output: `like`'s shape, or (`rank`) that many dims of unknown size."""
    v = helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None if rank is None else [None] * rank)
    if rank is None and like is not None and like.tensor_type.HasField("shape"):
        v.type.tensor_type.shape.CopyFrom(like.tensor_type.shape)
    return v


def _without_weights(m: onnx.ModelProto) -> onnx.ModelProto:
    """`m` with the bytes of its large floating initializers left out (dims and type kept): shape
    inference reads only the values of small integer tensors (Reshape shapes, Slice starts), and
    handing it resnet18's 47 MB of weights cost a serialisation and a parse (~0.2 s per capture)."""
    light = onnx.ModelProto()
    light.CopyFrom(m)
    for init in light.graph.initializer:
        if init.data_type in _FLOATS and init.ByteSize() > 4096:
            init.ClearField("raw_data")
            for f in ("float_data", "double_data", "int32_data"):  # fp16/bf16 values live in int32_data
                init.ClearField(f)
    return light


_FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}


def cut(m: onnx.ModelProto, lv: Leaves) -> onnx.ModelProto:
    """The cut graph (module doc): inputs = the model's + `ref:<call>` + `pre:<call>`; outputs =
    `<call>` (own) per leaf, `between:<call>` per cut leaf input, `between:output[:i]`."""
    g = _Graph(onnx.shape_inference.infer_shapes(_without_weights(m)).graph)  # types of the tensors now graph I/O
    src_of = {t: c for c, t in lv.src.items()}
    node_call = {i: c for c, s in lv.nodes.items() for i in s}
    used_ref: dict[str, str] = {}

    def ref(t: str) -> str:
        if t in src_of:
            used_ref[src_of[t]] = t
            return REF + src_of[t]
        return t

    out = onnx.ModelProto()
    out.CopyFrom(m)
    graph = out.graph
    clone_nodes = {i for s in lv.clone.values() for i in s}
    for i, node in enumerate(graph.node):
        if i in clone_nodes:
            continue
        c = node_call.get(i)
        for j, t in enumerate(node.input):
            if c is not None and lv.inputs.get(c) == t:
                node.input[j] = PRE + c
            elif t in src_of and (c is None or c != src_of[t].split(":")[0]):
                node.input[j] = ref(t)
    extra_out = [(BETWEEN + c, lv.inputs[c]) for c in lv.calls if c in lv.inputs]
    extra_out += [(BETWEEN + o, o) for o in lv.outputs]
    for name, t in extra_out:
        graph.node.extend(_between_nodes(name, ref(t), lv))
    outs = {o.name: o for o in m.graph.output}

    def rank(c: str) -> int | None:  # a reshaped leaf's input and between value: the reference's rank
        return len(lv.reshaped[c]) if c in lv.reshaped else None

    del graph.output[:]
    graph.output.extend([outs[c] for c in lv.calls])
    graph.output.extend(_vi(name, g.types.get(t), rank(name.removeprefix(BETWEEN))) for name, t in extra_out)
    graph.input.extend(_vi(REF + c, outs[c].type) for c in lv.calls if c in used_ref)
    graph.input.extend(_vi(PRE + c, g.types.get(lv.inputs[c]), rank(c)) for c in lv.calls if c in lv.inputs)
    return out


def _between_nodes(name: str, t: str, lv: Leaves) -> list[onnx.NodeProto]:
    """The nodes giving graph output `name` (`between:<call>`) from tensor `t`: an Identity, or for a
    reshaped leaf input (Leaves.reshaped) the folded reshape redone: `t` reshaped to the shape of the
    reference input fed as `pre:<call>`, so the value compares with it element for element."""
    c = name.removeprefix(BETWEEN)
    if c not in lv.reshaped:
        return [helper.make_node("Identity", [t], [name], name=f"own_{name}")]
    return [helper.make_node("Shape", [PRE + c], [f"own_shape:{c}"], name=f"own_shape_{c}"),
            helper.make_node("Reshape", [t, f"own_shape:{c}"], [name], name=f"own_{name}")]


def regions(m: onnx.ModelProto) -> dict[str, dict]:
    """Per leaf call (and model output): {"after": leaf calls whose outputs feed it through
    non-leaf ops, "ops": op types of those between-leaf nodes in graph order (no Constant)}."""
    lv = analyse(m)
    g = _Graph(m.graph)
    src_of = {t: c for c, t in lv.src.items()}
    leaf_nodes = {i for s in lv.nodes.values() for i in s} | {i for s in lv.clone.values() for i in s}
    res = {}
    starts = [(c, lv.inputs[c]) for c in lv.calls if c in lv.inputs] + [(o, o) for o in lv.outputs]
    for c, t0 in starts:
        after, seen, todo = [], set(), [t0]
        while todo:
            t = todo.pop()
            if t in src_of and src_of[t] != c:
                if src_of[t] not in after:
                    after.append(src_of[t])
                continue
            i = g.producer.get(t)
            if i is None or i in seen or i in leaf_nodes:
                continue
            seen.add(i)
            todo += [x for x in m.graph.node[i].input if x and x not in g.inits]
        order = {n: k for k, n in enumerate(lv.calls)}
        res[c] = {"after": sorted(after, key=lambda n: order.get(n, -1)),
                  "ops": [m.graph.node[i].op_type for i in sorted(seen)
                          if m.graph.node[i].op_type != "Constant"]}
    return res
