"""Reduce against torch: when the exported graph itself disagrees with torch (an exporter bug), the
provider-vs-ORT reduction (parity.analysis.reduce) cannot see it, since both run the same faulty graph.
Here the graph as written (onnxruntime CPU, float32, graph optimisation disabled: each node its own
kernel) is run on torch's recorded values instead and judged by the oracle, then cut to the failing
value and handed over as a bundle whose expectation is torch's.

The check: each leaf call of the graph fed from torch's fp64 input to it (`pre:<call>`, cast to
float32), the ops between leaves fed from torch's leaf outputs (parity.models.onnx_cut, the capture's
own-error cut, run by the ORT runner's infer_own), over every sample; each own value judged like the
diff judges own error (parity.pipeline.diff.own_sums): against the fp64 run, with the cell's
baseline (torch CPU eager at the cell's dtype, own.parquet) as the floor, u = float32's unit roundoff
(the exported graph computes in float32 here whatever the cell's dtype), k and slack from
`dtypes.<d>.oracle`. The first failing value (the diff's drift origin when it is among them) is the
exporter's origin.

Two graphs, in order: layers.onnx (every leaf call a graph output), then model.onnx, the plain graph
the user ships, with the leaf outputs added back (`instrumented`: the clone nodes of layers.onnx put
on the same tensors, which the plain graph keeps by name), so a fault only in the plain graph is
located the same way. A call whose tensor the plain graph lacks is left out of its check.

The reduced graph: the origin's nodes in the cut graph (the leaf's nodes, or the ops between leaves
feeding it) back to the tensors fed from torch, the clone Identity dropped; its output is the graph's
own tensor name. Bundle (`write_bundle`): reduced.onnx (weights inline), inputs.npz (torch's input,
float32, sample 0), expected.npz (torch's fp64 output) and repro.py (numpy + onnxruntime only; exits
1 while ||actual - expected|| / ||expected|| exceeds the oracle's limit as a relative error,
k max(floor, u rms) / rms + slack, 0 when it does not); the reduce stage adds reduce.json, the
command line (`main`, which can also reduce at a value that passes: `--at`) torch_reduce.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from parity.analysis import repro
from parity.core import oracle
from parity.core.oracle import Sq
from parity.analysis.reduce import Graph, rel_l2
from parity.analysis.repro import write_npz
from parity.backends.runner import CaptureJob
from parity.backends.ort_cpu import OrtCpuRunner
from parity.core import dtypes, store
from parity.core.io import atomic_path, write_json, write_text
from parity.models import onnx_cut, onnx_weights
from parity.models.onnx_weights import with_data
from parity.models.onnx_source import topo_sorted

U_FP32 = dtypes.FP32.u
GRAPHS = ("layers.onnx", "model.onnx")


@dataclass
class TorchReduction:
    status: str                 # REDUCED | AGREES (no own value fails) | NOT_REPRODUCED (the cut passes)
    graph: str = ""             # the graph that disagrees with torch: layers.onnx | model.onnx
    reason: str = ""
    origin: str = ""            # the first failing own value: <call> or between:<call>
    failing: list = field(default_factory=list)
    record: dict = field(default_factory=dict)   # the oracle's record of the origin (all samples)
    limit: float = 0.0          # the oracle's limit as a relative L2 error
    checked: dict = field(default_factory=dict)  # graph -> number of own values judged
    nodes: list = field(default_factory=list)
    op_types: list = field(default_factory=list)
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    rel_l2: float = 0.0         # the reduced graph's error on sample 0
    max_abs_err: float = 0.0
    graph_nodes: int = 0        # nodes of the graph checked (the report's "n of N nodes")
    model: object = None        # reduced ModelProto, weights inline
    feeds: dict = field(default_factory=dict)
    expected: dict = field(default_factory=dict)


def instrumented(plain, layers):
    """The plain graph with the leaf outputs of `layers` (its graph outputs that are not model
    outputs) added back: the graph outputs of the same names, or where layers.onnx copies a value to
    name it (an Identity clone), those nodes copied onto the same tensor. Both weightless; calls
    whose tensor the plain graph does not have are left out."""
    lv = onnx_cut.analyse(layers)
    have = {t for n in plain.graph.node for t in n.output} | {i.name for i in plain.graph.input}
    m = onnx.ModelProto()
    m.CopyFrom(plain)
    outs = {o.name: o for o in layers.graph.output}
    added = []
    for c in lv.calls:
        if lv.src[c] not in have:
            continue
        m.graph.node.extend(layers.graph.node[i] for i in sorted(lv.clone[c]))  # none: c is the tensor itself
        added.append(outs[c])
    plain_outs = list(m.graph.output)
    del m.graph.output[:]
    m.graph.output.extend(added + plain_outs)
    return topo_sorted(m)


def own_values(runner, m, samples: list[tuple[dict, dict]]) -> tuple[dict, object]:
    """{(sample, name): store.Tensor} own values of graph `m` (weightless, external data in the
    runner's model directory) on `samples` [(model feeds, fp64 reference {name: array})], and the
    leaf analysis (onnx_cut.Leaves) the runner cut it by."""
    runner.own_source = m
    own = {}
    for s, (feeds, ref) in enumerate(samples):
        for i, (name, v) in enumerate(runner.infer_own(feeds, ref)):
            own[s, name] = store.Tensor(s, name, i, np.asarray(v))
    return own, runner.own_cut


def limit_of(rec: dict, k: float, slack: float, u: float = U_FP32) -> float:
    """The oracle's limit for one record as a relative L2 error: k max(floor, u rms) / rms + slack."""
    rms = rec.get("ref_rms") or 0.0
    if rms <= 0:
        return slack
    return k * max(rec.get("floor_rmse") or 0.0, u * rms) / rms + slack


def _sq(values: dict, name: str, gold: dict, gold_name: str, n: int):
    """oracle.Sq of values[name] against gold[gold_name] over samples 0..n-1; None when missing."""
    sq = Sq()
    for s in range(n):
        v, g = values.get((s, name)), gold.get((s, gold_name))
        if v is None or g is None or v.array.shape != g.array.shape:
            return None
        sq.add(v.array, g.array)
    return sq


def check(runner, m, samples, base_own: dict, gold: dict, k: float, slack: float) -> tuple[list, dict, object]:
    """(oracle records of every own value of `m` in execution order, as the diff judges own error
    (parity.pipeline.diff.own_sums): against fp64, the baseline's own error the floor; the
    own values; the leaf analysis)."""
    own, lv = own_values(runner, m, samples)
    recs = []
    for name in [n for (s, n), _ in sorted(own.items(), key=lambda kv: (kv[0][0], kv[1].order)) if s == 0]:
        gold_name = store.own_reference_name(name)
        err = _sq(own, name, gold, gold_name, len(samples))
        if err is not None:
            floor = _sq(base_own, name, gold, gold_name, len(samples))
            recs.append({"name": name, **oracle.judge(err, floor, U_FP32, k, slack)})
    return recs, own, lv


def origin_tensor(cut, name: str) -> str:
    """The tensor of the cut graph that own value `name` is made from: through the Identity nodes
    (the clone of a leaf output, the `own_between:` copy) to the value a real op produced."""
    producer = {o: n for n in cut.graph.node for o in n.output}
    t = name
    while t in producer and producer[t].op_type == "Identity" and producer[t].input[0] in producer:
        t = producer[t].input[0]
    return t


def extract(cut, tensor: str, values: dict, model_dir: Path):
    """(ModelProto of the nodes computing `tensor` from the cut graph's inputs, weights inline; its
    inputs); `values` (sample_values) holds the inputs' values. None when an input has none."""
    g = Graph(cut)
    e = next(i for i, n in enumerate(g.nodes) if tensor in n.output)
    idx = sorted(g.ancestors(e, set(range(len(g.nodes)))))
    produced = {o for i in idx for o in g.nodes[i].output}
    ins = sorted({t for i in idx for t in g.reads[i] if t not in produced and t not in g.inits})
    if any(t not in values for t in ins):
        return None
    ref = {**{t: fed(t, values[t]) for t in ins}, tensor: values[tensor]}
    sub, ins, _ = g.cut(idx, ref)
    del sub.graph.output[:]
    sub.graph.output.append(helper.make_tensor_value_info(tensor, g.types[tensor], list(np.shape(values[tensor]))))
    return with_data(sub, model_dir), ins


def sample_values(samples, s: int) -> dict:
    """Sample s's values under the cut graph's input names: the model inputs, torch's `pre:<call>`
    and its leaf outputs as `ref:<call>` (fp64, uncast: `fed` casts the few a cut reads)."""
    feeds, ref = samples[s]
    vals = dict(feeds)
    vals.update((name if store.is_pre(name) else onnx_cut.REF + name, v) for name, v in ref.items())
    return vals


def fed(name: str, v) -> np.ndarray:
    """A cut graph input's value as infer_own feeds it: torch's values (`pre:`, `ref:`) as float32."""
    return np.asarray(v, dtype=np.float32) if name.startswith((store.PRE, onnx_cut.REF)) else np.asarray(v)


def load(inputs: Path, reference_dir: Path, baseline_dir: Path) -> tuple[list, dict, dict]:
    """(samples [(feeds, fp64 {name: array})], fp64 {(s, name): Tensor}, baseline own values), read
    from the inputs stage, the reference stage (fp64.parquet) and the baseline (own.parquet)."""
    gold = store.read_dict(reference_dir / "fp64.parquet")
    feeds: dict = {}
    for t in store.read(inputs):
        feeds.setdefault(t.sample, {})[t.name] = t.array
    ref: dict = {}
    for (s, name), t in gold.items():
        ref.setdefault(s, {})[name] = t.array
    samples = [(feeds[s], ref[s]) for s in sorted(ref) if s in feeds]
    return samples, gold, store.read_dict(baseline_dir / "own.parquet")


def reduce_against_torch(model_dir: Path, samples: list, base_own: dict, gold: dict, k: float, slack: float,
                         make_runner, prefer: str | None = None, at: str | None = None) -> TorchReduction:
    """Check layers.onnx, then the instrumented plain graph, against torch (module doc); reduce the
    first that disagrees, at `prefer` (the diff's drift origin) when that value fails there, else at
    its first failing own value. `at`: reduce layers.onnx at that own value whether it fails or not
    (REDUCED when the reduced graph still mismatches, NOT_REPRODUCED when it does not).
    `make_runner()`: an ORT runner at float32 with graph optimisation disabled."""
    layers = onnx_weights.load_graph(model_dir / "layers.onnx")
    res = TorchReduction("AGREES")
    for name in GRAPHS:
        m = layers if name == GRAPHS[0] else instrumented(onnx_weights.load_graph(model_dir / name), layers)
        runner = make_runner()
        try:
            recs, _, lv = check(runner, m, samples, base_own, gold, k, slack)
        finally:
            runner.deactivate()
        res.checked[name] = len(recs)
        failing = [r["name"] for r in recs if not r["passed"]]
        if at is not None:
            if at not in {r["name"] for r in recs}:
                raise ValueError(f"--at {at!r}: no own value of that name in {name}; valid: "
                                 f"{', '.join(r['name'] for r in recs[:30])}{', ...' if len(recs) > 30 else ''}")
            pick = at
        elif failing:
            pick = prefer if prefer in failing else failing[0]
        else:
            continue
        res.graph, res.failing, res.origin = name, failing, pick
        res.record = next(r for r in recs if r["name"] == pick)
        res.limit = limit_of(res.record, k, slack)
        return _reduce(res, m, lv, samples, make_runner, model_dir)
    res.reason = (f"the exported graphs agree with torch: every own value of {' and '.join(res.checked)} "
                  f"({', '.join(str(n) for n in res.checked.values())} values) is within the oracle's limit "
                  f"(ORT CPU, float32, optimisation disabled, fed from torch's recorded values)")
    return res


def _reduce(res: TorchReduction, m, lv, samples: list, make_runner, model_dir: Path) -> TorchReduction:
    """Cut graph `m` at res.origin, run the cut on sample 0, fill in the reduction."""
    cut = onnx_cut.cut(m, lv)
    tensor = origin_tensor(cut, res.origin)
    values = sample_values(samples, 0)
    values[tensor] = np.asarray(samples[0][1][store.own_reference_name(res.origin)], dtype=np.float64)
    got = extract(cut, tensor, values, model_dir)
    if got is None:
        res.status, res.reason = "NOT_REPRODUCED", f"{res.origin}: an input of its nodes has no torch value"
        return res
    sub, ins = got
    nodes = [n for n in sub.graph.node]
    res.nodes = [n.name or n.output[0] for n in nodes]
    res.op_types = [n.op_type for n in nodes]
    res.inputs, res.outputs = ins, [tensor]
    res.feeds, res.expected, res.model = {t: fed(t, values[t]) for t in ins}, {tensor: values[tensor]}, sub
    runner = make_runner()
    try:
        out = runner.run_graph(runner.prepared(sub), res.feeds)[tensor]
    finally:
        runner.deactivate()

    res.rel_l2, res.max_abs_err = rel_l2(out, values[tensor])
    res.graph_nodes = len(m.graph.node)
    where = f"{res.graph}'s {res.origin} ({len(nodes)} node(s): {', '.join(res.op_types)})"
    if res.rel_l2 > res.limit:
        res.status = "REDUCED"
        res.reason = (f"the exported graph disagrees with torch: {where} has rel_l2 {res.rel_l2:.3g} against "
                      f"torch's fp64 values on sample 0, over the oracle's limit {res.limit:.3g} "
                      f"(excess {res.record['excess']:.3g} over every sample)")
    else:
        res.status = "NOT_REPRODUCED"
        res.reason = (f"{where} agrees with torch on sample 0: rel_l2 {res.rel_l2:.3g} <= the oracle's limit "
                      f"{res.limit:.3g}")
    return res


DOC = """Standalone repro written by parity's reduce stage for {cell}: numpy + onnxruntime only.

The exported ONNX graph disagrees with torch ({graph}, {origin}): reduced.onnx holds the nodes that
compute it ({nodes} node(s): {ops}). It runs on onnxruntime's CPUExecutionProvider with graph
optimisation disabled (each node as written), on inputs.npz (the input torch recorded for it, float32),
and each output is compared with expected.npz (torch's output, computed in float64): it fails when
||actual - expected|| / ||expected|| > {limit:.6g} (the oracle's limit: {k:g} x max(torch's own error
at the cell's precision, float32 rounding) + slack, as a relative error). Prints every output's error;
exits 1 while one fails, 0 when none does.

    python repro.py                 # reduced.onnx
    python repro.py other.onnx      # the same nodes from another export (same input and output names)
"""
SUMMARY = """\
    print(f"{model.name}: " + (f"{len(failed)} of {len(expected)} outputs mismatch torch" if failed
                                 else f"all {len(expected)} outputs match torch"))"""


def summary(cell: str, res: TorchReduction) -> dict:
    """torch_reduce.json (and reduce.json's `torch` entry): deterministic, no timings."""
    return json.loads(json.dumps({
        "cell": cell, "status": res.status, "against": "torch", "graph": res.graph, "reason": res.reason,
        "origin": res.origin, "failing": res.failing, "checked": res.checked, "oracle": res.record,
        "rel_l2_limit": res.limit, "rel_l2": res.rel_l2, "nodes": res.nodes, "op_types": res.op_types,
        "inputs": res.inputs, "outputs": res.outputs, "graph_nodes": res.graph_nodes,
        "worst": {"output": res.outputs[0], "rel_l2": res.rel_l2, "max_abs_err": res.max_abs_err} if res.outputs else {},
    }))


def write_bundle(out: Path, cell: str, res: TorchReduction, k: float) -> None:
    """reduced.onnx, inputs.npz, expected.npz and repro.py under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "reduced.onnx") as tmp:
        onnx.save(res.model, str(tmp))
    write_npz(out / "inputs.npz", res.feeds)
    write_npz(out / "expected.npz", res.expected)
    doc = DOC.format(cell=cell, graph=res.graph, origin=res.origin, nodes=len(res.nodes),
                     ops=", ".join(res.op_types), limit=res.limit, k=k)
    write_text(out / "repro.py", repro.script(
        doc, res.limit, SUMMARY, opt_level="ort.GraphOptimizationLevel.ORT_DISABLE_ALL",
        providers='["CPUExecutionProvider"]', infinite=f"a.shape != w.shape or ({repro.NOT_FINITE})",
        against=" vs torch", limit_format=".3e"))


def noopt_runner(model_dir: Path, threads: int = 0):
    """The runner that runs the exported graphs as written: ORT CPU, float32, optimisation disabled."""
    return OrtCpuRunner(CaptureJob(
        model="model", model_cfg={}, dtype="fp32", dtype_cfg={"torch": "float32"}, provider="ort_cpu_noopt",
        provider_cfg={"options": {"graph_optimization_level": "disabled"}}, model_dir=Path(model_dir),
        threads=threads))


def main(argv=None) -> int:
    """`python -m parity.analysis.torch_reduce`: the check and the bundle for one exported model."""
    ap = argparse.ArgumentParser("python -m parity.analysis.torch_reduce", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True, help="export output: layers.onnx, model.onnx, weights.bin")
    ap.add_argument("--inputs", required=True, help="the inputs stage's Parquet file")
    ap.add_argument("--reference", required=True, help="the reference stage's folder (fp64.parquet)")
    ap.add_argument("--baseline", required=True, help="the baseline's folder at the cell's dtype (own.parquet)")
    ap.add_argument("--at", help="reduce at this own value (a leaf call or between:<call>) even if it passes")
    ap.add_argument("--k", type=float, default=4.0, help="the oracle's k (dtypes.<d>.oracle.k)")
    ap.add_argument("--slack", type=float, default=0.0, help="the oracle's relative slack")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    samples, gold, base_own = load(Path(a.inputs), Path(a.reference), Path(a.baseline))
    try:
        res = reduce_against_torch(Path(a.model_dir), samples, base_own, gold, a.k, a.slack,
                                   lambda: noopt_runner(Path(a.model_dir)), at=a.at)
    except ValueError as e:
        print(f"torch_reduce: {e}", file=sys.stderr)
        return 2
    if res.model is not None:
        write_bundle(Path(a.out), Path(a.model_dir).name, res, a.k)
        write_json(Path(a.out) / "torch_reduce.json", summary(Path(a.model_dir).name, res), sort_keys=False)
    print(f"{res.status}: {res.reason}" + (f" -> {a.out}" if res.model is not None else ""))
    return 0


if __name__ == "__main__":
    from parity.core.io import exit_now

    exit_now(main())
