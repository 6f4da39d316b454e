"""The diff of one cell: every layer of a capture against the fp32 reference (tolerance metrics,
parity.compare) and against the fp64 run relative to the trusted baseline at the cell's dtype (the
oracle, parity.analysis.oracle), plus each layer's own error where the capture measured it. numpy only.

Verdict modes (`diff.verdict`):
  oracle     (default) a layer passes when its error vs fp64 is within k times the trusted backend's
             error at the same precision (accumulated, and its own error where measured)
  tolerance  assert_close style: |a - b| <= atol + rtol |b| against the fp32 reference
Both are computed and stored; the mode picks which one decides. A cell whose dtype has no baseline
(int8, fp8, tf32 on CPU) or whose reference has no fp64 run is judged by tolerance, and says so.

drift_origin: the first layer in execution order whose OWN error fails (what that layer, or the ops
between it and the layers before it, introduced), else the first failing layer. worst_layer: the
largest own excess, else the largest accumulated one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from parity import compare, config, store
from parity.analysis import oracle
from parity.io import read_json

OWN = "own.parquet"
BETWEEN = "between:"  # own value of the ops between leaves feeding <leaf> (compared with fp64 pre:<leaf>)
PRE = "pre:"          # fp64 input of a leaf call


@dataclass
class CellDiff:
    status: dict
    layers: list = field(default_factory=list)      # compare.LayerDiff, execution order, then plain:
    own: list = field(default_factory=list)         # own-error records (dicts), execution order
    summary: dict = field(default_factory=dict)
    mode: str = "tolerance"
    mode_reason: str = ""


def verdict_mode(p: dict, dtype: str, reference_dir: Path, baseline_dir: Path | None) -> tuple[str, str]:
    want = (p.get("diff") or {}).get("verdict", "oracle")
    if want != "oracle":
        return "tolerance", "diff.verdict: tolerance"
    if not (reference_dir / "fp64.parquet").exists():
        return "tolerance", "no fp64 reference (reference.fp64: false)"
    if not oracle.has_baseline(p["dtypes"][dtype]):
        return "tolerance", f"dtypes.{dtype}.mode {p['dtypes'][dtype].get('mode')!r} has no trusted baseline"
    st = read_json(baseline_dir / "status.json") if baseline_dir and (baseline_dir / "status.json").exists() else {}
    if st.get("status") != "OK":
        return "tolerance", f"baseline did not run ({st.get('status', 'missing')}: {st.get('reason', '')})"
    return "oracle", "diff.verdict: oracle"


def _k(p: dict, dtype: str) -> float:
    return float((p["dtypes"][dtype].get("oracle") or {}).get("k", oracle.DEFAULT_K))


def diff_cell(p: dict, model: str, dtype: str, capture_dir: Path, reference_dir: Path,
              baseline_dir: Path | None = None) -> CellDiff:
    status = read_json(capture_dir / "status.json")
    mode, why = verdict_mode(p, dtype, reference_dir, baseline_dir)
    cd = CellDiff(status, mode=mode, mode_reason=why)
    if status["status"] != "OK":
        cd.summary = {"passed": None}
        return cd
    ref = store.read_dict(reference_dir / "fp32.parquet")
    act = store.read_dict(capture_dir / "layers.parquet")
    names = _names(ref, act)
    cd.layers = _tolerance_layers(p, model, dtype, names, act, ref)
    if mode == "oracle":
        gold = store.read_dict(reference_dir / "fp64.parquet")
        base = store.read_dict(baseline_dir / "layers.parquet")
        u, k = oracle.unit_roundoff(p["dtypes"][dtype]), _k(p, dtype)
        ref_sq: dict = {}  # sum of squares of each fp64 value, shared by cell, baseline and own errors
        for d in cd.layers:
            d.oracle = _judge(d.name, store.reference_name(d.name), act, base, gold, u, k, ref_sq)
            d.passed = bool(d.oracle and d.oracle["passed"]) and not d.problem
        if (capture_dir / OWN).exists() and (baseline_dir / OWN).exists():
            cd.own = own_records(store.read_dict(capture_dir / OWN), store.read_dict(baseline_dir / OWN),
                                 gold, [d.name for d in cd.layers], u, k, ref_sq)
    cd.summary = summarize(cd)
    return cd


def _names(ref: dict, act: dict) -> list[str]:
    """Reference layers in execution order, then the shipped graph's outputs (plain:output)."""
    order = {name: t.order for (_, name), t in ref.items()}
    names = sorted(order, key=order.get)
    return names + sorted({n for _, n in act if n.startswith(store.PLAIN) and store.reference_name(n) in order})


