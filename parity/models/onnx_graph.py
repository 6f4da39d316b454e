"""ONNX graph helpers every layer above reads: a graph cut down to some of its outputs, and its op
inventory (ops.json). onnx only, no torch.

Here, below the pipeline, analysis and suites, so the export (parity.pipeline.export, decoder), the
fault injection (parity.analysis.faults) and the ONNX-file source share them without importing each
other (issue 37).
"""

from __future__ import annotations

import collections

import onnx

from parity.models import onnx_weights


def prune_outputs(m: onnx.ModelProto, keep: list[str]) -> onnx.ModelProto:
    """Copy of `m` with only the `keep` graph outputs and the nodes they need (`m` weightless: its
    initializers refer to external data, which the copy shares)."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    g = out.graph
    kept = [o for o in g.output if o.name in keep]
    del g.output[:]
    g.output.extend(kept)
    needed = set(keep)
    live = []
    for node in reversed(list(g.node)):
        if any(o in needed for o in node.output):
            live.append(node)
            needed.update(i for i in node.input if i)
            for sub in onnx_weights.subgraphs(node):  # subgraph inputs (If/Loop bodies) reference outer values
                needed.update(i for n in sub.node for i in n.input if i)
    live.reverse()
    del g.node[:]
    g.node.extend(live)
    inits = [t for t in g.initializer if t.name in needed]
    del g.initializer[:]
    g.initializer.extend(inits)
    vi = [v for v in g.value_info if v.name in needed]
    del g.value_info[:]
    g.value_info.extend(vi)
    return out



def op_inventory(m: onnx.ModelProto) -> dict:
    counts = collections.Counter((n.domain or "ai.onnx", n.op_type) for n in m.graph.node)
    return {
        "opset": {(i.domain or "ai.onnx"): i.version for i in m.opset_import},
        "nodes": len(m.graph.node),
        "op_types": len({t for _, t in counts}),
        "ops": {f"{t}" if d == "ai.onnx" else f"{d}::{t}": c for (d, t), c in sorted(counts.items())},
        "inputs": [i.name for i in m.graph.input],
        "outputs": [o.name for o in m.graph.output],
        "initializers": len(m.graph.initializer),
        "parameters": int(sum(_numel(t) for t in m.graph.initializer)),
        "producer": f"{m.producer_name} {m.producer_version}".strip(),
    }


def _numel(t) -> int:
    n = 1
    for d in t.dims:
        n *= d
    return n
