"""The diff of one cell (diff@model-dtype-provider): its values read (`load`: nothing of the config), the
config resolved once into the cell's Rule (parity.config.schema.rule), every layer judged by it (`judge`),
and the stage's files written (parity.pipeline.cellfiles): `diff_and_write`.

Every layer of a capture is compared against the fp32 reference (tolerance metrics,
parity.core.compare) and against the fp64 run relative to the trusted baseline at the cell's dtype (the
oracle, parity.core.oracle), plus each layer's own error where the capture measured it. numpy only.

Verdict modes (`diff.verdict`):
  oracle     (default) a layer passes when its error vs fp64 is within k times the trusted backend's
             error at the same precision (accumulated, and its own error where measured)
  tolerance  assert_close style: |a - b| <= atol + rtol |b| against the fp32 reference
Both are computed and stored; the mode picks which one decides. A cell whose dtype has no baseline
(int8, fp8, tf32 on CPU) or whose reference has no fp64 run is judged by tolerance, and says so.

drift_origin: the first layer in execution order whose OWN error fails (what that layer, or the ops
between it and the layers before it, introduced), else the first failing layer; where that layer
follows from a cancelling sum that every backend at the format computes wrong (an ONNX file's Conv or
MatMul far smaller than the products it sums), that sum (parity.analysis.cancellation). worst_layer:
the largest own excess, else the largest accumulated one.

The cell's verdict (PASS, FAIL, BASELINE, NOT_EXERCISED or the capture's status) is decided from the
summary this module makes, in one place: parity.core.verdict.decide (parity.pipeline.cellfiles).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from parity.analysis import cancellation, causes, plaindiff, sums
from parity.core import compare, dtypes, oracle, store, tolerance
from parity.core.io import read_json
from parity.pipeline import cellfiles

OWN = "own.parquet"
BETWEEN = store.BETWEEN  # own value of the ops between leaves feeding <leaf> (compared with fp64 pre:<leaf>)


@dataclass
class CellDiff:
    status: dict
    layers: list = field(default_factory=list)      # compare.LayerDiff, execution order, then plain:
    own: list = field(default_factory=list)         # own-error records (dicts), execution order
    summary: dict = field(default_factory=dict)
    mode: str = "tolerance"
    mode_reason: str = ""
    layer_causes: dict = field(default_factory=dict)  # failing layer -> cause from the cell's settings
    outputs: list = field(default_factory=list)     # the layers that are model outputs (store.is_output)
    ratios: dict = field(default_factory=dict)      # layer -> (ratio, own ratio) to the verdict's limit (oracle.ratios)


@dataclass
class Cell:
    """A cell's values as the diff reads them, nothing of the config: the capture's status, its layer
    values and the fp32 reference's (when a shape of it ran), and their layer names in order."""
    capture_dir: Path
    reference_dir: Path
    baseline_dir: Path | None
    status: dict
    ref: dict = field(default_factory=dict)
    act: dict = field(default_factory=dict)
    names: list = field(default_factory=list)


def load(capture_dir: Path, reference_dir: Path, baseline_dir: Path | None = None) -> Cell:
    """The capture's status.json, and its layers.parquet and the reference's fp32.parquet when it (or
    one of its input shapes, models.<m>.shapes) ran."""
    status = read_json(capture_dir / "status.json")
    cell = Cell(capture_dir, reference_dir, baseline_dir, status)
    ran = [status] + list((status.get("shapes") or {}).values())
    if any(s.get("status") == "OK" for s in ran):
        cell.ref = store.read_dict(reference_dir / "fp32.parquet")
        cell.act = store.read_dict(capture_dir / "layers.parquet")
        cell.names = _names(cell.ref, cell.act)
    return cell


def diff_and_write(rule: tolerance.Rule, key: str, capture: Path, reference: Path, baseline: Path | None,
                   model_dir: Path | None, out: Path) -> str:
    """Diff the cell `key` by its `rule` (parity.config.schema.rule: the config, resolved once), write
    metrics.json, layers.json and layers.csv under `out`; the summary line."""
    lj = model_dir / "layers.json" if model_dir else None
    layers_json = read_json(lj) if lj and lj.exists() else {}
    cell = load(capture, reference, baseline)  # the values: nothing of the config
    shapes = judge(rule, cell)  # (label, CellDiff) per input shape
    for _, cd in shapes:  # only the shipped graph fails: the nodes where it differs from layers.onnx
        plaindiff.locate(cd, model_dir)
    line = cellfiles.write(shapes, layers_json, key, out)  # as judged: nothing of the config
    return f"diff@{key}: {line}"


