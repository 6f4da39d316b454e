"""Suite format features beyond dims/presets/templates (issue 16). Light: stdlib only, never torch.

Checked at expansion (parity.suites.spec calls in here) and carried in each expanded case:

  per-tensor dtype   a preset's `dtype:` is `float` (follows the cell), `complex` (complex64 whose real
                     and imaginary parts are rounded to the cell's float dtype; the computation stays
                     complex64: neither torch CPU nor ONNX Runtime has complex32 kernels, so "fp16" of a
                     complex case means fp16-representable inputs, and each result row says so), `int`,
                     `bool`, or a fixed torch dtype (`float64`, `float32`, `float16`, `bfloat16`,
                     `complex64`, `complex128`, `int8` ... `int64`, `uint8`) that no cell changes.
  random values      in args/kwargs: `{uniform: [lo, hi]}`, `{randint: [lo, hi]}` (hi exclusive),
                     `{bernoulli: p}`, `{choice: [a, b, null]}`, `{optional: VALUE, p_none: p}`; drawn
                     in the worker from the case's seed (suite seed x case id x sample), so a re-run
                     draws the same values; the drawn values are in results.json (`drawn`).
  file modules       `module: file:path/to/code.py::Symbol` (a path inside the repository, relative
                     to its root): the file is the declaration of the code that runs.
  construct nodes    `{construct: torch.nn.Linear, args: [4, 4], kwargs: {}}` in constructor
                     args/kwargs: an object built (not called) before the case's module, nestable.
  export             `export: {exporter: legacy | dynamo, opset: N}` on the spec or a case (ORT cells).
  baseline           `baseline: torch_cpu@fp32` (default: torch eager fp32 on the dtype-rounded
                     inputs), `torch_cpu@fp64`, or `<provider>@cell | @fp32` (a selected provider's
                     runner, or torch_cpu's): what a cell is compared to.
  samples            `samples: N`: N independent input draws per case (outputs `out:0`, `out:0#s1`, ...).
  skip_on            `skip_on: [{provider: ort_cpu, dtype: fp16, reason: "..."}]` (fnmatch patterns,
                     reason required): that (case, provider, dtype) is SKIPPED with the reason.
  zero_output        `allow` (default) | `fail`: a reference whose first output is all zeros makes the
                     case INVALID (any result would pass against it).
"""

from __future__ import annotations

import ast
import fnmatch
import hashlib
import re
from pathlib import Path

from parity.config import imports
from parity.core import codedeps

FOLLOW_DTYPES = ("float", "complex", "int", "bool")
FIXED_DTYPES = ("float64", "float32", "float16", "bfloat16", "complex64", "complex128", "int8", "int16", "int32",
                "int64", "uint8")
PRESET_DTYPES = FOLLOW_DTYPES + FIXED_DTYPES
RANDOM_NODES = {"uniform": 2, "randint": 2, "bernoulli": 1, "choice": None}
EXPORTERS = {"legacy": (13, 23), "dynamo": (18, 25)}
# providers a baseline may name (it runs through that provider's runner: a selected provider, or
# torch_cpu, whose eager runner is always there; parity.suites.execute._baseline)
SUITE_PROVIDERS = ("torch_cpu", "ort_cpu", "ort_cpu_noopt", "torch_compile")
BASELINE_PRECISIONS = ("cell", "fp32", "fp64")
DEFAULT_BASELINE = "torch_cpu@fp32"
ZERO_OUTPUT = ("allow", "fail")
OPTION_KEYS = ("export", "baseline", "samples", "skip_on", "zero_output")
_FILE = re.compile(r"file:(?P<path>[^:]+\.py)::(?P<attr>[A-Za-z_]\w*(\.[A-Za-z_]\w*)*)")


def kind_of(dtype: str) -> str:
    """float | complex | int | bool: how a preset dtype is generated."""
    if dtype in ("float", "float64", "float32", "float16", "bfloat16"):
        return "float"
    if dtype.startswith("complex"):
        return "complex"
    return "bool" if dtype == "bool" else "int"


