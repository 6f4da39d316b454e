"""Mixed-precision plan for one cell (plan@model-dtype-provider): which leaf modules to keep in
float32 so that the model's output at the cell's reduced precision passes a target, confirmed by a
real run of the mixed model on the cell's backend.

Target: every model output element satisfies |a - b| <= atol + rtol * |b| against the fp32 torch
reference (the reference stage's values), on every input sample; (atol, rtol) =
`analysis.plan_target` when set, else `dtypes.<d>.tol` (what the user accepts at that precision).

Steps, each a real run of the plain graph on the cell's backend through Runner.mixed (the backend
applies the precision: ORT float16 conversion with a node block list, onnxruntime.quantization with
nodes_to_exclude, torch modules cast per module):
1. full     the whole model at the cell's precision. If it passes, the plan keeps nothing.
2. fp32     the whole model at float32 on the same backend. If even that misses the target, no plan
            can pass: said so, no search.
3. sensitivity  for each candidate (a leaf module the model calls; on ONNX backends, the nodes the
            exporter attributed to it through the `pkg.torch.onnx.name_scopes` node metadata), only
            that leaf at the cell's precision, the rest float32, on the first sample. Ranked by the
            output's rel_l2 (tol_ratio, the worst single element, is shown beside it: noisier).
            Candidates are leaves, or blocks (analysis.plan_group: a block is the module path up to
            its first index, `model.layers.3`; a leaf outside any, `lm_head`, is a block of its own):
            each candidate is one fresh session of a mostly float32 graph (~10-25 s on a 1.1B model
            here), so `auto` groups by block above AUTO_BLOCKS_ABOVE leaves (llama_1b: 155 leaves
            holding weight MatMuls -> 23 blocks).
4. greedy   from the full model, move leaves to float32 in decreasing sensitivity until every sample
            passes (at most analysis.max_keep), then drop again, least sensitive first, any kept leaf
            the pass does not need. Not reached: the plan says how far the output still is.
5. confirm  a fresh runner applies the keep-list (as keep.yaml states it) and runs every sample.
Latency (median of the plain graph: fp32, full, mixed) is measured, so it goes to the timing file,
never to plan.json, whose bytes depend only on the inputs.
"""

from __future__ import annotations

import ast
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import yaml

from parity.core import compare, store
from parity.config import params as config
from parity.config import schema
from parity.backends import CaptureJob, load_runner
from parity.backends.capture_driver import latency_stats
from parity.backends.runner import error_reason
from parity.core.io import read_json
from parity.analysis import plan_cost

SCOPES = "pkg.torch.onnx.name_scopes"  # dynamo exporter node metadata: the module path of each node
MODULE_PREFIX = "model."  # the LayerRecorder wraps the model as `model`: scopes read model.layer1.0.conv1
PLAN_DTYPES_HINT = "analysis.plan: true plans the selected reduced-precision dtypes (parity.config.params.plan_dtypes)"
GROUPS = ("auto", "leaf", "block")  # analysis.plan_group
AUTO_BLOCKS_ABOVE = 32  # auto: candidates are blocks when there are more leaf candidates than this


@dataclass
class Target:
    atol: float
    rtol: float
    source: str

    def describe(self) -> dict:
        return {"atol": self.atol, "rtol": self.rtol, "source": self.source,
                "rule": "every model output element, every sample: |a - b| <= atol + rtol * |b|, "
                        "b = the fp32 torch reference (reference stage)"}


def target(p: dict, dtype: str) -> Target:
    """analysis.plan_target if set, else the dtype's own tolerance."""
    t = schema.of(p).analysis.plan_target
    if t:
        return Target(float(t.atol), float(t.rtol), "analysis.plan_target")
    t = p["dtypes"][dtype]["tol"]
    return Target(float(t["atol"]), float(t["rtol"]), f"dtypes.{dtype}.tol")