def verdict_mode(rule: tolerance.Rule, reference_dir: Path, baseline_dir: Path | None) -> tuple[str, str]:
    if rule.verdict != "oracle":
        return "tolerance", "diff.verdict: tolerance"
    if not (reference_dir / "fp64.parquet").exists():
        if not rule.fp64:
            return "tolerance", "no fp64 reference (reference.fp64: false)"
        f32 = reference_dir / "fp32.parquet"  # the reference stage records why it wrote no golden run
        why = store.read_metadata(f32).get("no_fp64") if f32.exists() else None
        return "tolerance", f"no fp64 reference: {why or 'reference.fp64 is true but the reference wrote none'}"
    # what the fp64 file is (an ONNX file's reference: parity.pipeline.onnx_reference): a note on nodes
    # that ran in float32, or the fp32 yardstick, which judges reduced-precision cells only
    gmd = store.read_metadata(reference_dir / "fp64.parquet")
    if gmd.get("yardstick") == "fp32" and rule.reduced is None:
        return "tolerance", f"no fp64 reference: {gmd.get('note', 'an fp32 yardstick')}; an fp32 cell is judged by tolerance"
    if not rule.baseline:
        return "tolerance", f"dtypes.{rule.dtype}.mode {rule.precision!r} has no trusted baseline"
    st = read_json(baseline_dir / "status.json") if baseline_dir and (baseline_dir / "status.json").exists() else {}
    if st.get("status") != "OK":
        return "tolerance", f"baseline did not run ({st.get('status', 'missing')}: {st.get('reason', '')})"
    return "oracle", "diff.verdict: oracle" + (f" ({gmd['note']})" if gmd.get("note") else "")


def judge(rule: tolerance.Rule, cell: Cell) -> list[tuple[str | None, CellDiff]]:
    """(label, CellDiff) per input shape (the rule's sample sets, models.<m>.shapes), each shape's
    samples judged on their own by its own capture status; [(None, CellDiff)] for a model without."""
    per = cell.status.get("shapes") or {}
    return [(lab, diff_cell(rule, cell, idx, {**cell.status, **per.get(lab, {})} if lab is not None else None))
            for lab, idx in rule.sample_sets or ((None, None),)]


def diff_cell(rule: tolerance.Rule, cell: Cell, samples: range | None = None, status: dict | None = None) -> CellDiff:
    """The diff of `cell` judged by `rule`. `samples`: only these samples, renumbered from 0 (one shape's
    sample set), judged by `status` (that shape's capture status) instead of status.json's. The rule
    reaches the computations it needs in order (compare, oracle, causes), each once."""
    status = status or cell.status
    read_dict = store.read_dict if samples is None else lambda path: _only(store.read_dict(path), samples)
    mode, why = verdict_mode(rule, cell.reference_dir, cell.baseline_dir)
    quant = quant_oracle(cell.capture_dir) if rule.verdict == "oracle" and status["status"] == "OK" else None
    if quant is not None:  # an int4/int8 cell: judged against its quantised oracle (parity.pipeline.quant_reference)
        mode, why = "oracle", f"diff.verdict: oracle, against the quantised oracle ({quant['scheme']}: {QUANT_WHY})"
    cd = CellDiff(status, mode=mode, mode_reason=why)
    if status["status"] != "OK":
        cd.summary = {"passed": None}
        return cd
    ref, act = (cell.ref, cell.act) if samples is None else (_only(cell.ref, samples), _only(cell.act, samples))
    names = _names(ref, act)
    raw = _oracle_sums(cell, names, act, samples, read_dict, quant is not None) if mode == "oracle" else None
    cd.layers = _tolerance_layers(rule, names, act, ref)
    gold = own = None
    if raw is not None:  # the oracle verdict of every layer and own value from its raw sums
        sq, own_sq, gold, own = raw
        u, k, slack = rule.limits
        for d in cd.layers:
            d.oracle = oracle.judge(sq[d.name][0], sq[d.name][1], u, k, slack) if sq[d.name] else None
            d.passed = bool(d.oracle and d.oracle["passed"]) and not d.problem
        cd.own = [{**rec, **oracle.judge(err, floor, u, k, slack)} for rec, err, floor in own_sq]
    cd.summary = summarize(cd)
    cd.ratios = oracle.ratios(cd.layers, cd.own, cd.mode, rule.limits.k)  # layers.csv draws them
    cd.summary["worst_ratio"] = oracle.worst_ratio(cd.layers, cd.own, cd.mode, rule.limits.k,
                                                   cd.summary.get("worst_tol_ratio"))
    prec = oracle.precision(cd.layers, rule.reduced, cd.mode)  # did the layers round to its precision
    if prec is not None:
        cd.summary["precision"] = prec
    itself = oracle.baseline_self(cd.mode, cd.status.get("provider"), _baseline_provider(cell), rule.dtype)
    if itself:  # the cell is the oracle's baseline judged against itself
        cd.summary["baseline"] = itself
    if cd.summary.get("drift_origin"):
        if mode == "oracle" and gold is None:  # explaining the origin needs the values themselves
            gold = read_dict(cell.capture_dir / QUANT_GOLD if quant else cell.reference_dir / "fp64.parquet")
            own = read_dict(cell.capture_dir / OWN) if cd.own else None
        cd.summary["drift_origin_cause"] = causes.origin_cause(
            cd, act, ref, gold, own, lambda rec: oracle.limit_rel(rec, *rule.limits), rule.fmt)
        cancellation.refine(cd, cell.reference_dir, rule.fmt, rule.limits)  # a cancelling sum it follows from
    settings_causes(cd)
    if quant is not None:
        quant_summary(cd, quant)
    return cd


