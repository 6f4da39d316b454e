"""Models given as ONNX files (`arch: {source: onnx, path: models/foo.onnx}`): checked, instrumented
per node and run without torch.

- `load_checked` reads the file and rejects, with a message naming the file and the problem, the five
  ways a file goes bad: missing, not ONNX, truncated, external data missing, and an opset / IR version
  the installed onnxruntime does not run. Nothing is written before it passes.
- `instrument` gives the two graphs the pipeline runs, as the export stage writes them for torch
  models: `layers.onnx` (every floating node output is a graph output: per-layer names are the ONNX
  tensor names, in topological order) and `model.onnx` (the file's graph). Both also carry each graph
  output as `output` (`output:<i>` for several) through an Identity, the name every stage reads the
  model output by.
- The reference is ONNX Runtime CPU with every graph optimisation disabled (each node its own kernel,
  no fusion: the graph as written), run through the same OrtCpuRunner as the providers. The ONNX
  reference evaluator was the other candidate: it is numpy and much slower (resnet50, one sample, every
  node output: 19 s at load ~12 against ~1 s), and no more exact at float32. It does serve as the fp64 golden
  run: the graph cast to float64 (to_float64; onnxruntime has no float64 Conv kernel), node by node,
  a node it cannot run falling back alone (parity.pipeline.onnx_fp64).
- Layers are the values that can fail: constants and zero-element tensors are not (instrument).
- The trusted baseline of the fp64 oracle (issue 9) for such a model is the same no-optimisation ORT
  CPU run at the cell's dtype (torch CPU eager cannot run an ONNX file).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper, numpy_helper

from parity.core import modelfiles
from parity.core.io import atomic_path
from parity.core.store import is_output
from parity.models import onnx_weights
from parity.models.onnx_weights import external_info, initializers, is_external

from parity.config import schema

FLOAT_ELEM = {1: "float32", 10: "float16", 11: "float64", 16: "bfloat16"}  # TensorProto elem types
ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\][^/]*/\S+ .*?\) ")
NOOPT = {"graph_optimization_level": "disabled"}
ORT_RUNNER = "parity.backends.ort_cpu:OrtCpuRunner"


class OnnxSourceError(ValueError):
    """A bad ONNX model file: the message names the file and the problem."""


def arch_path(model_cfg: dict) -> Path:
    return Path(str(model_cfg["arch"]["path"]))


# -- checks ---------------------------------------------------------------------------------------

def load_checked(path: str | Path, where: str = "arch.path", notes: list | None = None):
    """The graph at `path` without its external data (parity.models.onnx_weights: initializers keep
    their references, relative to the file's folder), or OnnxSourceError naming file and problem.
    The checker runs by path, so a file whose weights are over 2 GiB is checked too. What was changed
    to load it (an IR version lowered: runtime_error) is appended to `notes`."""
    p = Path(path)
    if not p.is_file():
        raise OnnxSourceError(f"{where}: {p}: no such file")
    data = p.read_bytes()
    m = onnx.ModelProto()
    try:
        m.ParseFromString(data)
    except DecodeError as e:
        if data[:1] == b"\x08":  # field 1 (ir_version), as every ONNX file starts
            raise OnnxSourceError(f"{where}: {p}: truncated or corrupt ONNX file ({len(data)} bytes; "
                                  f"protobuf: {e})") from None
        raise OnnxSourceError(f"{where}: {p}: not an ONNX model (not a ModelProto protobuf: {e})") from None
    if not m.ir_version or not m.HasField("graph"):
        what = "truncated ONNX file (it has no graph" if data[:1] == b"\x08" and m.ir_version else \
            "not an ONNX model (no ir_version or graph"
        raise OnnxSourceError(f"{where}: {p}: {what}; {len(data)} bytes)")
    del data
    note = runtime_error(m, p, where)  # before the checker: its message for a too-new opset says less
    if note and notes is not None:
        notes.append(note)
    _check_external(m, p, where)
    try:
        onnx_weights.check(p, full_check=False)  # external data read by parity: through DVC's links too
    except onnx.checker.ValidationError as e:
        raise OnnxSourceError(f"{where}: {p}: invalid ONNX model: {str(e).strip().splitlines()[0]}") from None
    return m


def _check_external(m, p: Path, where: str) -> None:
    """Check every external-data file the tensors name (not read): one parity may read
    (onnx_weights.external_path: under the model's folder, reached through DVC's hard links or its
    symlinks into DVC's cache; never `../`, an absolute path or a symlink elsewhere), holding the
    bytes each tensor declares (a declared length past the file's end is refused)."""
    for t in initializers(m):
        if not is_external(t):
            continue
        loc = external_info(t).get("location", "")
        try:
            f = modelfiles.external_file(p.parent, loc) if loc else None
        except FileNotFoundError:
            f = None
        except modelfiles.ExternalDataError as e:
            raise OnnxSourceError(f"{where}: {p}: external data refused: initializer '{t.name}': {e}") from None
        if f is None:
            raise OnnxSourceError(f"{where}: {p}: external data missing: initializer '{t.name}' reads "
                                  f"{loc or None!r}, no such file beside the model ({p.parent / loc})")
        try:
            onnx_weights.external_range(t, f)
        except onnx.checker.ValidationError:
            info = external_info(t)
            raise OnnxSourceError(f"{where}: {p}: external data file {f} is {f.stat().st_size} bytes; initializer "
                                  f"'{t.name}' declares offset {info.get('offset', 0)}, length "
                                  f"{info.get('length', '(rest)')} (truncated, or a bad range)") from None


def write_graphs(m, src_dir: Path, out: Path):
    """layers.onnx and model.onnx of graph `m` (weightless, loaded by load_checked from a file in
    `src_dir`) under `out`, both pointing at one `out`/weights.bin (its weights copied there, in graph
    order; parity.models.onnx_weights.pack), each checked by path. Returns instrument(m)."""
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / onnx_weights.WEIGHTS, allow_empty=True) as w:
        onnx_weights.pack(m, src_dir, w)  # small tensors come inline first: shape inference reads them
    res = instrument(m)
    for name, g in (("layers.onnx", res[0]), ("model.onnx", res[1])):
        with atomic_path(out / name) as tmp:  # the file itself was checked (load_checked); instrumented
            onnx_weights.save_graph(g, tmp)   # outputs carry no shapes, which onnx's checker demands
    return res


def _probe(stamps, ir_version: int) -> str | None:
    """None when the installed onnxruntime loads a one-node model stamped with these opsets and IR
    version (exactly ORT's own rule, at the cost of a tiny session), else ORT's first message line."""
    # lazy: onnxruntime +0.14 s (BENCHMARKS 22); export@ of a torch model imports this module and never runs ORT
    import onnxruntime as ort

    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    if not any(o.domain in ("", "ai.onnx") for o in stamps):  # the probe's own Identity needs one
        stamps = [*stamps, helper.make_opsetid("", 13)]
    probe = helper.make_model(g, opset_imports=stamps, ir_version=ir_version)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        ort.InferenceSession(probe.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime's Fail/InvalidGraph/NotImplemented: the message says which
        return ORT_PREFIX.sub("", str(e).strip().splitlines()[0])  # drop the C++ file and signature
    return None


def runtime_error(m, p: Path, where: str) -> str | None:
    """Check that the installed onnxruntime can load a model stamped with m's opsets and IR version.
    A file stamped with an IR version newer than onnxruntime reads (onnx 1.23's make_model writes IR
    14; onnxruntime 1.31 reads <= 13) whose opsets it supports is lowered in place to the newest IR
    version it reads, and the returned note says so; None when nothing changed. OnnxSourceError names
    the stamp at fault otherwise: the opset, or the IR version when no lower one loads."""
    # lazy: onnxruntime +0.14 s (BENCHMARKS 22); export@ of a torch model imports this module and never runs ORT
    import onnxruntime as ort

    stamps = [o for o in m.opset_import if o.domain in ("", "ai.onnx") or o.domain.startswith("ai.onnx.")]
    msg = _probe(stamps, m.ir_version)
    if msg is None:
        return None
    opset = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in stamps)
    lower = next((ir for ir in range(m.ir_version - 1, 2, -1) if _probe(stamps, ir) is None), None)
    if lower is not None:
        note = (f"IR version {m.ir_version} lowered to {lower}: onnxruntime {ort.__version__} reads IR <= {lower} "
                f"and supports opset {opset}")
        m.ir_version = lower
        return note

    base = [helper.make_opsetid("", 13)]  # an opset every onnxruntime we run reads: isolates the IR version
    newest = next((ir for ir in range(m.ir_version, 2, -1) if _probe(base, ir) is None), None)
    if newest is not None and newest < m.ir_version:  # both stamps too new: name both
        raise OnnxSourceError(f"{where}: {p}: IR version {m.ir_version} is newer than the installed onnxruntime "
                              f"{ort.__version__} reads (<= {newest}), and opset {opset} is outside what it "
                              f"supports: {_probe(stamps, newest)}")
    raise OnnxSourceError(f"{where}: {p}: opset {opset} (IR version {m.ir_version}) is outside what the "
                          f"installed onnxruntime {ort.__version__} supports: {msg}")


def check_inputs(m, specs: list[dict], p: Path, where: str) -> None:
    """The model conf's `input:` specs against the graph's inputs: same names, dtypes, static dims."""
    inits = {t.name for t in m.graph.initializer}
    graph_in = {i.name: i for i in m.graph.input if i.name not in inits}
    names = [s["name"] for s in specs]
    if sorted(names) != sorted(graph_in):
        raise OnnxSourceError(f"{where}: {p} takes inputs {sorted(graph_in)}, the model conf's `input:` "
                              f"names {names}: list one spec per graph input, by name")
    for s in specs:
        tt = graph_in[s["name"]].type.tensor_type
        want = helper.tensor_dtype_to_np_dtype(tt.elem_type).name if tt.elem_type else None
        if want and want != s.get("dtype", schema.InputSpec.dtype):
            raise OnnxSourceError(f"{where}: {p}: input '{s['name']}' is {want}, the spec says "
                                  f"{s.get('dtype', schema.InputSpec.dtype)}")
        # a dim_value <= 0 is no size: Paddle2ONNX writes -1 for a dynamic batch (PP-OCR's classifier)
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tt.shape.dim]
        if tt.HasField("shape") and (len(dims) != len(s["shape"]) or
                                     any(d is not None and d != v for d, v in zip(dims, s["shape"]))):
            shown = ["?" if d is None else d for d in dims]
            raise OnnxSourceError(f"{where}: {p}: input '{s['name']}' has shape {shown}, the spec "
                                  f"{s['shape']}")


# -- graphs -----------------------------------------------------------------------------------------

def topo_sorted(m):
    """A copy of m with the main graph's nodes in topological order: the file's order when it is one
    already (as ONNX requires), else repaired (stable: file order among ready nodes), not refused. A
    node is ready when its inputs and the outer-scope values its subgraphs read (If/Loop/Scan bodies:
    implicit_inputs) are."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    g = out.graph
    have = {i.name for i in g.input} | {t.name for t in g.initializer} | {""}
    needs = [(n, [*n.input, *implicit_inputs(n)]) for n in g.node]
    produced = _produced(g.node)
    seen = set(have)
    for n, reads in needs:  # one pass: is the file's order a topological one already?
        if any(i not in seen and i in produced for i in reads):
            break
        seen.update(n.output)
    else:
        return out
    order = []
    while needs:
        produced = _produced(n for n, _ in needs)
        ready = [(n, r) for n, r in needs if all(i in have or i not in produced for i in r)]
        if not ready:  # a cycle: leave the rest as it is, the checker/ORT will name it
            order += [n for n, _ in needs]
            break
        for n, _ in ready:
            order.append(n)
            have.update(n.output)
        ready_ids = {id(n) for n, _ in ready}
        needs = [(n, r) for n, r in needs if id(n) not in ready_ids]
    del g.node[:]
    g.node.extend(order)
    return out


def _produced(nodes) -> set:
    return {o for n in nodes for o in n.output}


def implicit_inputs(node) -> list[str]:
    """The values a node's subgraphs (recursively) read from the enclosing scopes: inputs it takes
    without naming them in node.input (an If branch reading a tensor of the main graph)."""
    reads: list[str] = []
    for g in onnx_weights.subgraphs(node):
        local = {i.name for i in g.input} | {t.name for t in g.initializer} | \
            {t.values.name for t in g.sparse_initializer} | {""}
        for n in g.node:
            reads += [i for i in [*n.input, *implicit_inputs(n)] if i not in local]
            local.update(n.output)
        reads += [o.name for o in g.output if o.name not in local]  # a branch output that is an outer value
    return list(dict.fromkeys(reads))


def output_names(n: int) -> list[str]:
    """What the stages call the model's outputs (parity.core.store.is_output)."""
    return ["output"] if n == 1 else [f"output:{i}" for i in range(n)]


SHAPE_ONLY = {"Shape", "Size"}  # outputs that read their input's shape, not its values


def input_dependent(g, vi: dict) -> set:
    """The tensors of graph `g` (nodes in topological order) whose values depend on the graph's
    inputs (those without an initializer: what the feeds give). Constant subgraphs (Constant nodes,
    arithmetic on initializers, an exporter's `p2o.helper.constant.*`) are not, and neither is a Shape
    or Size of a tensor whose shape is static (`vi`: the shape-inferred value infos)."""
    inits = {t.name for t in g.initializer}
    dep = {i.name for i in g.input if i.name not in inits}
    for n in g.node:
        if n.op_type in SHAPE_ONLY and n.domain in ("", "ai.onnx") and n.input and _static(vi.get(n.input[0])):
            continue
        if any(i in dep for i in [*n.input, *implicit_inputs(n)]):
            dep.update(o for o in n.output if o)
    return dep


def _static(v) -> bool:
    """A value info with a fully known shape."""
    if v is None or not v.type.tensor_type.HasField("shape"):
        return False
    return all(d.HasField("dim_value") for d in v.type.tensor_type.shape.dim)


def _empty(v) -> bool:
    """A value info whose shape has a 0 dimension: a zero-element tensor."""
    return v.type.tensor_type.HasField("shape") and \
        any(d.HasField("dim_value") and d.dim_value == 0 for d in v.type.tensor_type.shape.dim)


def instrument(m):
    """(layers model, plain model, [(layer tensor, op type)] in topological order, {output: tensor}).
    A layer is a floating node output of the main graph whose value depends on the graph inputs
    (input_dependent) and that is not known to be empty: a constant or a zero-element tensor computes
    nothing a backend could get wrong, so it is never a layer (nor a drift origin)."""
    m = topo_sorted(m)
    try:
        typed = onnx.shape_inference.infer_shapes(m)
    except Exception:  # custom ops: only the types the file itself records
        typed = m
    g = typed.graph
    vi = {v.name: v for v in [*g.input, *g.value_info, *g.output]}
    renamed = dict(zip(output_names(len(m.graph.output)), [o.name for o in m.graph.output]))
    plain = onnx.ModelProto()
    plain.CopyFrom(m)
    outs = []
    for new, old in renamed.items():
        if new == old:  # already named as the stages read it (a torch export's `output`)
            outs.append(next(o for o in m.graph.output if o.name == old))
            continue
        v = onnx.ValueInfoProto()
        v.CopyFrom(vi.get(old) or helper.make_empty_tensor_value_info(old))
        v.name = new
        plain.graph.node.append(helper.make_node("Identity", [old], [new], name=f"parity_{new}"))
        outs.append(v)
    del plain.graph.output[:]
    plain.graph.output.extend(outs)
    dep = input_dependent(m.graph, vi)
    layers_list = []
    for n in m.graph.node:
        for o in n.output:
            v = vi.get(o)
            if o and v is not None and v.type.tensor_type.elem_type in FLOAT_ELEM and not is_output(o) \
                    and o in dep and not _empty(v):
                layers_list.append((o, n.op_type))
    layers = onnx.ModelProto()
    layers.CopyFrom(plain)
    layers.graph.output.extend(vi[o] for o, _ in layers_list)
    return layers, plain, layers_list, renamed


# -- float64 ----------------------------------------------------------------------------------------

DTYPE_ATTRS = {"to", "dtype"}  # Cast's target; EyeLike's and the Random* ops' output type


def to_float64(m):
    """A copy of m computing in float64: float32 initializers, value types, Cast targets, output
    types (EyeLike, Random*) and constant attributes become float64, in the main graph and in every
    subgraph (If branches, Loop and Scan bodies, recursively) and model-local function."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    _graph64(out.graph)
    for f in out.functions:
        for n in f.node:
            _node64(n)
    return out


def _t64(t) -> None:
    if t.data_type == TensorProto.FLOAT:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))


def _type64(tp) -> None:
    """float32 -> float64 in a TypeProto (tensors, and the tensors of sequences and optionals)."""
    kind = tp.WhichOneof("value")
    if kind == "tensor_type" and tp.tensor_type.elem_type == TensorProto.FLOAT:
        tp.tensor_type.elem_type = TensorProto.DOUBLE
    elif kind in ("sequence_type", "optional_type"):
        _type64(getattr(tp, kind).elem_type)
    elif kind == "map_type":
        _type64(tp.map_type.value_type)


def _graph64(g) -> None:
    for t in g.initializer:
        _t64(t)
    for v in [*g.input, *g.output, *g.value_info]:
        _type64(v.type)
    for n in g.node:
        _node64(n)


def _node64(n) -> None:
    std = n.domain in ("", "ai.onnx")
    if std and n.op_type == "Constant":  # value_float(s): an attribute that yields float32
        for a in list(n.attribute):
            if a.name in ("value_float", "value_floats"):
                v = np.array(a.f if a.name == "value_float" else list(a.floats), np.float64)
                n.attribute.remove(a)
                n.attribute.append(helper.make_attribute("value", numpy_helper.from_array(v)))
    if std and n.op_type == "ConstantOfShape" and not any(a.name == "value" for a in n.attribute):
        n.attribute.append(helper.make_attribute("value", numpy_helper.from_array(np.zeros(1, np.float64))))
    for a in n.attribute:
        if std and a.type == onnx.AttributeProto.INT and a.name in DTYPE_ATTRS and a.i == TensorProto.FLOAT:
            a.i = TensorProto.DOUBLE
        elif a.type == onnx.AttributeProto.TENSOR:
            _t64(a.t)
        elif a.type == onnx.AttributeProto.TENSORS:
            for t in a.tensors:
                _t64(t)
        elif a.type == onnx.AttributeProto.GRAPH:
            _graph64(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            for sg in a.graphs:
                _graph64(sg)
