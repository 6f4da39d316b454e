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
  run: the graph cast to float64 (onnxruntime has no float64 Conv kernel) where the evaluator runs every
  op; when it cannot, the reference has no fp64 run and cells are judged by tolerance, and say so.
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


def is_onnx_source(model_cfg: dict) -> bool:
    return (model_cfg.get("arch") or {}).get("source") == "onnx"


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
        onnx_weights.check(p, full_check=False)  # by path; a DVC hard-linked weights file is read by parity
    except onnx.checker.ValidationError as e:
        raise OnnxSourceError(f"{where}: {p}: invalid ONNX model: {str(e).strip().splitlines()[0]}") from None
    return m


def _check_external(m, p: Path, where: str) -> None:
    """Check every external-data file the initializers name: present, long enough (not read)."""
    for t in initializers(m):
        if not is_external(t):
            continue
        info = external_info(t)
        f = p.parent / info.get("location", "")
        if not info.get("location") or not f.is_file():
            raise OnnxSourceError(f"{where}: {p}: external data missing: initializer '{t.name}' reads "
                                  f"{info.get('location')!r}, no such file beside the model ({f})")
        need = int(info.get("offset", 0)) + int(info.get("length", 0))
        if f.stat().st_size < need:
            raise OnnxSourceError(f"{where}: {p}: external data file {f} is {f.stat().st_size} bytes; "
                                  f"initializer '{t.name}' needs bytes up to {need} (truncated)")


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
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if tt.HasField("shape") and (len(dims) != len(s["shape"]) or
                                     any(d is not None and d != v for d, v in zip(dims, s["shape"]))):
            shown = ["?" if d is None else d for d in dims]
            raise OnnxSourceError(f"{where}: {p}: input '{s['name']}' has shape {shown}, the spec "
                                  f"{s['shape']}")


# -- graphs -----------------------------------------------------------------------------------------

def topo_sorted(m):
    """A copy of m with the main graph's nodes in topological order (stable: file order among ready
    nodes). ONNX requires it already; a file that breaks the rule is repaired, not refused."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    g = out.graph
    have = {i.name for i in g.input} | {t.name for t in g.initializer} | {""}
    nodes, order = list(g.node), []
    while nodes:
        produced = _produced(nodes)
        ready = [n for n in nodes if all(i in have or i not in produced for i in n.input)]
        if not ready:  # a cycle: leave the rest as it is, the checker/ORT will name it
            order += nodes
            break
        for n in ready:
            order.append(n)
            have.update(n.output)
        ready_ids = {id(n) for n in ready}
        nodes = [n for n in nodes if id(n) not in ready_ids]
    del g.node[:]
    g.node.extend(order)
    return out


def _produced(nodes) -> set:
    return {o for n in nodes for o in n.output}


def output_names(n: int) -> list[str]:
    """What the stages call the model's outputs (parity.core.store.is_output)."""
    return ["output"] if n == 1 else [f"output:{i}" for i in range(n)]


def instrument(m):
    """(layers model, plain model, [(layer tensor, op type)] in topological order, {output: tensor})."""
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
    layers_list = []
    for n in m.graph.node:
        for o in n.output:
            v = vi.get(o)
            if o and v is not None and v.type.tensor_type.elem_type in FLOAT_ELEM and not is_output(o):
                layers_list.append((o, n.op_type))
    layers = onnx.ModelProto()
    layers.CopyFrom(plain)
    layers.graph.output.extend(vi[o] for o, _ in layers_list)
    return layers, plain, layers_list, renamed


def to_float64(m):
    """A copy of m computing in float64: float32 initializers, graph value types, Cast targets and
    constant attributes become float64."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    g = out.graph

    def t64(t):
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))

    for t in g.initializer:
        t64(t)
    for v in [*g.input, *g.output, *g.value_info]:
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = TensorProto.DOUBLE
    for n in g.node:
        for a in n.attribute:
            if n.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.DOUBLE
            elif a.type == onnx.AttributeProto.TENSOR:
                t64(a.t)
    return out