# The quantised oracle (issue 35 item 3), written by an int4/int8 cell's capture: the fp64 run of the
# model with parity's own quantisation of its weights (and activations per the scheme), and its fp32 run
QUANT_GOLD, QUANT_FLOOR, QUANT_INFO = "quant_fp64.parquet", "quant_fp32.parquet", "quant_oracle.json"
QUANT_WHY = ("fp64 of the model with parity's quantisation of the reference's weights; yardstick: the same "
             "model in fp32")


def quant_oracle(capture_dir: Path) -> dict | None:
    """quant_oracle.json of a capture that wrote a quantised oracle, else None."""
    ok = all((capture_dir / f).exists() for f in (QUANT_GOLD, QUANT_FLOOR, QUANT_INFO))
    return read_json(capture_dir / QUANT_INFO) if ok else None


def quant_summary(cd: CellDiff, quant: dict) -> None:
    """The quantisation's expected cost, apart from the verdict: each layer's rel_l2 of the oracle vs
    the fp32 reference (its oracle record's `quant_cost`) and the cell's (summary `quant`), with the
    packed weights that differ from parity's quantisation (named by layer)."""
    cost = quant.get("cost") or {}
    for d in cd.layers:
        c = cost.get(store.reference_name(d.name))
        if d.oracle is not None and c is not None:
            d.oracle["quant_cost"] = c
    prec = cd.summary.get("precision")
    if prec is not None:  # the int4 rounding is in the oracle itself: its cost shows it, not the deviation
        rounded = sum(c >= prec["u"] * oracle.SHOWS for c in cost.values())
        prec.update(rounded=rounded, exercised=rounded > 0, largest_rel_l2=max(cost.values(), default=0.0),
                    evidence=f"{rounded} of {len(cost)} layers of the quantised oracle show {prec['format']} rounding "
                             f"(rel_l2 vs the fp32 reference >= u/16 = {prec['u'] * oracle.SHOWS:.2g}; largest "
                             f"{max(cost.values(), default=0.0):.2g})")
    differ = [w["layer"] for w in quant.get("weights") or [] if not w.get("matches", False)]
    cd.summary["quant"] = {"scheme": quant["scheme"], "options": quant.get("options"),
                           "cost_output": quant.get("cost_output"), "cost_max": max(cost.values(), default=None),
                           "graph_vs_reference": quant.get("graph_vs_reference"), "weights_differ": differ}


def _baseline_provider(cell: Cell) -> str | None:
    st = cell.baseline_dir / "status.json" if cell.baseline_dir else None
    return read_json(st).get("provider") if st and st.exists() else None


