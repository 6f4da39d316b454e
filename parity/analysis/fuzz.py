"""Seeded op fuzzing over a suite: generate cases, shrink a failing one, write it as suite YAML.
Light (numpy + yaml, never torch): cases run in the suite workers (parity.analysis.fuzz_campaign).

A *template* is one suite case with the dims and presets it uses, in the suite file's own terms:

    {"base": "matmul", "file": "conf/suites/critical.yaml",
     "spec": {"dims": {M: 32, K: 64, N: 48}, "presets": {x: {shape: [M, K]}, ...}, "grad": true, ...},
     "case": {id: matmul, op: aten::matmul, inputs: [x, w]}}

A fuzz case is a template mutated from one integer seed (mutate()): every int dim redrawn (kept,
1, empty, odd, random, large), float presets' values redrawn by class (normal, mixed signs over
10^-2..10^3, large up to half the dtype's max, tiny at or below its smallest normal: denormals) and
layout (contiguous, transposed, channels_last), and with `nonfinite` a NaN and two Infs. Its id is
`<base>~s<seed>`; the workers seed a case's values from its id, so the id alone (with the suite,
dtype and provider) replays it bit for bit. Everything a fuzz case is can be written in suite YAML
(dims, presets with init/layout/nonfinite): a minimised failure is a regression case as it stands.

Why not Hypothesis: cases run in isolated worker processes (a crashing kernel costs one case), a
case must replay from its id alone (no example database), and shrinking here is per suite dim
(halving, then bisection to the exact threshold), which Hypothesis' byte-stream shrinker does not
know about; the generator is a few lines of seeded numpy instead.
"""

from __future__ import annotations

import copy
import re

import numpy as np
import yaml

from parity.core import dtypes
from parity.suites import spec

# statuses that count as a fuzzing failure (OK, INVALID: the reference fails too, UNSUPPORTED and
# UNAVAILABLE, NAN_IN_REFERENCE do not)
FAIL_STATUSES = ("MISMATCH", "NAN_IN_OUTPUT", "CRASH", "TIMEOUT", "INFER_FAIL", "EXPORT_FAIL", "COMPILE_FAIL")
VALUE_CLASSES = ("normal", "mixed", "large", "tiny")
VALUE_P = (0.4, 0.25, 0.15, 0.2)
DIM_CLASSES = ("same", "one", "empty", "odd", "random", "large")
DIM_P = (0.15, 0.15, 0.05, 0.25, 0.25, 0.15)
DEFAULTS = {"max_numel": 1 << 16, "empty": True, "nonfinite": False, "layouts": True}
_TOKEN = re.compile(r"[A-Za-z_]\w*")


def _err(file):
    def err(msg, key=None):
        raise spec.SuiteError(file, None, key, msg)
    return err


# ------------------------------------------------------------------------------------------ templates
def templates(name: str, section: dict | None = None, root=None) -> list[dict]:
    """One template per expanded case of suite `name` (its includes' cases with their own dims and
    presets). The suite is validated first (spec.expand), so errors name file, case and key."""
    if section is None:
        section, file = spec.load_section(name, root)
    else:
        file = spec._rel(spec.suite_file(name, root))
    spec.expand_section(name, copy.deepcopy(section), file, root)
    return _templates(section, file, root)


def _templates(section: dict, file: str, root) -> list[dict]:
    sp = section["spec"]
    out = []
    for other in sp.get("include") or []:
        sec, f = spec.load_section(other, root)
        out += _templates(sec, f, root)
    common = {k: copy.deepcopy(sp[k]) for k in ("dims", "presets", "grad", "loss", "timeout_s", "import") if k in sp}
    err = _err(file)
    for raw in sp.get("cases") or []:
        body = {k: v for k, v in raw.items() if k not in ("vars", "only", "skip")}
        for env in spec._combos(raw, err):
            case = spec._subst(body, env, err)
            out.append(_restrict({"base": case["id"], "file": file, "spec": copy.deepcopy(common), "case": case}))
    return out


def _restrict(t: dict) -> dict:
    """Keep only the presets the case names and the dims those (and the case) use."""
    sp, case = t["spec"], t["case"]
    presets, dims = sp.get("presets") or {}, sp.get("dims") or {}
    body = yaml.safe_dump({k: v for k, v in case.items() if k != "id"})
    used = {n for n in presets if f"${n}" in body}
    used |= {x.lstrip("$") for x in case.get("inputs") or [] if isinstance(x, str)}
    used &= set(presets)
    text = body + yaml.safe_dump({n: presets[n] for n in sorted(used)})
    need = {tok for tok in _TOKEN.findall(text) if tok in dims}
    while True:  # dims defined by expressions of other dims
        more = {tok for d in need for tok in _TOKEN.findall(str(dims[d])) if tok in dims} - need
        if not more:
            break
        need |= more
    if "presets" in sp:
        sp["presets"] = {n: presets[n] for n in presets if n in used}
    if "dims" in sp:
        sp["dims"] = {d: dims[d] for d in dims if d in need}
    return t