def _tolerance_layers(p, model, dtype, names, act, ref) -> list:
    max_mismatch = float((p.get("diff") or {}).get("max_mismatch", 0.0))
    samples = sorted({s for s, _ in ref})
    layers = []
    for order, name in enumerate(names):
        rname = store.reference_name(name)
        pairs = [(s, act[s, name].array, ref[s, rname].array) for s in samples if (s, name) in act and (s, rname) in ref]
        atol, rtol, src = config.tolerance_for(p, model, dtype, rname)
        if not pairs:
            d = compare.LayerDiff(name=name, order=order, shape=[], numel=0, atol=atol, rtol=rtol,
                                  tol_source=src, passed=False, problem="not captured by this provider")
        else:
            d = compare.compare_layer(name, order, pairs, atol, rtol, src, max_mismatch)
        d.passed_tolerance = d.passed
        layers.append(d)
    return layers


def _sq(values: dict, name: str, gold: dict, gold_name: str, ref_sq: dict) -> oracle.Sq | None:
    """Squared-error sums of values[name] vs gold[gold_name] over the samples both have; None when
    the values are missing or their shape differs (the tolerance check reports that)."""
    sq = oracle.Sq()
    for s in range(len(gold)):
        g = gold.get((s, gold_name))
        if g is None:
            break
        t = values.get((s, name))
        if t is None or t.array.shape != g.array.shape:
            return None
        if (s, gold_name) not in ref_sq:
            flat = g.array.astype("float64", copy=False).ravel()
            ref_sq[s, gold_name] = float(np.dot(flat, flat))
        sq.add(t.array, g.array, ref_sq[s, gold_name])
    return sq if sq.n else None


def _judge(name: str, gold_name: str, act: dict, base: dict, gold: dict, u: float, k: float,
           ref_sq: dict) -> dict | None:
    err = _sq(act, name, gold, gold_name, ref_sq)
    if err is None:
        return None
    floor = _sq(base, gold_name, gold, gold_name, ref_sq)
    return oracle.judge(err, floor, u, k)


def own_records(own: dict, base_own: dict, gold: dict, layer_names: list[str], u: float, k: float,
                ref_sq: dict) -> list[dict]:
    """Own error of every leaf call (and of the ops between leaves feeding it), in execution order."""
    recs = []
    for name in layer_names:
        if store.is_output(name):
            continue
        for kind, own_name, gold_name in (("between", BETWEEN + name, PRE + name), ("leaf", name, name)):
            err = _sq(own, own_name, gold, gold_name, ref_sq)
            if err is None:
                continue
            floor = _sq(base_own, own_name, gold, gold_name, ref_sq)
            recs.append({"name": own_name, "layer": name, "kind": kind, **oracle.judge(err, floor, u, k)})
    return recs


def summarize(cd: CellDiff) -> dict:
    outputs = {d.name for d in cd.layers if store.is_output(d.name)}
    s = compare.summarize(cd.layers, outputs)
    s["verdict_mode"] = cd.mode
    if cd.mode != "oracle":
        return s
    judged = [d for d in cd.layers if d.oracle]
    worst = max(judged, key=lambda d: (d.oracle["excess"], -d.order), default=None)
    if worst is not None and worst.oracle["excess"] <= 1.0:
        worst = None  # no layer is worse than the trusted backend: none is "worst"
    s["worst_layer"] = worst.name if worst else None
    s["worst_excess"] = worst.oracle["excess"] if worst else None
    s["worst_tol_ratio"] = max((d.tol_ratio for d in cd.layers), default=0.0)
    if cd.own:
        failing = [r for r in cd.own if not r["passed"]]
        if failing:
            s["drift_origin"] = failing[0]["name"]
        worst_own = max(cd.own, key=lambda r: r["excess"])
        if worst_own["excess"] > 1.0:
            s["worst_layer"], s["worst_excess"] = worst_own["name"], worst_own["excess"]
        s["own_failed"] = [r["name"] for r in failing]
    return s