def _oracle_sums(cell: Cell, names: list[str], act: dict, samples: range | None, read_dict, quant: bool = False):
    """The oracle's raw statistics, nothing of the rule: ({layer: (err, floor) or None}, [(own record,
    err, floor)], the fp64 and own values when read). From the producers' sums (oracle_sums.json:
    no fp64 or own.parquet read), else from the arrays. `quant`: against the capture's quantised
    oracle and its fp32 run (quant_oracle), no own error."""
    cs, bs = sums.load(cell.capture_dir), sums.load(cell.baseline_dir)
    if quant:
        gold, base = read_dict(cell.capture_dir / QUANT_GOLD), read_dict(cell.capture_dir / QUANT_FLOOR)
        ref_sq: dict = {}
        sq = {}
        for name in names:
            gname = store.reference_name(name)
            err = _sq(act, name, gold, gname, ref_sq)
            sq[name] = (err, _sq(base, gname, gold, gname, ref_sq)) if err is not None else None
        return sq, [], gold, None
    if cs is not None and bs is not None:
        sq = {}
        for name in names:
            gname = store.reference_name(name)
            err = sums.sq(cs, "layers", name, gname, samples)
            sq[name] = (err, sums.sq(bs, "layers", gname, gname, samples)) if err else None
        own_sq = []
        if cs.get("own") is not None and bs.get("own") is not None:
            for name in sums.own_names(cs, samples):
                gname = store.own_reference_name(name)
                err = sums.sq(cs, "own", name, gname, samples)
                if err is not None:
                    own_sq.append((_own_record(name), err, sums.sq(bs, "own", name, gname, samples)))
        return sq, own_sq, None, None
    gold = read_dict(cell.reference_dir / "fp64.parquet")
    base = read_dict(cell.baseline_dir / "layers.parquet")
    ref_sq: dict = {}  # (sum of squares, max |x|) of each fp64 value, shared by cell, baseline and own errors
    sq = {}
    for name in names:
        gname = store.reference_name(name)
        err = _sq(act, name, gold, gname, ref_sq)
        sq[name] = (err, _sq(base, gname, gold, gname, ref_sq)) if err is not None else None
    own = own_sq = None
    if (cell.capture_dir / OWN).exists() and (cell.baseline_dir / OWN).exists():
        own = read_dict(cell.capture_dir / OWN)
        own_sq = own_sums(own, read_dict(cell.baseline_dir / OWN), gold, ref_sq)
    return sq, own_sq or [], gold, own


def _own_record(name: str) -> dict:
    kind = "between" if name.startswith(BETWEEN) else "leaf"
    return {"name": name, "layer": name[len(BETWEEN):] if kind == "between" else name, "kind": kind}


def _only(d: dict, samples: range) -> dict:
    """The entries of `samples`, renumbered from 0."""
    return {(k - samples.start, n): t for (k, n), t in d.items() if k in samples}


def settings_causes(cd: CellDiff) -> None:
    """Causes that the capture's settings explain (causes.int8_saturation; causes.param_range: a
    parameter the layer reads that the cell's format cannot hold): every failing layer gets one, and it
    replaces the drift origin's numeric cause (which stays in its evidence), except a parameter
    underflow where the values name a pattern of their own (`pattern_kept`)."""
    settings = cd.status.get("settings")
    origin = cd.summary.get("drift_origin")
    for d in cd.layers:
        if d.passed:
            continue
        numeric = cd.summary.get("drift_origin_cause") if d.name == origin else None
        c = causes.int8_saturation(settings, d.as_dict(), numeric) or causes.param_range(settings, d.name, numeric)
        if c is not None:
            cd.layer_causes[d.name] = c.as_dict()
    if origin and origin not in cd.layer_causes:  # an own value (between:<leaf>) is no layer of its own
        c = causes.param_range(settings, origin, cd.summary.get("drift_origin_cause"))
        if c is not None:
            cd.layer_causes[origin] = c.as_dict()
    if origin in cd.layer_causes:
        cd.summary["drift_origin_cause"] = pattern_kept(cd.summary.get("drift_origin_cause"), cd.layer_causes[origin])


UNEXPLAINED = (None, "unknown", "precision")  # numeric labels that name no pattern of the values
NEGLIGIBLE = 1e-3  # flushed parameters that together weigh less than this share of the largest value