# ------------------------------------------------------------------------------------- file targets
def is_file_target(s) -> bool:
    return isinstance(s, str) and _FILE.fullmatch(s) is not None


def split_file_target(s: str) -> tuple[str, str]:
    m = _FILE.fullmatch(s)
    return m.group("path"), m.group("attr")


def file_module(path: str) -> str | None:
    """The dotted module name of a repo-relative .py path (examples/toy.py -> examples.toy), so a
    file module and the modules it imports by name are one module object; None if a part is not an
    identifier (then it is loaded from its path)."""
    parts = Path(path).with_suffix("").parts
    return ".".join(parts) if parts and all(p.isidentifier() for p in parts) else None


def check_file_target(target: str, root: Path) -> Path:
    """The file of `file:path.py::Symbol` under root (the repository); raises ValueError if it is
    absolute, leaves the root, does not exist or does not bind Symbol (read, never imported)."""
    path, attr = split_file_target(target)
    p = Path(path)
    if p.is_absolute() or ".." in p.parts:
        raise ValueError(f"'{target}': give a path inside the repository, relative to its root (got {path})")
    f = root / p
    if not f.is_file():
        raise ValueError(f"'{target}': no file {path} under {root}")
    try:
        names, dynamic = imports._names_in(str(f), f.stat().st_mtime_ns, f.stat().st_size)
    except SyntaxError as e:
        raise ValueError(f"'{target}': {path}:{e.lineno}: syntax error: {e.msg}") from None
    if attr.split(".")[0] not in names and not dynamic:
        raise ValueError(f"'{target}': {path} defines no '{attr.split('.')[0]}'")
    return f


