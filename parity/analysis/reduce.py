"""reduce@model-dtype-provider: shrink a failing cell's plain graph (model.onnx) to the smallest
subgraph that still fails on that provider against the reference, and write what a vendor needs to
see it: reduced.onnx, inputs.npz, expected.npz and a standalone repro.py (numpy + onnxruntime only).

Reference: every tensor of the plain graph from ONNX Runtime CPU at float32 with graph optimisation
disabled (each node its own kernel: the graph as written; parity.models.onnx_source), on the cell's
first input sample. A subgraph's inputs are fed with the reference's values of those tensors, so a
subgraph fails only through its own nodes, not through error accumulated before it.

A subgraph *fails* when one of its checked outputs (tensors it produces that a node outside it reads,
or a graph output, or a sink) has a relative L2 error ||actual - reference|| / ||reference|| above
analysis.reduce_rel_l2 (default 1e-3), or NaN/Inf where the reference is finite. A relative norm, not
the cell's elementwise atol/rtol: measured on resnet50 at fp32, ORT's fused graph (Conv+BatchNorm folded)
against the unfused reference leaves ~1e-4 absolute differences deep in the net (rel_l2 ~1e-6) that an
elementwise fp32 tolerance flags, so every long prefix would "fail" and bisection would blame noise.

Search, as `polygraphy debug reduce` does: (1) bisect on topological order for the shortest failing
prefix [0, e] (node e is where the failure first shows); (2) bisect for the latest start s with [s, e]
still failing; (3) keep only e's ancestors, then drop nodes one at a time (latest first) while the rest
still fails; a dropped node's outputs become inputs fed from the reference.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from parity.models import onnx_weights
from parity.models.onnx_source import topo_sorted


@dataclass
class Reduction:
    status: str                  # REDUCED | NOT_REPRODUCED
    reason: str = ""
    nodes: list[str] = field(default_factory=list)      # node names (or first output) of the result
    op_types: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    worst: dict = field(default_factory=dict)            # the failing output: name, fraction outside, max err
    trials: int = 0
    graph_nodes: int = 0
    seconds: float = 0.0
    model: object = None         # reduced ModelProto (unfaulted: the graph as in model.onnx)
    feeds: dict = field(default_factory=dict)
    expected: dict = field(default_factory=dict)


def node_inputs(n) -> list[str]:
    """Tensors a node reads, including outer-scope names its subgraphs (If/Loop bodies) read."""
    ins = [i for i in n.input if i]
    for sub in onnx_weights.subgraphs(n):
        inner = {o for sn in sub.node for o in sn.output} | {i.name for i in sub.input} | \
                {t.name for t in sub.initializer}
        ins += [i for sn in sub.node for i in node_inputs(sn) if i not in inner]
    return ins


class Graph:
    """The plain graph in topological order, with inferred types and who reads what."""

    def __init__(self, m):
        self.m = topo_sorted(m)
        try:
            typed = onnx.shape_inference.infer_shapes(self.m)
        except Exception:  # custom ops: the types the file records
            typed = self.m
        g = typed.graph
        self.types = {v.name: v.type.tensor_type.elem_type for v in [*g.input, *g.value_info, *g.output]
                      if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type}
        self.nodes = list(self.m.graph.node)
        self.inits = {t.name for t in self.m.graph.initializer}
        self.reads = [node_inputs(n) for n in self.nodes]
        self.graph_outputs = {o.name for o in self.m.graph.output}

    def name(self, i: int) -> str:
        n = self.nodes[i]
        return n.name or n.output[0]

    def all_outputs_model(self):
        """The graph with every typed node output a graph output (the reference run)."""
        m = onnx.ModelProto()
        m.CopyFrom(self.m)
        have = {o.name for o in m.graph.output}
        m.graph.output.extend(helper.make_tensor_value_info(o, self.types[o], None)
                              for n in self.nodes for o in n.output
                              if o and o in self.types and o not in have)
        return m

    def cut(self, idx: list[int], ref: dict):
        """(ModelProto of nodes idx, its inputs, its checked outputs); None when an input has no
        reference value (a tensor whose type inference did not reach)."""
        idx = sorted(set(idx))
        inside = set(idx)
        produced = [o for i in idx for o in self.nodes[i].output if o]
        pset = set(produced)
        ins: list[str] = []
        for i in idx:
            for t in self.reads[i]:
                if t not in pset and t not in self.inits and t not in ins:
                    ins.append(t)
        if any(t not in ref for t in ins):
            return None
        read_inside = {t for i in idx for t in self.reads[i]}
        read_outside = {t for j, r in enumerate(self.reads) if j not in inside for t in r}
        outs = [o for o in produced if o in ref and np.asarray(ref[o]).dtype.kind == "f"
                and (o in read_outside or o in self.graph_outputs or o not in read_inside)]
        used = read_inside & self.inits
        g = helper.make_graph(
            [self.nodes[i] for i in idx], "reduced",
            [helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(np.asarray(ref[t]).dtype),
                                           list(np.shape(ref[t]))) for t in ins],
            [helper.make_tensor_value_info(o, self.types[o], list(np.shape(ref[o]))) for o in outs],
            [t for t in self.m.graph.initializer if t.name in used])
        sub = helper.make_model(g, opset_imports=list(self.m.opset_import), ir_version=self.m.ir_version,
                                producer_name="parity reduce")
        sub.functions.extend(self.m.functions)
        return sub, ins, outs

    def ancestors(self, e: int, within: set) -> set:
        """Nodes in `within` that e depends on (and e)."""
        producer = {o: i for i in within for o in self.nodes[i].output}
        keep, todo = {e}, [e]
        while todo:
            for t in self.reads[todo.pop()]:
                j = producer.get(t)
                if j is not None and j not in keep:
                    keep.add(j)
                    todo.append(j)
        return keep


def rel_l2(actual, expected) -> tuple[float, float]:
    """(||actual - expected|| / ||expected||, largest absolute error); inf for NaN/Inf or a shape change
    where the expected value is finite."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        return float("inf"), float("inf")
    if not np.isfinite(a).all() and np.isfinite(e).all():
        return float("inf"), float("inf")
    err = a - e
    denom = float(np.linalg.norm(e))
    num = float(np.linalg.norm(err))
    return (num / denom if denom > 0 else (0.0 if num == 0 else float("inf"))), \
        (float(np.abs(err).max()) if err.size else 0.0)