def pattern_kept(numeric: dict | None, setting: dict) -> dict:
    """The origin's cause: the settings' one, unless it is an underflow (parameters below the format's
    smallest subnormal, flushed to 0) of values too small to matter (together under NEGLIGIBLE of the
    parameter's largest |value|: each is below half the smallest subnormal) while the values name a
    pattern (a scale, an offset, a channel, an op substituted...): the values' cause stays, the underflow
    in its evidence. Issue 35's fault table: +2e-2 on a conv's output at fp16 was labelled `range` by 2
    of its 2.36 M weights below 5.96e-08, while its values said offset +0.02."""
    ev = setting.get("evidence") or {}
    if setting.get("label") != "range" or ev.get("kind") != "underflow" or not numeric \
            or numeric.get("label") in UNEXPLAINED:
        return setting
    for e in ev.get("params") or []:
        flushed = e.get("under", 0) * dtypes.subnormal_min(dtypes.facts(e["format"])) / 2
        if e.get("over") or not e.get("max_abs") or flushed >= NEGLIGIBLE * e["max_abs"]:
            return setting
    fmt = (ev.get("params") or [{}])[0].get("format", "the format")
    return {**numeric, "summary": f"{numeric.get('summary')}; the layer also reads parameters below {fmt}'s smallest "
                                  f"subnormal (evidence.range), too few and too small to make this pattern",
            "evidence": {**(numeric.get("evidence") or {}), "range": setting.get("summary")}}


def _names(ref: dict, act: dict) -> list[str]:
    """Reference layers in execution order, then the shipped graph's outputs (plain:output)."""
    order = {name: t.order for (_, name), t in ref.items()}
    names = sorted(order, key=order.get)
    return names + sorted({n for _, n in act if n.startswith(store.PLAIN) and store.reference_name(n) in order})


def _tolerance_layers(rule: tolerance.Rule, names: list[str], act: dict, ref: dict) -> list:
    max_mismatch = rule.max_mismatch
    samples = sorted({s for s, _ in ref})
    layers = []
    for order, name in enumerate(names):
        rname = store.reference_name(name)
        pairs = [(s, act[s, name].array, ref[s, rname].array) for s in samples if (s, name) in act and (s, rname) in ref]
        atol, rtol, src = rule.tolerances[rname]
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
            ref_sq[s, gold_name] = compare.sum_sq_max(g.array)
        sq.add(t.array, g.array, *ref_sq[s, gold_name])
    return sq if sq.n else None


def own_sums(own: dict, base_own: dict, gold: dict, ref_sq: dict) -> list[tuple[dict, oracle.Sq, oracle.Sq | None]]:
    """Own error of every leaf call (`<leaf>`) and of the ops between leaves feeding it
    (`between:<leaf>`), in execution order (own.parquet's order): (record, err, floor) sums, each
    judged like a layer."""
    out = []
    names = [n for (s, n), _ in sorted(own.items(), key=lambda kv: (kv[0][0], kv[1].order)) if s == 0]
    for name in names:
        gold_name = store.own_reference_name(name)
        err = _sq(own, name, gold, gold_name, ref_sq)
        if err is not None:
            out.append((_own_record(name), err, _sq(base_own, name, gold, gold_name, ref_sq)))
    return out


def summarize(cd: CellDiff) -> dict:
    cd.outputs = [d for d in cd.layers if store.is_output(d.name)]
    s = compare.summarize(cd.layers, {d.name for d in cd.outputs})
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
        if failing:  # a layer that introduces more error than the trusted backend fails the cell
            s["drift_origin"] = failing[0]["name"]
            s["passed"] = False
        worst_own = max(cd.own, key=lambda r: r["excess"])
        if worst_own["excess"] > 1.0:
            s["worst_layer"], s["worst_excess"] = worst_own["name"], worst_own["excess"]
        s["own_failed"] = [r["name"] for r in failing]
    notes = ([f"{d.name}: {d.oracle['note']}" for d in judged if d.oracle.get("note")]
             + [f"{r['name']} (own error): {r['note']}" for r in cd.own if r.get("note")])
    if notes:  # passed by the scale floor, or judged without a broken trusted backend (oracle.judge)
        s["notes"] = notes
    return s