def top_level_kind(path: Path, name: str) -> str | None:
    """"class", "function" or "other" for what binds `name` at the top level of a .py file (read,
    never imported); None if the file cannot be read or parsed."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError):
        return None
    kind = None
    for n in tree.body:
        if isinstance(n, ast.ClassDef) and n.name == name:
            kind = "class"
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name:
            kind = "function"
        elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.ImportFrom, ast.Import)) and name in {
                getattr(t, "id", None) for t in ast.walk(n) if isinstance(t, ast.Name)} | {
                a.asname or a.name for a in getattr(n, "names", [])}:
            kind = "other"
    return kind


def not_a_class(target: str, file: Path | None) -> str | None:
    """Why a `module:` target is not a class (a factory function), else None: `module:` constructs a
    class with `args`; a function goes in `op:`."""
    if file is None:
        return None
    attr = target.replace(":", ".").rpartition(".")[2] if not is_file_target(target) else split_file_target(target)[1]
    if top_level_kind(file, attr) == "function":
        return (f"'{target}' is a function, not a class: `module:` constructs a class with `args` and calls it "
                f"with `inputs`; call a function with `op:`")
    return None


def repo_root(file: str | Path) -> Path:
    """The repository a suite file belongs to: the folder holding conf/suites/<name>.yaml, else the
    working directory (where the stages and the suite workers run)."""
    f = Path(file).resolve()
    if f.parent.name == "suites" and f.parent.parent.name == "conf":
        return f.parent.parent.parent
    return Path.cwd().resolve()


# --------------------------------------------------------------------------------------- value nodes
def value_node(v: dict, convert, err, key: str):
    """A random/choice/optional/construct node (a mapping with one of those keys), checked and in
    its expanded form ({"random": ...} / {"construct": ...}); None if `v` is no such node."""
    if "construct" in v:
        extra = set(v) - {"construct", "args", "kwargs"}
        if extra:
            err(f"construct: unknown keys {sorted(extra)}. Valid: construct, args, kwargs", key)
        if not isinstance(v.get("args", []), list) or not isinstance(v.get("kwargs", {}), dict):
            err("construct: args is a list, kwargs a mapping", key)
        return {"construct": {"target": v["construct"], "args": convert(v.get("args", [])),
                              "kwargs": convert(v.get("kwargs", {}))}}
    if "optional" in v:
        if set(v) - {"optional", "p_none"}:
            err(f"optional: unknown keys {sorted(set(v) - {'optional', 'p_none'})}. Valid: optional, p_none", key)
        p = v.get("p_none", 0.5)
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0 <= p <= 1:
            err(f"optional: p_none must be in [0, 1], got {p!r}", key)
        return {"random": {"optional": convert(v["optional"]), "p_none": float(p)}}
    (name, prm), = v.items() if len(v) == 1 else ((None, None),)
    if name not in RANDOM_NODES:
        return None
    if name == "choice":
        if not isinstance(prm, list) or not prm:
            err("choice: expected a non-empty list of values", key)
        return {"random": {"choice": convert(prm)}}
    prm = prm if isinstance(prm, list) else [prm]
    if len(prm) != RANDOM_NODES[name] or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                 for x in prm):
        err(f"{name}: expected {RANDOM_NODES[name]} number(s), got {v[name]!r}", key)
    if name == "randint" and (not all(isinstance(x, int) for x in prm) or prm[0] >= prm[1]):
        err(f"randint: expected ints [lo, hi) with lo < hi, got {prm!r}", key)
    if name == "uniform" and prm[0] > prm[1]:
        err(f"uniform: expected [lo, hi] with lo <= hi, got {prm!r}", key)
    if name == "bernoulli" and not 0 <= prm[0] <= 1:
        err(f"bernoulli: p must be in [0, 1], got {prm[0]!r}", key)
    return {"random": {name: prm}}


def walk_targets(obj):
    """Every construct target inside an expanded value."""
    if isinstance(obj, dict):
        if "construct" in obj and set(obj) == {"construct"}:
            yield obj["construct"]["target"]
        for x in obj.values():
            yield from walk_targets(x)
    elif isinstance(obj, list):
        for x in obj:
            yield from walk_targets(x)


# ----------------------------------------------------------------------------------- case options
def options(c: dict, spec: dict, err) -> dict:
    """The expanded case's export/baseline/samples/skip_on/zero_output (case over spec over default)."""
    out = {}
    exp = dict(spec.get("export") or {}, **(c.get("export") or {}))
    if exp:
        if set(exp) - {"exporter", "opset"}:
            err(f"unknown keys {sorted(set(exp) - {'exporter', 'opset'})}. Valid: exporter, opset", "export")
        ex = exp.get("exporter", "legacy")
        if ex not in EXPORTERS:
            err(f"unknown exporter {ex!r}. Valid: {', '.join(EXPORTERS)}", "export.exporter")
        lo, hi = EXPORTERS[ex]
        op = exp.get("opset")
        if op is not None and (not isinstance(op, int) or isinstance(op, bool) or not lo <= op <= hi):
            err(f"opset {op!r} is out of range for the {ex} exporter (valid: [{lo}, {hi}])", "export.opset")
        out["export"] = {"exporter": ex, "opset": op}
    base = c.get("baseline", spec.get("baseline", DEFAULT_BASELINE))
    prov, _, prec = str(base).partition("@")
    prec = prec or "cell"
    if prov not in SUITE_PROVIDERS or prec not in BASELINE_PRECISIONS:
        err(f"bad baseline {base!r}: expected PROVIDER@PRECISION, PROVIDER one of {', '.join(SUITE_PROVIDERS)}, "
            f"PRECISION one of {', '.join(BASELINE_PRECISIONS)}", "baseline")
    if prec == "fp64" and prov != "torch_cpu":
        err(f"bad baseline {base!r}: fp64 runs on torch_cpu only", "baseline")
    if f"{prov}@{prec}" != DEFAULT_BASELINE:
        out["baseline"] = {"provider": prov, "precision": prec}
    n = c.get("samples", spec.get("samples", 1))
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 64:
        err(f"samples: expected an int in [1, 64], got {n!r}", "samples")
    if n > 1:
        out["samples"] = n
    skips = list(spec.get("skip_on") or []) + list(c.get("skip_on") or [])
    for s in skips:
        if not isinstance(s, dict) or not s.get("reason") or set(s) - {"provider", "dtype", "reason"} \
                or not ({"provider", "dtype"} & set(s)):
            err(f"skip_on: expected {{provider: PATTERN, dtype: PATTERN, reason: TEXT}} (reason required, one "
                f"of provider/dtype at least), got {s!r}", "skip_on")
    if skips:
        out["skip_on"] = [{k: str(v) for k, v in s.items()} for s in skips]
    z = c.get("zero_output", spec.get("zero_output", "allow"))
    if z not in ZERO_OUTPUT:
        err(f"zero_output: expected one of {', '.join(ZERO_OUTPUT)}, got {z!r}", "zero_output")
    if z != "allow":
        out["zero_output"] = z
    return out