class Search:
    """The failing-subgraph predicate on one provider, with a count of trials."""

    def __init__(self, graph: Graph, ref: dict, provider, limit: float):
        self.g, self.ref, self.p, self.limit = graph, ref, provider, limit
        self.trials = 0
        self.last: dict = {}
        self.error = ""  # the last run the provider could not do (a cut it cannot build or run)

    def fails(self, idx) -> bool:
        c = self.g.cut(list(idx), self.ref)
        if c is None or not c[2]:
            return False
        sub, ins, outs = c
        self.trials += 1
        try:
            got = self.p.run_graph(self.p.prepared(sub), {t: self.ref[t] for t in ins})
        except Exception as e:  # a cut the provider cannot build or run is not this failure
            self.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            return False
        worst = None
        for o in outs:
            rel, err = rel_l2(got[o], self.ref[o])
            if rel > self.limit and (worst is None or rel > worst["rel_l2"]):
                worst = {"output": o, "rel_l2": rel, "max_abs_err": err}
        if worst:
            self.last = worst
        return worst is not None


def reduce(m, feeds: dict, provider, trusted, limit: float = 1e-3) -> Reduction:
    """Reduce plain graph `m` failing on `provider` (a runner with prepared/run_graph) against
    `trusted` (ORT CPU, no optimisation, float32), on one sample `feeds`."""
    t0 = time.perf_counter()
    g = Graph(m)
    ref = {**feeds, **trusted.run_graph(trusted.prepared(g.all_outputs_model()), feeds)}
    s = Search(g, ref, provider, limit)
    n = len(g.nodes)
    res = Reduction("NOT_REPRODUCED", graph_nodes=n)
    if not s.fails(range(n)):
        res.reason = (f"the provider could not run the plain graph for the reduction: {s.error}" if s.error else
                      f"the plain graph on this provider agrees with the reference (ORT CPU, optimisation "
                      f"disabled): every output's rel_l2 <= {limit:g} (analysis.reduce_rel_l2) on sample 0")
        res.trials, res.seconds = s.trials, time.perf_counter() - t0
        return res
    lo, hi = 0, n - 1  # (1) shortest failing prefix [0, e]
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if s.fails(range(mid + 1)) else (mid + 1, hi)
    e = hi
    lo, hi = 0, e  # (2) latest start s with [s, e] failing
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if s.fails(range(mid, e + 1)) else (lo, mid - 1)
    keep = set(range(lo, e + 1))
    anc = g.ancestors(e, keep)  # (3) e's ancestors, then one node at a time
    if anc != keep and s.fails(anc):
        keep = anc
    for i in sorted(keep - {e}, reverse=True):
        if s.fails(keep - {i}):
            keep = keep - {i}
    s.fails(keep)  # the final worst output
    sub, ins, outs = g.cut(sorted(keep), ref)
    idx = sorted(keep)
    return Reduction("REDUCED", nodes=[g.name(i) for i in idx], op_types=[g.nodes[i].op_type for i in idx],
                     inputs=ins, outputs=outs, worst=s.last, trials=s.trials, graph_nodes=n,
                     seconds=time.perf_counter() - t0, model=sub, feeds={t: ref[t] for t in ins},
                     expected={o: ref[o] for o in outs})