def output_error(outs: list[dict], refs: list[dict], t: Target) -> dict:
    """The target check over every sample and model output: tol_ratio (max |a-b| / (atol + rtol|b|),
    <= 1 passes), rel_l2 over everything, max_abs, elements outside."""
    sq_diff = sq_ref = 0.0
    ratio = max_abs = 0.0
    n_out = numel = 0
    for got, want in zip(outs, refs):
        for name, b in want.items():
            if name not in got:
                raise ValueError(f"the backend's plain graph has no output '{name}' (it gave {sorted(got)})")
            m = compare.compare_arrays(got[name], b, t.atol, t.rtol)
            sq_diff, sq_ref = sq_diff + m["sq_diff"], sq_ref + m["sq_ref"]
            ratio, max_abs = max(ratio, m["tol_ratio"]), max(max_abs, m["max_abs"])
            n_out, numel = n_out + m["n_outside"], numel + m["numel"]
    rel = math.sqrt(sq_diff / sq_ref) if sq_ref > 0 else (0.0 if sq_diff == 0 else math.inf)
    return {"tol_ratio": ratio, "rel_l2": rel, "max_abs": max_abs, "n_outside": n_out, "numel": numel,
            "passes": bool(ratio <= 1.0)}


def leaves(model_dir: Path) -> list[str]:
    """Leaf modules the model calls, in first-call order (export's layers.json: `fc1`, `relu#1`,
    `name:1` are calls and extra outputs of the leaves `fc1`, `relu`, `name`)."""
    out: list[str] = []
    for entry in read_json(model_dir / "layers.json")["layers"]:
        name = entry["name"].split("#")[0].split(":")[0]
        if name not in out:
            out.append(name)
    return out


def onnx_units(model_path: Path, names: list[str]) -> dict[str, list[str]]:
    """Candidate -> node names of `model_path`, from the dynamo exporter's name_scopes metadata: a
    leaf module gets the nodes whose deepest module scope is that leaf; the ops between leaves
    (residual adds, flatten) are candidates of their own, named `<op> in <module>` (`add_3 in
    layer2.1`, `view in model`), else they would stay at the reduced precision in every plan."""
    m = onnx.load(str(model_path), load_external_data=False)
    known = set(names)
    units: dict[str, list[str]] = {n: [] for n in names}
    for node in m.graph.node:
        scopes = next((p.value for p in node.metadata_props if p.key == SCOPES), None)
        if scopes is None:
            continue
        scopes = ast.literal_eval(scopes)
        mods = [s[len(MODULE_PREFIX):] for s in scopes if s.startswith(MODULE_PREFIX)]
        leaf = next((s for s in reversed(mods) if s in known), None)
        if leaf is None and scopes and not scopes[-1].startswith(MODULE_PREFIX):
            leaf = f"{scopes[-1]} in {mods[-1] if mods else 'model'}"
            units.setdefault(leaf, [])
        if leaf is not None:
            units[leaf].append(node.name)
    return units


def units_for(items: str, model_dir: Path) -> dict[str, list[str]]:
    """Candidate leaves -> what Runner.mixed takes for them (runner.plan_items)."""
    names = leaves(model_dir)
    if items == "modules":
        return {n: [n] for n in names}
    if items == "onnx_nodes":
        return onnx_units(model_dir / "model.onnx", names)
    raise ValueError(f"unknown plan_items '{items}' (valid: modules, onnx_nodes)")


def block_of(leaf: str) -> str:
    """The block a leaf belongs to: its module path up to the first index (one item of a ModuleList
    or Sequential: `model.layers.3.mlp.down_proj` -> `model.layers.3`, `layer2.1.conv1` -> `layer2.1`);
    an op between leaves (`add_3 in layer2.1`) goes with its module; a leaf under no index
    (`lm_head`, `model.embed_tokens`) is a block of its own."""
    path = leaf.split(" in ", 1)[1] if " in " in leaf else leaf
    parts = path.split(".")
    i = next((i for i, s in enumerate(parts) if s.isdigit()), None)
    return leaf if i is None else ".".join(parts[:i + 1])


