"""A diagnostic provider option that emulates a miscompiling backend, for testing the pipeline's
diagnosis (diff, drift origin, reduce) on a fault whose place is known.

`options.fault: {node: <node name or one of its output tensor names>, scale: 1.01}` on an ONNX Runtime
provider (conf/providers/<p>.yaml, or `-S providers.ort_cpu.options.fault={node: ..., scale: ...}`)
perturbs that one node in every graph the provider runs: a floating initializer it reads (a Conv/Gemm
weight) is replaced by a copy scaled by `scale`; a node that reads none gets its first output scaled
by a Mul. The provider's graphs are changed the way a wrong kernel would change their results: a graph
without the node runs unchanged (a kernel bug shows only where the kernel is used), which is what
lets the reduce stage find it, and what its repro.py shows against the unfaulted graph.
The capture stage fails the cell (EXPORT_FAIL, listing node names) when the model has no such node.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from parity.models import onnx_weights


def find(m, target: str):
    """The main-graph node named `target`, or producing a tensor named `target`; None if absent."""
    for n in m.graph.node:
        if n.name == target or target in n.output:
            return n
    return None


def check(m, spec: dict, where: str) -> None:
    """ValueError naming some of the graph's nodes when the fault's node is not in `m`."""
    if find(m, str(spec["node"])) is None:
        names = [n.name or n.output[0] for n in m.graph.node]
        raise ValueError(f"{where}.node: no node or tensor named {spec['node']!r} in the model "
                         f"({len(names)} nodes: {', '.join(names[:8])}{', ...' if len(names) > 8 else ''})")


def inject(m, spec: dict, base_dir=None):
    """A copy of `m` with the fault applied (m itself when the node is not in it). `m` may be
    weightless (parity.models.onnx_weights): the weight to scale is read from its external data under
    `base_dir`, and its scaled copy goes into the graph inline."""
    node = find(m, str(spec["node"]))
    if node is None:
        return m
    scale = float(spec.get("scale", 1.01))
    out = onnx.ModelProto()
    out.CopyFrom(m)
    g = out.graph
    node = find(out, str(spec["node"]))
    inits = {t.name: t for t in g.initializer}
    floats = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)
    w = next((i for i in list(node.input)[1:] if i in inits and inits[i].data_type in floats), None)
    if w is not None:
        t = inits[w]
        arr = onnx_weights.tensor_view(t, base_dir, {}) if onnx_weights.is_external(t) else numpy_helper.to_array(t)
        g.initializer.append(numpy_helper.from_array((arr * scale).astype(arr.dtype), w + "__fault"))
        node.input[list(node.input).index(w)] = w + "__fault"
        return out
    o = node.output[0]
    node.output[0] = o + "__prefault"
    g.initializer.append(numpy_helper.from_array(np.array(scale, dtype=np.float32), o + "__scale"))
    idx = list(g.node).index(node)
    g.node.insert(idx + 1, helper.make_node("Mul", [o + "__prefault", o + "__scale"], [o], name=o + "__fault"))
    return out