def fuzzable(t: dict) -> bool:
    return any(k in t["case"] for k in ("op", "module", "pair"))


def expand(t: dict) -> dict:
    """The expanded case (spec.expand_section) of a template; raises SuiteError."""
    section = {"tolerances": [], "spec": dict(copy.deepcopy(t["spec"]), cases=[copy.deepcopy(t["case"])])}
    (case,) = spec.expand_section("fuzz", section, t["file"])
    if "fuzz" in t:
        case["fuzz"] = t["fuzz"]
    return case


# ------------------------------------------------------------------------------------------- mutation
def case_seed(campaign_seed: int, k: int) -> int:
    """The seed of the k-th case of a campaign (31 bits, distinct per (seed, k) in practice)."""
    return int(np.random.SeedSequence([int(campaign_seed), int(k)]).generate_state(1)[0]) & 0x7FFFFFFF


def parse_id(case_id: str) -> tuple[str, int]:
    """'matmul~s123' -> ('matmul', 123)."""
    base, sep, s = case_id.rpartition("~s")
    if not sep or not s.isdigit():
        raise ValueError(f"not a fuzz case id: {case_id!r} (expected <case>~s<seed>)")
    return base, int(s)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _pick_dim(v: int, rng, opts) -> int:
    cls = DIM_CLASSES[rng.choice(len(DIM_CLASSES), p=DIM_P)]
    if cls == "empty" and not opts["empty"]:
        cls = "one"
    hi = max(2 * v, 2)
    return {"same": lambda: v, "one": lambda: 1, "empty": lambda: 0,
            "odd": lambda: int(rng.integers(0, hi // 2 + 1)) * 2 + 1,
            "random": lambda: int(rng.integers(1, hi + 1)),
            "large": lambda: int(rng.integers(hi, 4 * hi + 1))}[cls]()


def _values(p: dict, cls: str, rng, torch_dtype: str) -> dict:
    """A float preset's init redrawn for a value class (sign domain kept: uniform [a, b] with a >= 0
    stays positive, e.g. log's inputs)."""
    init = p.get("init", "normal")
    name, prm = (init, None) if isinstance(init, str) else next(iter(init.items()))
    if p.get("dtype", "float") != "float" or name not in ("normal", "uniform") or cls == "normal":
        return p
    f = dtypes.find(torch_dtype) or dtypes.FP32  # largest finite, smallest normal magnitude
    big, tiny = f.max, f.tiny
    if cls == "large":
        target = big * 10 ** rng.uniform(-3, np.log10(0.5))
    elif cls == "tiny":
        target = tiny * 10 ** rng.uniform(-2, 0)
    else:
        target = 10 ** rng.uniform(-2, 3)
    target = float(f"{target:.6g}")
    if name == "uniform" and prm and prm[0] >= 0 and prm[1] > 0:
        f = target / float(prm[1])
        return dict(p, init={"uniform": [float(f"{prm[0] * f:.6g}"), target]})
    return dict(p, init={"uniform": [-target, target]})


def mutate(t: dict, seed: int, torch_dtype: str, opts: dict | None = None) -> dict:
    """The fuzz case of template t for one seed (see the module docstring)."""
    o = dict(DEFAULTS, **(opts or {}))
    rng = np.random.default_rng(int(seed))
    m = copy.deepcopy(t)
    sp = m["spec"]
    for d, v in (sp.get("dims") or {}).items():
        if _is_int(v):
            sp["dims"][d] = _pick_dim(v, rng, o)
    cls = VALUE_CLASSES[rng.choice(len(VALUE_CLASSES), p=VALUE_P)]
    layout = ("contiguous", "transposed", "channels_last")[int(rng.integers(3))] if o["layouts"] else "contiguous"
    floats = []
    for n, p in (sp.get("presets") or {}).items():
        p = _values(p, cls, rng, torch_dtype)
        nd = len(p.get("shape") or [])
        if layout == "transposed" and nd >= 2 or layout == "channels_last" and nd == 4:
            p = dict(p, layout=layout)
        if p.get("dtype", "float") == "float":
            floats.append(n)
        sp["presets"][n] = p
    if o["nonfinite"] and floats and rng.random() < 0.25:
        n = floats[int(rng.integers(len(floats)))]
        sp["presets"][n] = dict(sp["presets"][n], nonfinite={"inf": 2, "nan": 1})
    m["case"]["id"] = f"{t['base']}~s{int(seed)}"
    m["fuzz"] = {"seed": int(seed), "base": t["base"], "values": cls, "layout": layout}
    _fit(m, o["max_numel"])
    return m


def _numels(obj) -> list[int]:
    if isinstance(obj, dict) and set(obj) == {"tensor"}:
        return [int(np.prod(obj["tensor"]["shape"], dtype=np.int64))]
    if isinstance(obj, list):
        return [n for v in obj for n in _numels(v)]
    if isinstance(obj, dict):
        return [n for v in obj.values() for n in _numels(v)]
    return []


def _fit(m: dict, max_numel: int) -> None:
    """Halve the largest dims until every tensor of the case has at most max_numel elements."""
    dims = m["spec"].get("dims") or {}
    for _ in range(64):
        try:
            c = expand(m)
        except spec.SuiteError:
            return  # the runner reports it (INVALID)
        sizes = _numels([c.get("call_args"), c.get("call_kwargs"), c.get("ctor_args"), c.get("pair")])
        if max(sizes, default=0) <= max_numel:
            return
        ints = [d for d, v in dims.items() if _is_int(v) and v > 1]
        if not ints:
            return
        d = max(ints, key=lambda k: dims[k])
        dims[d] = dims[d] // 2


# ------------------------------------------------------------------------------------------ shrinking
def minimise(t: dict, fails, orig: dict | None = None, log=None) -> tuple[dict, int]:
    """Shrink a failing template: each int dim halved while the case still fails, then bisected
    between the last passing and the first failing size (the exact threshold); then each preset's
    values, layout and non-finite entries back to the original template's (`orig`). fails(t) ->
    bool runs a candidate. Returns (smallest failing template, candidates run)."""
    cur, runs = copy.deepcopy(t), 0

    def attempt(cand, what) -> bool:
        nonlocal cur, runs
        runs += 1
        ok = fails(cand)
        if log:
            log(f"{'fails' if ok else 'passes'}: {what}")
        if ok:
            cur = cand
        return ok

    def with_dim(d, v):
        c = copy.deepcopy(cur)
        c["spec"]["dims"][d] = v
        return c

    settled: dict = {}  # dim -> the size bisection stopped at (one less passed): not retried
    for _ in range(2):
        before = yaml.safe_dump(cur["spec"])
        for d in sorted(cur["spec"].get("dims") or {}):
            v = cur["spec"]["dims"][d]
            if not _is_int(v) or v <= 1 or settled.get(d) == v:
                continue
            hi, lo = v, None
            while hi > 1:
                if attempt(with_dim(d, hi // 2), f"{d}={hi // 2}"):
                    hi = hi // 2
                else:
                    lo = hi // 2
                    break
            while lo is not None and hi - lo > 1:
                mid = (lo + hi) // 2
                if attempt(with_dim(d, mid), f"{d}={mid}"):
                    hi = mid
                else:
                    lo = mid
            if lo is not None:
                settled[d] = hi
        if orig is not None:
            for n, p in (cur["spec"].get("presets") or {}).items():
                base = (orig["spec"].get("presets") or {}).get(n, {})
                for key in ("nonfinite", "layout", "init"):
                    if p.get(key) != base.get(key):
                        c = copy.deepcopy(cur)
                        if key in base:
                            c["spec"]["presets"][n][key] = copy.deepcopy(base[key])
                        else:
                            c["spec"]["presets"][n].pop(key, None)
                        attempt(c, f"{n}.{key} -> {base.get(key, 'default')}")
        if yaml.safe_dump(cur["spec"]) == before:
            break
    return cur, runs


def to_suite_yaml(t: dict, name: str, tolerances: list, note: str = "") -> str:
    """A suite file (conf/suites/<name>.yaml format) holding the one case of template t, under its
    fuzz id (the id seeds its values, so it replays the failure)."""
    sp = {k: v for k, v in t["spec"].items() if v is not None}
    sp["cases"] = [t["case"]]
    doc = {name: {"tolerances": list(tolerances or []), "spec": sp}}
    head = "".join(f"# {line}\n" for line in note.splitlines())
    return head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=110)