def grouped(units: dict[str, list[str]], how: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(candidates -> items, candidates -> the leaves each holds) for analysis.plan_group `how`:
    leaf (as given), block (block_of, in first-call order) or auto (block above AUTO_BLOCKS_ABOVE)."""
    if how not in GROUPS:
        raise ValueError(f"analysis.plan_group: unknown '{how}' (valid: {', '.join(GROUPS)})")
    if how == "leaf" or how == "auto" and len(units) <= AUTO_BLOCKS_ABOVE:
        return dict(units), {k: [k] for k in units}
    items: dict[str, list[str]] = {}
    members: dict[str, list[str]] = {}
    for leaf, its in units.items():
        b = block_of(leaf)
        have = items.setdefault(b, [])
        have.extend(i for i in its if i not in have)
        members.setdefault(b, []).append(leaf)
    return items, members


@dataclass
class Evaluator:
    """One runner, many mixed models: each run() prepares one (Runner.mixed) and runs `feeds`."""
    runner: object
    units: dict[str, list[str]]
    feeds: list[dict]
    refs: list[dict]
    target: Target
    runs: int = 0
    seconds: dict = field(default_factory=dict)
    outs: list = field(default_factory=list)
    quant: object = None  # plan_cost.QuantModel of a quantised cell: each candidate's expected cost

    def cost(self, items: list[str], n_samples: int | None = None) -> dict:
        """Parity's own quantisation of `items` (plan_cost): the output's rel_l2 vs the fp32 reference
        (the expected cost) and the provider's deviation from it (against the last run's outputs)."""
        t0 = time.perf_counter()
        feeds = self.feeds[:n_samples] if n_samples else self.feeds
        q = self.quant.run(items, feeds)
        dt = time.perf_counter() - t0
        self.seconds["quant_cost"] = self.seconds.get("quant_cost", 0.0) + dt
        r = output_error(q, self.refs[:len(feeds)], self.target)
        out = {"quant_cost": r["rel_l2"], "quant_tol_ratio": r["tol_ratio"], "deviation": plan_cost.rel_l2(self.outs, q)}
        print(f"plan: parity's quantisation of {len(items)} nodes: expected cost rel_l2 {out['quant_cost']:.3g}, "
              f"the provider {out['deviation']:.3g} from it, {dt:.1f}s", file=sys.stderr, flush=True)
        return out

    def run(self, reduced: bool, flip: list[str], n_samples: int | None = None, phase: str = "") -> dict:
        t0 = time.perf_counter()
        self.runner.mixed(reduced, [i for leaf in flip for i in self.units[leaf]])
        feeds = self.feeds[:n_samples] if n_samples else self.feeds
        outs = [dict(self.runner.infer_plain(f)) for f in feeds]
        self.outs = outs  # the last run's outputs: the quantisation cost compares them with parity's
        self.runs += 1
        dt = time.perf_counter() - t0
        self.seconds[phase] = self.seconds.get(phase, 0.0) + dt
        r = output_error(outs, self.refs[:len(feeds)], self.target)
        names = ", ".join(flip) if len(flip) <= 3 else f"{len(flip)} candidates"
        what = f"{names or 'none'} in float32" if reduced else f"{names or 'none'} reduced"
        print(f"plan: run {self.runs} {phase} ({what}): tol_ratio {r['tol_ratio']:.3g}, rel_l2 {r['rel_l2']:.3g},"
              f" {dt:.1f}s", file=sys.stderr, flush=True)  # progress: a run is one session (~15 s-3 min at 1B)
        return r

    def latency(self, warmup: int, repeats: int) -> dict:
        """Median etc. of the plain graph as last prepared, on the first sample."""
        for _ in range(warmup):
            self.runner.infer_plain(self.feeds[0])
        ms = []
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            self.runner.infer_plain(self.feeds[0])
            ms.append((time.perf_counter_ns() - t0) / 1e6)
        return latency_stats(ms)


def sensitivity(ev: Evaluator) -> list[dict]:
    """Only one leaf at the cell's precision at a time (first sample), most costly first: by the
    quantisation's expected cost where parity computes it (ev.quant: int4, int8_dynamic; the
    provider's rel_l2 beside it, and whether it exceeds that cost), else by the provider's rel_l2."""
    rows = []
    for leaf, items in ev.units.items():
        r = ev.run(False, [leaf], n_samples=1, phase="sensitivity")
        row = {"layer": leaf, "rel_l2": r["rel_l2"], "tol_ratio": r["tol_ratio"],
               "max_abs": r["max_abs"], "n_items": len(items)}
        if ev.quant is not None:
            row.update(ev.cost(items, n_samples=1))
            row["exceeds_cost"] = plan_cost.flagged(row["quant_cost"], row["deviation"])
        rows.append(row)
    by = "quant_cost" if ev.quant is not None else "rel_l2"
    return sorted(rows, key=lambda r: (-r[by], r["layer"]))


def greedy(ev: Evaluator, ranking: list[str], max_keep: int) -> tuple[list[str], dict, list[dict]]:
    """Keep leaves in fp32 in ranking order until the output passes; then drop unneeded ones.
    Returns (keep, the last result, the steps taken)."""
    keep: list[str] = []
    steps, last = [], None
    for leaf in ranking[:max_keep]:
        keep.append(leaf)
        last = ev.run(True, keep, phase="greedy")
        steps.append({"step": "add", "layer": leaf, "kept": len(keep), "tol_ratio": last["tol_ratio"],
                      "rel_l2": last["rel_l2"], "passes": last["passes"]})
        if last["passes"]:
            break
    if last is None or not last["passes"]:
        return keep, last, steps
    for leaf in list(reversed(keep))[1:] if len(keep) > 1 else []:  # the last one added was needed
        trial = [k for k in keep if k != leaf]
        r = ev.run(True, trial, phase="prune")
        steps.append({"step": "drop", "layer": leaf, "kept": len(trial), "tol_ratio": r["tol_ratio"],
                      "rel_l2": r["rel_l2"], "passes": r["passes"]})
        if r["passes"]:
            keep, last = trial, r
    return keep, last, steps


@dataclass
class Cell:
    """What the plan stage passes in (paths from dvc.yaml)."""
    model: str
    dtype: str
    provider: str
    model_dir: Path
    inputs: Path
    reference: Path
    calibration: Path | None = None


def _feeds(path: Path) -> list[dict]:
    by_sample: dict[int, dict] = {}
    for t in store.read(path):
        by_sample.setdefault(t.sample, {})[t.name] = t.array
    return [by_sample[k] for k in sorted(by_sample)]


def _refs(path: Path) -> list[dict]:
    by_sample: dict[int, dict] = {}
    for t in store.read(path):
        if store.is_output(t.name):
            by_sample.setdefault(t.sample, {})[t.name] = t.array
    return [by_sample[k] for k in sorted(by_sample)]


def _job(p: dict, c: Cell) -> CaptureJob:
    return CaptureJob(model=c.model, model_cfg=p["models"][c.model], dtype=c.dtype,
                      dtype_cfg=p["dtypes"][c.dtype], provider=c.provider, provider_cfg=p["providers"][c.provider],
                      model_dir=Path(c.model_dir), seed=schema.of(p).seed,
                      threads=schema.of(p).capture.threads, calibration=c.calibration)


def _not_run(p: dict, c: Cell) -> tuple[str, str] | None:
    """(status, reason) when this cell cannot get a plan, else None."""
    pc = p["providers"][c.provider]
    if c.dtype not in config.plan_dtypes(p):
        return "UNSUPPORTED", (f"dtype {c.dtype} is not a reduced precision a plan applies to "
                               f"({PLAN_DTYPES_HINT})")
    why = config.unsupported_dtype(c.provider, pc, c.dtype)
    if why:
        return "UNSUPPORTED", why
    try:
        cls = load_runner(pc["runner"])
        why = cls.availability(_job(p, c))
    except Exception as e:  # an availability probe that raises means: not available
        return "UNAVAILABLE", error_reason(e)
    if why:
        return "UNAVAILABLE", why
    if cls.plan_items is None:
        return "UNAVAILABLE", (f"{cls.__name__} cannot run a mixed-precision model (no Runner.mixed; "
                               f"providers.{c.provider}.runner)")
    return None


def _confirm(cls, job: CaptureJob, units: dict, keep: list[str], feeds, refs, t: Target,
             warmup: int, repeats: int) -> tuple[dict, dict, float]:
    """A fresh runner applies the keep-list and runs every sample: (output error, latency, seconds)."""
    t0 = time.perf_counter()
    runner = cls(job)
    try:
        ev = Evaluator(runner, units, feeds, refs, t)
        r = ev.run(True, keep, phase="confirm")
        return r, ev.latency(warmup, repeats), time.perf_counter() - t0
    finally:
        runner.deactivate()


def _summary(outcome: str, plan: dict, n: int, max_keep: int) -> str:
    o, tgt = plan["outputs"], plan["target"]
    what = "blocks" if plan.get("group") == "block" else "leaves"
    rule = f"target {tgt['source']} (atol={tgt['atol']:g}, rtol={tgt['rtol']:g})"
    if outcome == "full_passes":
        return f"the full {plan['dtype']} model passes ({rule}, tol_ratio {o['full']['tol_ratio']:.3g}): keep nothing"
    if outcome == "fp32_fails":
        return (f"float32 on {plan['provider']} misses the {rule} already (tol_ratio {o['fp32']['tol_ratio']:.3g}):"
                f" no plan can pass; loosen analysis.plan_target")
    keep, m = plan["keep"], o["mixed"]
    change = f"output tol_ratio {o['full']['tol_ratio']:.3g} -> {m['tol_ratio']:.3g}, rel_l2 " \
             f"{o['full']['rel_l2']:.3g} -> {m['rel_l2']:.3g} ({rule})"
    if outcome == "not_reached":
        return (f"not reached with max_keep={max_keep} of {n} {what} in float32: {change}, still "
                f"{m['tol_ratio']:.3g}x the limit; raise analysis.max_keep or loosen analysis.plan_target")
    verdict = "confirmed" if m["passes"] else "NOT confirmed by the fresh run"
    return f"keep {len(keep)} of {n} {what} in float32 ({', '.join(keep)}): {change}, {verdict}"


def _cost_summary(q: dict | None) -> str:
    """The summary's sentence on the quantisation's expected cost (empty for a cell without one)."""
    if not q:
        return ""
    s = (f"; expected {q['scheme']} cost at the output rel_l2 {q['output']:.3g} (parity's own quantisation) of the "
         f"provider's {q['provider_rel_l2']:.3g}, the provider {q['provider_deviation']:.3g} from it")
    if q["provider_exceeds_cost"] or q["exceeding"]:
        s += (f"; the PROVIDER EXCEEDS the expected cost (deviation > {q['deviation_limit']:g} x cost: a bug, not "
              f"precision) at {', '.join(q['exceeding']) or 'the output'}")
    return s


def _candidates(cls, p: dict, c: Cell) -> tuple[dict, dict, dict, str]:
    """(every leaf -> items, candidates -> items, candidates -> their leaves, "leaf" | "block"): the
    leaves holding something the backend runs at reduced precision (plan_units), grouped per
    analysis.plan_group (grouped)."""
    all_units = units_for(cls.plan_items, Path(c.model_dir))
    scoped = {k: v for k, v in all_units.items() if v}
    units = cls.plan_units(scoped, Path(c.model_dir), p["providers"][c.provider])
    if scoped and not units:
        raise ValueError(f"no candidate layers in {c.model_dir}/model.onnx: no leaf module holds a node "
                         f"{cls.__name__} runs at reduced precision ({cls.__name__}.plan_units)")
    if not units:
        raise ValueError(f"no candidate layers in {c.model_dir}/model.onnx: no node carries {SCOPES} metadata "
                         f"naming a leaf module (export.exporter=legacy does not keep it; use dynamo)")
    groups, members = grouped(units, str(schema.of(p).analysis.plan_group))
    by = "block" if any(len(v) > 1 or k != v[0] for k, v in members.items()) else "leaf"
    return all_units, (groups if by == "block" else units), members, by


def _search(p: dict, c: Cell, t: Target, head: dict) -> tuple[dict, dict]:
    """Steps 1-5 (module docstring) for a cell that can run: (plan, timing)."""
    cls = load_runner(p["providers"][c.provider]["runner"])
    job, cfg = _job(p, c), schema.of(p)
    warmup, repeats = int(cfg.capture.warmup), int(cfg.capture.repeats)
    max_keep = int(cfg.analysis.max_keep)
    all_units, units, members, by = _candidates(cls, p, c)
    feeds, refs = _feeds(c.inputs), _refs(c.reference)
    ev, lat = Evaluator(cls(job), units, feeds, refs, t), {}
    found = plan_cost.scheme(job, cls.settings(job))
    ev.quant = plan_cost.QuantModel(Path(c.model_dir), found, cfg.capture.threads) if found else None
    try:
        full = ev.run(True, [], phase="full")
        lat["full"] = ev.latency(warmup, repeats)
        expected = ev.cost([i for v in units.values() for i in v]) if ev.quant is not None else None
        fp32 = ev.run(False, [], phase="fp32")
        lat["fp32"] = ev.latency(warmup, repeats)
        sens, keep, steps = [], [], []
        if full["passes"]:
            outcome = "full_passes"
        elif not fp32["passes"]:
            outcome = "fp32_fails"
        else:
            sens = sensitivity(ev)
            keep, last, steps = greedy(ev, [r["layer"] for r in sens], max_keep)
            outcome = "planned" if last["passes"] else "not_reached"
    finally:
        ev.runner.deactivate()
        if ev.quant is not None:
            ev.quant.close()
    mixed, lat["mixed"] = full, lat["full"]
    if keep:
        mixed, lat["mixed"], ev.seconds["confirm"] = _confirm(cls, job, units, keep, feeds, refs, t, warmup, repeats)
    leaf_units = {leaf for v in members.values() for leaf in v}
    plan = {**head, "status": "OK", "items": cls.plan_items, "group": by, "candidates": len(units),
            "not_candidates": [k for k in all_units if k not in leaf_units], "outcome": outcome,
            "keep": keep, "keep_items": {k: units[k] for k in keep},
            **({"leaves": len(leaf_units), "keep_leaves": [x for k in keep for x in members[k]]} if by == "block" else {}),
            "passes": bool(mixed["passes"]) if outcome != "fp32_fails" else False,
            "outputs": {"fp32": fp32, "full": full, "mixed": mixed},
            **({"quant_cost": _quant_cost(found, expected, full, sens)} if expected else {}),
            "sensitivity": sens, "search": steps,
            "runs": ev.runs + (1 if keep else 0)}
    plan["summary"] = _summary(outcome, plan, len(units), max_keep) + _cost_summary(plan.get("quant_cost"))
    med = {k: v.get("median_ms") for k, v in lat.items()}
    ratio = {f"{a}_vs_{b}": (med[a] / med[b] if med[a] and med[b] else None)
             for a, b in (("full", "fp32"), ("mixed", "fp32"), ("mixed", "full"))}
    timing = {"latency": lat, "latency_ratio": ratio, "phases_s": ev.seconds, "runs": plan["runs"]}
    return plan, timing


def _quant_cost(found: tuple, expected: dict, full: dict, sens: list[dict]) -> dict:
    """plan.json's quant_cost: how much of the full model's output error is the quantisation's own
    (parity's quantisation of every candidate, plan_cost) and the candidates whose provider error
    exceeds their expected cost."""
    scheme, opts = found
    return {"scheme": scheme, "options": {k: opts[k] for k in sorted(opts) if k != "fault"},
            "method": "parity.analysis.plan_cost: model.onnx with the weight MatMuls quantised by "
                      "parity.models.quant_sim, onnxruntime float32; rel_l2 of the output vs the fp32 reference",
            "output": expected["quant_cost"], "output_tol_ratio": expected["quant_tol_ratio"],
            "provider_rel_l2": full["rel_l2"],
            "expected_share": expected["quant_cost"] / full["rel_l2"] if full["rel_l2"] else None,
            "provider_deviation": expected["deviation"],
            "provider_exceeds_cost": plan_cost.flagged(expected["quant_cost"], expected["deviation"]),
            "deviation_limit": plan_cost.DEVIATION_LIMIT,
            "ranked_by": "quant_cost" if sens else None,
            "exceeding": [r["layer"] for r in sens if r.get("exceeds_cost")]}


def run_plan(p: dict, c: Cell) -> tuple[dict, str, dict]:
    """(plan.json content, keep.yaml text, timing) for one cell. A cell that cannot run or fails is a
    result (status UNSUPPORTED / UNAVAILABLE / FAILED with the reason), not an exception."""
    key = config.cell_key(c.model, c.dtype, c.provider)
    t = target(p, c.dtype)
    head = {"cell": key, "model": c.model, "dtype": c.dtype, "provider": c.provider, "target": t.describe()}
    t0 = time.perf_counter()
    timing: dict = {}
    skip = _not_run(p, c)
    if skip:
        plan = {**head, "status": skip[0], "reason": skip[1]}
    else:
        try:
            plan, timing = _search(p, c, t, head)
        except Exception as e:  # a conversion or run that fails is this cell's result
            plan = {**head, "status": "FAILED", "reason": error_reason(e)}
    timing = {"cell": key, "status": plan["status"], **timing, "stage_s": time.perf_counter() - t0}
    return plan, keep_yaml(plan, p["dtypes"][c.dtype]), timing


def keep_yaml(plan: dict, dtype_cfg: dict) -> str:
    """The keep-list as a user applies it (keep.yaml), with how to apply it on this backend."""
    keep = plan.get("keep") or []
    mode, tdt = schema.mode(dtype_cfg), dtype_cfg.get("torch")
    doc = {"cell": plan["cell"], "status": plan["status"], "outcome": plan.get("outcome"),
           "passes": plan.get("passes", False), "target": {k: plan["target"][k] for k in ("atol", "rtol", "source")},
           "keep_fp32": keep}
    if plan.get("keep_leaves"):  # the plan kept blocks (analysis.plan_group): the leaves they hold
        doc["keep_leaves"] = plan["keep_leaves"]
    nodes = sorted(n for k in keep for n in plan["keep_items"][k])
    if plan.get("items") == "onnx_nodes" and mode.startswith("int8"):
        how = ("onnxruntime.quantization quantize_static / quantize_dynamic on model.onnx with the cell's "
               f"settings (providers.{plan['provider']}.options) and nodes_to_exclude=nodes_to_exclude")
        doc["nodes_to_exclude"] = nodes
    elif plan.get("items") == "onnx_nodes" and mode == "int4_weight":
        how = ("onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer on model.onnx with the cell's "
               f"settings (providers.{plan['provider']}.options; parity.backends.ort_int4.quantize) and "
               "nodes_to_exclude=nodes_to_exclude")
        doc["nodes_to_exclude"] = nodes
    elif plan.get("items") == "onnx_nodes":
        how = ("parity.backends.ort_cpu.mixed_fp16(parity.models.onnx_weights.load_with_data('model.onnx'), node_block_list): onnxruntime's "
               "convert_float_to_float16(keep_io_types=True, node_block_list=...) plus its Cast repairs")
        doc["node_block_list"] = nodes
    elif mode == "autocast":
        how = f"under torch.autocast(dtype={tdt}), run each module in keep_fp32 with autocast off on float32 inputs"
    else:
        how = (f"every leaf module at {tdt} except those in keep_fp32 (keep_leaves for blocks; float32), each casting its floating "
               f"inputs to its own dtype; model inputs stay float32 (parity.backends.torch_cpu.TorchRunner.mixed)")
    head = (f"# Mixed-precision plan: {plan['model']} at {plan['dtype']} on {plan['provider']}: the leaf modules"
            f" to keep in float32 (evidence: plan.json).\n# Apply: {how}\n")
    if plan["status"] != "OK":
        head += f"# No plan: {plan['status']}: {plan.get('reason', '')}\n"
    return head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=100)