def skip_reason(case: dict, provider: str, dtype: str) -> str | None:
    """The reason of the first skip_on rule matching (provider, dtype), else None."""
    for s in case.get("skip_on") or []:
        if fnmatch.fnmatchcase(provider, s.get("provider", "*")) and fnmatch.fnmatchcase(dtype, s.get("dtype", "*")):
            return f"skip_on: {s['reason']}"
    return None


# ---------------------------------------------------------------------------------------- code deps
def case_targets(case: dict) -> list[str]:
    """Every code target an expanded case names (op/module/gradcheck, pair sides, constructs)."""
    out = []
    if case.get("kind") == "pair":
        out += [d["target"] for d in case["pair"].values()]
        for d in case["pair"].values():
            out += list(walk_targets([d.get("args"), d.get("kwargs")]))
    elif "target" in case:
        out.append(case["target"])
    out += list(walk_targets([case.get("ctor_args"), case.get("ctor_kwargs"), case.get("call_args"),
                              case.get("call_kwargs")]))
    return out


def suite_code(cases: list[dict], root: Path, roots=None) -> dict:
    """What a suite's run stages depend on besides the suite spec: sha256 of every module the suite
    names (declared `import:` modules, file: modules, targets under them) and what those import from
    the same source tree (parity.core.codedeps). Torch targets and parity's own test ops are not listed
    (their versions/files are fingerprinted or stage deps already)."""
    roots = [root, *(codedeps.search_roots(root) if roots is None else roots)]
    mods, files = set(), {}
    for c in cases:
        if c.get("kind") == "onnx":  # the model file and its data sets: one digest per case folder
            files[c["onnx"]["path"]] = _folder_digest(root / c["onnx"]["path"])
            continue
        mods.update(c.get("imports") or [])
        for t in case_targets(c):
            if is_file_target(t):
                path, _ = split_file_target(t)
                f = root / path
                name = file_module(path)
                if name and codedeps.find_module(name, [root]):
                    mods.add(name)
                elif f.is_file():
                    files[path] = hashlib.sha256(f.read_bytes()).hexdigest()
    out = {}
    for m in sorted(mods):
        if m in imports.OWN_MODULES or m.split(".")[0] == "torch":
            continue
        try:
            out.update(codedeps.model_code(m, roots)["files"])
        except LookupError:
            out[m] = "not found"
    out.update(files)
    return {"source": "suite", "files": dict(sorted(out.items()))}


def _folder_digest(folder: Path) -> str:
    """sha256 over the relative names and bytes of every file under `folder` (sorted)."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(f.relative_to(folder).as_posix().encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def tolerances_by_dtype(suites: dict, dtypes) -> dict:
    """{suite: {dtype: the suite's tolerance rules that can apply at that dtype, each with its index}}:
    params.yaml's `suite_tolerances` (resolved at compose), which suite_diff@suite-dtype-provider
    depends on instead of the whole rule list, so a rule scoped to fp16 re-runs only fp16 diffs."""
    out = {}
    for name, sec in sorted((suites or {}).items()):
        rules = (sec or {}).get("tolerances") or [] if isinstance(sec, dict) else []
        out[name] = {d: [dict(r, index=i) for i, r in enumerate(rules)
                         if isinstance(r, dict) and r.get("dtype", d) == d] for d in dtypes}
    return out
