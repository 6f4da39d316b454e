"""Suite files: parse, expand and validate. Light (yaml only, never torch).

A suite is one Hydra option file conf/suites/<name>.yaml keyed by its own name:

    critical:
      tolerances:            # read by the diff stages only: changing them re-runs only diffs. A rule
        - {dtype: bf16, kind: grad, atol: 1.0e-2, rtol: 5.0e-2}     # is a fixed tolerance for what it
                             # matches (kind: out | grad; case: fnmatch); the rest is judged by the
                             # fp64 oracle (parity.suites.diff)
      spec:                  # read by the run stages
        include: [other]     # cases of conf/suites/other.yaml (its own dims/presets)
        timeout_s: 30        # per case (default suites_run.timeout_s)
        grad: true           # default for cases: also compare backward (input and parameter grads)
        dims: {B: 4, K: 64}
        presets:
          x: {shape: [B, K]}                                    # dtype: float (default) | int | bool
          idx: {shape: [B], dtype: int, init: {randint: [0, 10]}}
          # init: normal | {normal: [mean, std]} | {uniform: [lo, hi]} | {randint: [lo, hi]}
          #       | {fixed: [values...]} | {fill: value}
        cases:
          - {id: relu, op: aten::relu, inputs: [x]}               # op: aten::name[.overload] or a
          - {id: gelu, op: torch.nn.functional.gelu, inputs: [x]}  #  callable path (pkg.mod.attr)
          - {id: isel, op: aten::index_select, args: [$x, 0, $idx]}  # $name = a preset tensor
          - {id: "sm_d{d}", op: aten::softmax, inputs: [x], args: ["{d}"],   # template: cartesian
             vars: {d: [0, 1]}, skip: [{d: 0}]}                             # product, only/skip
          - {id: lin, module: torch.nn.Linear, args: [K, 8], inputs: [x]}   # args: constructor
          - {id: gelu_pair, pair: {a: {op: aten::gelu}, b: {op: aten::gelu, kwargs: {approximate: tanh}}},
             inputs: [x]}                                                   # A vs B, same backend
          - {id: fd, gradcheck: pkg.mod:MyFunction, inputs: [x]}           # float64 gradcheck
          - {id: opinfo.add.0, opinfo: {name: add, variant: "", sample: 0}}  # OpInfo sample
          - {id: test_relu, onnx: {path: data/onnx/node/test_relu, op: Relu}}  # an ONNX model with
            # its inputs and expected outputs (ONNX's backend-test layout; parity.suites.onnxcase)
          - {id: mine, op: mypkg.ops:fused_gelu, import: mypkg.ops, inputs: [x]}  # code of your own
          - {id: my_op, op: "import:mypkg.ops:my_gelu", reference: "import:mypkg.ref:gelu64",  # checked
             inputs: [x]}                       # against your float64 reference (parity.suites.custom)
    A preset may also give layout: contiguous | transposed | channels_last and nonfinite: {nan: n,
    inf: n} (what fuzzing draws: parity.analysis.fuzz).

More keys (parity.suites.features): preset dtypes complex/float64/int32/...; random values
{uniform}, {randint}, {bernoulli}, {choice}, {optional}; `file:path.py::Symbol` targets; nested
{construct: ...} nodes; and on the spec or a case: export, baseline, samples, skip_on, zero_output.

Targets resolve only in torch namespaces (aten::, torch.*, torch.nn.functional.*, torch.special.*,
torch.linalg.*, torch.fft.*; torch.nn.<Module> for module cases) and parity.suites.testops, unless
the case or the suite's spec declares `import: <module>` (or a list): the module, and the packages
under it, that the suite may import and run. Checking never imports it (parity.config.imports).

Expansion gives plain JSON-able dicts (one per case). Errors are SuiteError naming the file, the
case id and the key.
"""

from __future__ import annotations

import ast
import copy
import itertools
import operator
import re
from pathlib import Path

import yaml

from parity.config import imports, params as config
from parity.core import tolerance
from parity.config import schema
from parity.suites import features

SUITE_KEYS = {"tolerances", "spec"}
SPEC_KEYS = {"include", "timeout_s", "grad", "loss", "dims", "presets", "cases", "import", *features.OPTION_KEYS}
KINDS = ("op", "module", "pair", "gradcheck", "opinfo", "onnx")
CASE_KEYS = {"id", *KINDS, "inputs", "args", "kwargs", "vars", "only", "skip", "grad", "loss", "train",
             "timeout_s", "import", "reference", *features.OPTION_KEYS}
PAIR_SIDE_KEYS = {"op", "module", "args", "kwargs"}
PRESET_KEYS = {"shape", "dtype", "init", "layout", "nonfinite"}
LAYOUTS = ("contiguous", "transposed", "channels_last")  # preset layout: strides of the tensor (fuzzing)
IMPORT_PREFIX = "import:"  # op: import:pkg.mod:fn declares pkg.mod as code to run (custom ops)
PRESET_DTYPES = features.PRESET_DTYPES
INITS = {"normal": 2, "uniform": 2, "randint": 2, "fixed": None, "fill": 1, "bernoulli": 1}
LOSSES = ("sum", "mse")
TOL_RULE_KEYS = {"dtype", "case", "kind", "atol", "rtol"}
TOL_KINDS = ("out", "grad")
_VAR = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


class SuiteError(ValueError):
    """A bad suite. str() is 'FILE: case ID: key KEY: message'."""

    def __init__(self, file: str, case: str | None, key: str | None, msg: str):
        self.file, self.case, self.key, self.msg = file, case, key, msg
        where = file + (f": case '{case}'" if case else "") + (f": key '{key}'" if key else "")
        super().__init__(f"{where}: {msg}")


def suites_dir() -> Path:
    """conf/suites of the repository we run in (DVC runs stages at the repo root), else this
    checkout's."""
    here = Path("conf/suites")
    return here if here.is_dir() else Path(__file__).resolve().parents[2] / "conf" / "suites"


def suite_file(name: str, root: Path | None = None) -> Path:
    return (root or suites_dir()) / f"{name}.yaml"


def load_section(name: str, root: Path | None = None) -> tuple[dict, str]:
    """(section, file) of conf/suites/<name>.yaml."""
    f = suite_file(name, root)
    if not f.exists():
        avail = sorted(p.stem for p in f.parent.glob("*.yaml"))
        raise SuiteError(str(f), None, None, f"no such suite '{name}'. Available: {', '.join(avail)}")
    try:
        doc = yaml.safe_load(f.read_text()) or {}
    except yaml.YAMLError as e:  # a syntax error or a tag (the safe loader runs none): FILE:LINE:COL
        mark = getattr(e, "problem_mark", None)
        where = _rel(f) + (f":{mark.line + 1}:{mark.column + 1}" if mark else "")
        what = getattr(e, "problem", None) or (str(e).splitlines() or [type(e).__name__])[0]
        raise SuiteError(where, None, None, f"YAML error: {what}") from None
    if not isinstance(doc, dict) or name not in doc:
        raise SuiteError(str(f), None, None, f"the file must hold one mapping keyed by its own name '{name}'")
    return doc[name], _rel(f)


def _rel(f: Path) -> str:
    try:
        return str(f.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(f)


# --------------------------------------------------------------------------------------------- dims
def _eval_dim(expr, dims: dict, err):
    """int, a dim name, or an expression of dims with + - * // (e.g. "3*D")."""
    if isinstance(expr, bool):
        err(f"expected an int or a dim name, got {expr!r}")
    if isinstance(expr, int):
        return expr
    if not isinstance(expr, str):
        err(f"expected an int or a dim name, got {expr!r}")
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError:
        err(f"bad dim expression {expr!r}")

    def ev(n):
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.Name):
            if n.id not in dims:
                err(f"unknown dim '{n.id}'. Dims: {', '.join(sorted(dims)) or '(none)'}")
            return dims[n.id]
        if isinstance(n, ast.BinOp) and type(n.op) in _OPS:
            return _OPS[type(n.op)](ev(n.left), ev(n.right))
        err(f"bad dim expression {expr!r} (ints, dim names, + - * // only)")

    return ev(tree)


def _check_preset(p: dict, dims: dict, err) -> dict:
    if not isinstance(p, dict):
        err(f"a tensor preset is a mapping with {sorted(PRESET_KEYS)}, got {p!r}")
    for k in p:
        if k not in PRESET_KEYS:
            err(f"unknown preset key '{k}'. Valid: {', '.join(sorted(PRESET_KEYS))}")
    if "shape" not in p or not isinstance(p["shape"], list):
        err("a preset needs shape: [dims...]")
    shape = [_eval_dim(s, dims, err) for s in p["shape"]]
    if any(s < 0 for s in shape):
        err(f"negative size in shape {shape}")
    dtype = p.get("dtype", "float")
    if dtype not in PRESET_DTYPES:
        err(f"unknown dtype '{dtype}'. Valid: {', '.join(PRESET_DTYPES)}")
    dt = features.kind_of(dtype)
    if dt == "complex":
        dt = "float"  # generated like float (real and imaginary parts), then made complex
    init = p.get("init", "normal" if dt == "float" else ("randint" if dt == "int" else "randint"))
    if isinstance(init, str):
        init = {init: None}
    if not isinstance(init, dict) or len(init) != 1:
        err(f"init: expected one of {', '.join(INITS)} or {{name: [params]}}, got {init!r}")
    (iname, params), = init.items()
    if iname not in INITS:
        err(f"unknown init '{iname}'. Valid: {', '.join(INITS)}")
    defaults = {"normal": [0.0, 1.0], "uniform": [0.0, 1.0], "randint": [0, 2] if dt == "bool" else [0, 10]}
    if params is None:
        if iname not in defaults:
            err(f"init '{iname}' needs parameters")
        params = defaults[iname]
    if iname in ("fill", "bernoulli") and not isinstance(params, list):
        params = [params]
    if not isinstance(params, list):
        err(f"init {iname}: expected a list of parameters, got {params!r}")
    n = INITS[iname]
    if n is not None and len(params) != n:
        err(f"init {iname}: expected {n} parameters, got {params!r}")
    if iname in ("normal", "uniform", "randint"):
        params = [_eval_dim(v, dims, err) if isinstance(v, str) else v for v in params]
    if iname == "randint" and dt == "float":
        err("init randint needs dtype: int or bool")
    if iname in ("normal", "uniform") and dt != "float":
        err(f"init {iname} needs a float or complex dtype")
    if iname == "bernoulli" and dt != "bool":
        err("init bernoulli needs dtype: bool")
    if iname == "fixed":
        numel = 1
        for s in shape:
            numel *= s
        if len(params) != numel:
            err(f"init fixed: {len(params)} values for shape {shape} ({numel} elements)")
    out = {"shape": shape, "dtype": dtype, "init": {iname: params}}
    _check_layout(p, shape, features.kind_of(dtype), err, out)
    return out


def _check_layout(p: dict, shape: list, dt: str, err, out: dict) -> None:
    """layout: contiguous | transposed (last two axes, >= 2-D) | channels_last (4-D); nonfinite:
    {nan: n, inf: n} seeded positions (float presets). Both are written by fuzzing (parity.analysis.fuzz)."""
    lay = p.get("layout", "contiguous")
    if lay not in LAYOUTS:
        err(f"unknown layout '{lay}'. Valid: {', '.join(LAYOUTS)}")
    if lay == "transposed" and len(shape) < 2 or lay == "channels_last" and len(shape) != 4:
        err(f"layout {lay} needs a {'4-D' if lay == 'channels_last' else '2-D or larger'} shape, got {shape}")
    if lay != "contiguous":
        out["layout"] = lay
    nf = p.get("nonfinite")
    if nf is not None:
        if dt != "float" or not isinstance(nf, dict) or not set(nf) <= {"nan", "inf"} or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in nf.values()):
            err(f"nonfinite: expected {{nan: count, inf: count}} on a float preset, got {nf!r}")
        out["nonfinite"] = {k: nf[k] for k in sorted(nf)}


# ------------------------------------------------------------------------------------------ templates
def _subst(obj, env: dict, err):
    """Replace {var} in strings; a string that is exactly "{var}" becomes the value itself."""
    if isinstance(obj, str):
        m = _VAR.fullmatch(obj)
        if m:
            if m.group(1) not in env:
                err(f"unknown template variable '{{{m.group(1)}}}'. Vars: {', '.join(sorted(env)) or '(none)'}")
            return env[m.group(1)]

        def rep(mm):
            if mm.group(1) not in env:
                err(f"unknown template variable '{{{mm.group(1)}}}'. Vars: {', '.join(sorted(env)) or '(none)'}")
            return str(env[mm.group(1)])

        return _VAR.sub(rep, obj)
    if isinstance(obj, list):
        return [_subst(v, env, err) for v in obj]
    if isinstance(obj, dict):
        return {k: _subst(v, env, err) for k, v in obj.items()}
    return obj


def _combos(case: dict, err) -> list[dict]:
    if "vars" not in case:
        return [{}]
    vs = case["vars"]
    if not isinstance(vs, dict) or not vs or not all(isinstance(v, list) and v for v in vs.values()):
        err("vars: expected a mapping of variable -> non-empty list of values", "vars")
    names = list(vs)
    allc = [dict(zip(names, vals)) for vals in itertools.product(*(vs[n] for n in names))]
    for key in ("only", "skip"):
        for c in case.get(key) or []:
            if not isinstance(c, dict):
                err(f"{key}: expected a list of {{var: value}} mappings, got {c!r}", key)
            for k in c:
                if k not in vs:
                    err(f"{key}: unknown template variable '{k}'. Vars: {', '.join(names)}", key)
    match = lambda combo, c: all(combo[k] == v for k, v in c.items())  # noqa: E731
    if case.get("only"):
        allc = [x for x in allc if any(match(x, c) for c in case["only"])]
    if case.get("skip"):
        allc = [x for x in allc if not any(match(x, c) for c in case["skip"])]
    return allc


# ---------------------------------------------------------------------------------------------- cases
def _is_path(s) -> bool:
    return features.is_file_target(s) or isinstance(s, str) and (s.startswith("aten::") and len(s) > 6
                                   or re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*(:[A-Za-z_][\w.]*)?", s) is not None
                                   and ("." in s or ":" in s))


def _value(v, dims, presets, err, key):
    """A call/constructor argument: $preset -> tensor spec, dim name -> int, lists/dicts recursively."""
    if isinstance(v, str) and v.startswith("$"):
        name = v[1:]
        if name not in presets:
            err(f"unknown preset '{name}'. Presets: {', '.join(sorted(presets)) or '(none)'}", key)
        return {"tensor": dict(presets[name], name=name)}
    if isinstance(v, dict) and set(v) == {"preset"} and isinstance(v["preset"], str):  # {preset: NAME} = $NAME
        return _value("$" + v["preset"], dims, presets, err, key)
    if isinstance(v, dict) and set(v) <= PRESET_KEYS and "shape" in v:  # inline preset
        return {"tensor": dict(_check_preset(v, dims, lambda m: err(m, key)), name="inline")}
    if isinstance(v, dict):  # random / choice / optional / construct (parity.suites.features)
        node = features.value_node(v, lambda x: _value(x, dims, presets, err, key), err, key)
        if node is not None:
            return node
    if isinstance(v, str) and v in dims:
        return dims[v]
    if isinstance(v, list):
        return [_value(x, dims, presets, err, key) for x in v]
    if isinstance(v, dict):
        return {k: _value(x, dims, presets, err, key) for k, x in v.items()}
    return v


def _inputs(case, dims, presets, err):
    ins = case.get("inputs", [])
    if not isinstance(ins, list):
        err("inputs: expected a list of preset names", "inputs")
    out = []
    for x in ins:
        if isinstance(x, str):
            out.append(_value("$" + x.lstrip("$"), dims, presets, err, "inputs"))
        else:
            out.append(_value(x, dims, presets, err, "inputs"))
    return out


def _callable(side: dict, err, key: str) -> dict:
    kinds = [k for k in ("op", "module") if k in side]
    if len(kinds) != 1:
        err("give exactly one of op / module", key)
    k = kinds[0]
    if not _is_path(side[k]):
        err(f"unknown {k} {side[k]!r}: expected aten::name[.overload] or a dotted import path", k)
    return {"kind": k, "target": side[k]}


def _expand_case(raw: dict, ctx: dict, file: str, seen: dict) -> list[dict]:
    rid = raw.get("id") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or not isinstance(rid, str) or not rid:
        raise SuiteError(file, str(rid) if rid else None, "id", f"every case needs a string id, got {raw!r}")

    def err(msg, key=None, cid=rid):
        raise SuiteError(file, cid, key, msg)

    for k in raw:
        if k not in CASE_KEYS:
            err(f"unknown case key. Valid: {', '.join(sorted(CASE_KEYS))}", k)
    kinds = [k for k in KINDS if k in raw]
    if len(kinds) != 1:
        err(f"give exactly one of {', '.join(KINDS)} (got {kinds or 'none'})")
    kind = kinds[0]
    combos = _combos(raw, err)
    body = {k: v for k, v in raw.items() if k not in ("vars", "only", "skip")}
    if "vars" in raw:
        _check_vars(raw["vars"], body, rid, err)
    out = []
    for env in combos:
        cid = _subst(rid, env, lambda m: err(m, "id"))

        def cerr(msg, key=None, cid=cid):
            raise SuiteError(file, cid, key, msg)

        if "/" in cid or not cid.isprintable():
            cerr("a case id may not contain '/' or control characters (results name tensors "
                 "<case id>/<output>)", "id")

        c = {}
        for k, v in body.items():
            c[k] = _subst(v, env, lambda m, k=k: cerr(m, k))
        implied = _strip_import_prefix(c, cerr)
        imports = _declared_imports(c, ctx, cerr)
        imports += [m for m in implied if m not in imports]
        case = {"id": cid, "kind": kind, "file": file,
                "grad": bool(c.get("grad", ctx["grad"])), "loss": c.get("loss", ctx["loss"]),
                "train": bool(c.get("train", False)),
                "timeout_s": float(c.get("timeout_s", ctx["timeout_s"] or 0) or 0)}
        case.update(features.options(c, ctx["spec"], cerr))
        if case["loss"] not in LOSSES:
            cerr(f"unknown loss '{case['loss']}'. Valid: {', '.join(LOSSES)}", "loss")
        case.update(_kind_fields(kind, c, file, ctx, cerr))
        if "reference" in c:
            if kind != "op" or not _is_path(c["reference"]):
                cerr("reference: an op case's reference implementation, import:pkg.mod:fn (numpy or torch, "
                     "called in float64)", "reference")
            case["reference"] = c["reference"]
        _check_code(case, imports, cerr)
        if cid in seen:
            cerr(f"duplicate case id (also in {seen[cid]})", "id")
        seen[cid] = file
        out.append(case)
    return out


def _check_vars(names, body: dict, rid: str, err) -> None:
    """A template's variables: each used in the case, each named in its id (ids stay unique)."""
    used = set(_VAR.findall(yaml.safe_dump(body)))
    for v in names:
        if v not in used:
            err(f"template variable '{v}' is never used", "vars")
    if not set(names) <= set(_VAR.findall(rid)):
        err("a template id must name every variable (e.g. 'softmax_d{dim}') so case ids are unique", "id")


def _kind_fields(kind: str, c: dict, file: str, ctx: dict, cerr) -> dict:
    """The fields of a case that depend on its kind (onnx, opinfo, module, op/gradcheck, pair)."""
    dims, presets = ctx["dims"], ctx["presets"]
    f: dict = {}
    if kind == "onnx":
        f.update(_onnx_case(c["onnx"], file, cerr))
    elif kind == "opinfo":
        oi = c["opinfo"]
        if not isinstance(oi, dict) or "name" not in oi:
            cerr("opinfo: expected {name, variant, sample}", "opinfo")
        f["opinfo"] = {"name": oi["name"], "variant": oi.get("variant", ""), "sample": int(oi.get("sample", 0))}
        f["label"] = "opinfo:" + oi["name"] + (f".{oi['variant']}" if oi.get("variant") else "")
        f["grad"] = bool(c.get("grad", False))
    else:
        ins = _inputs(c, dims, presets, cerr)
        args = c.get("args", [])
        kwargs = c.get("kwargs", {})
        if not isinstance(args, list):
            cerr("args: expected a list", "args")
        if not isinstance(kwargs, dict):
            cerr("kwargs: expected a mapping", "kwargs")
        args = _value(args, dims, presets, cerr, "args")
        kwargs = _value(kwargs, dims, presets, cerr, "kwargs")
        if kind == "module":
            if not _is_path(c["module"]) or c["module"].startswith("aten::"):
                cerr(f"unknown module {c['module']!r}: expected a class import path", "module")
            f.update(target=c["module"], ctor_args=args, ctor_kwargs=kwargs, call_args=ins, call_kwargs={})
            f["label"] = c["module"]
        elif kind in ("op", "gradcheck"):
            if not _is_path(c[kind]):
                cerr(f"unknown {kind} {c[kind]!r}: expected aten::name[.overload] or a dotted import path", kind)
            f.update(target=c[kind], call_args=ins + args, call_kwargs=kwargs)
            f["label"] = c[kind]
        else:  # pair
            sides = _pair_sides(c["pair"], dims, presets, cerr)
            f.update(pair=sides, call_args=ins, call_kwargs={})
            f["label"] = f"{sides['a']['target']} vs {sides['b']['target']}"
    return f


def _pair_sides(pr, dims, presets, cerr) -> dict:
    """`pair: {a: {...}, b: {...}}`: each side's callable and its args/kwargs."""
    if not isinstance(pr, dict) or set(pr) != {"a", "b"}:
        cerr("pair: expected {a: {...}, b: {...}}", "pair")
    sides = {}
    for s in ("a", "b"):
        side = pr[s]
        if not isinstance(side, dict):
            cerr(f"pair.{s}: expected a mapping", f"pair.{s}")
        for k in side:
            if k not in PAIR_SIDE_KEYS:
                cerr(f"unknown key. Valid: {', '.join(sorted(PAIR_SIDE_KEYS))}", f"pair.{s}.{k}")
        d = _callable(side, cerr, f"pair.{s}")
        d["args"] = _value(side.get("args", []), dims, presets, cerr, f"pair.{s}.args")
        d["kwargs"] = _value(side.get("kwargs", {}), dims, presets, cerr, f"pair.{s}.kwargs")
        sides[s] = d
    return sides


def _onnx_case(o, file: str, cerr) -> dict:
    """`onnx: {path, op}`: a folder inside the repository holding model.onnx and test_data_set_<k>/
    (ONNX's backend-test layout); `op` labels the case in the coverage matrix (default: the folder)."""
    if isinstance(o, str):
        o = {"path": o}
    if not isinstance(o, dict) or not isinstance(o.get("path"), str) or not set(o) <= {"path", "op"}:
        cerr(f"onnx: expected {{path: FOLDER, op: NAME}} (a folder with model.onnx and test_data_set_0/), got {o!r}",
             "onnx")
    p = Path(o["path"])
    root = features.repo_root(file)
    if p.is_absolute() or ".." in p.parts:
        cerr(f"onnx.path: {o['path']!r}: a folder inside the repository, relative to its root", "onnx.path")
    if not (root / p / "model.onnx").is_file():
        cerr(f"onnx.path: {root / p}/model.onnx: no such file", "onnx.path")
    return {"onnx": {"path": str(p)}, "label": "onnx::" + str(o.get("op") or p.name), "grad": False}


def expand_section(name: str, section: dict, file: str, root: Path | None = None, default_timeout=None,
                   _stack: tuple = (), _seen: dict | None = None) -> list[dict]:
    """Every case of a suite section (its includes first), validated structurally."""
    seen = {} if _seen is None else _seen
    if not isinstance(section, dict):
        raise SuiteError(file, None, None, f"suite '{name}': expected a mapping with {sorted(SUITE_KEYS)}")
    for k in section:
        if k not in SUITE_KEYS:
            raise SuiteError(file, None, k, f"unknown suite key. Valid: {', '.join(sorted(SUITE_KEYS))}")
    check_tolerances(section.get("tolerances") or [], file)
    spec = section.get("spec")
    if not isinstance(spec, dict):
        raise SuiteError(file, None, "spec", "missing spec: {dims, presets, cases, ...}")
    for k in spec:
        if k not in SPEC_KEYS:
            raise SuiteError(file, None, f"spec.{k}", f"unknown key. Valid: {', '.join(sorted(SPEC_KEYS))}")
    dims = spec.get("dims") or {}
    if not isinstance(dims, dict):
        raise SuiteError(file, None, "spec.dims", "expected a mapping of name -> int")
    rdims = {}
    for k, v in dims.items():
        rdims[k] = _eval_dim(v, rdims, lambda m, k=k: (_ for _ in ()).throw(SuiteError(file, None, f"spec.dims.{k}", m)))
    presets = {}
    for k, v in (spec.get("presets") or {}).items():
        def perr(m, k=k):
            raise SuiteError(file, None, f"spec.presets.{k}", m)
        presets[k] = _check_preset(v, rdims, perr)
    ctx = {"dims": rdims, "presets": presets, "grad": bool(spec.get("grad", False)),
           "imports": _spec_imports(spec, file), "spec": spec,
           "loss": spec.get("loss", "sum"), "timeout_s": spec.get("timeout_s", default_timeout)}
    if ctx["timeout_s"] is not None and (not isinstance(ctx["timeout_s"], (int, float)) or ctx["timeout_s"] <= 0):
        raise SuiteError(file, None, "spec.timeout_s", f"expected a positive number, got {ctx['timeout_s']!r}")
    cases = []
    inc = spec.get("include") or []
    if not isinstance(inc, list):
        raise SuiteError(file, None, "spec.include", "expected a list of suite names")
    for other in inc:
        if other in _stack + (name,):
            raise SuiteError(file, None, "spec.include", f"include cycle: {' -> '.join(_stack + (name, other))}")
        try:
            sec, f = load_section(other, root)
        except SuiteError as e:
            raise SuiteError(file, None, "spec.include", str(e)) from None
        cases += expand_section(other, sec, f, root, default_timeout, _stack + (name,), seen)
    raw = spec.get("cases") or []
    if not isinstance(raw, list):
        raise SuiteError(file, None, "spec.cases", "expected a list of cases")
    for rc in raw:
        cases += _expand_case(rc, ctx, file, seen)
    return cases


# ------------------------------------------------------------------------------------ code in config
def _spec_imports(spec: dict, file: str) -> list[str]:
    """The suite-wide `spec.import` declaration (modules its cases may import and run)."""
    try:
        return imports.declared(spec.get("import"), "spec.import")
    except imports.NotAllowed as e:
        raise SuiteError(file, None, "spec.import", str(e)) from None


def _strip_import_prefix(c: dict, cerr) -> list[str]:
    """`op: import:pkg.mod:fn` / `reference: import:pkg.mod:fn`: the prefix declares pkg.mod (as
    `import: pkg.mod` would); the target becomes pkg.mod:fn. Returns the declared modules."""
    out = []
    for k in ("op", "reference"):
        v = c.get(k)
        if isinstance(v, str) and v.startswith(IMPORT_PREFIX):
            v = v[len(IMPORT_PREFIX):]
            mod = v.partition(":")[0] if ":" in v else v.rpartition(".")[0]
            if not mod or not _is_path(v):
                cerr(f"expected import:pkg.module:function, got {c[k]!r}", k)
            c[k] = v
            out.append(mod)
    return out


def _declared_imports(c: dict, ctx: dict, cerr) -> list[str]:
    """A case's `import:` plus its suite's."""
    try:
        own = imports.declared(c.get("import"), "import")
    except imports.NotAllowed as e:
        cerr(str(e), "import")
    return own + [m for m in ctx["imports"] if m not in own]


def _check_code(case: dict, declared: list[str], cerr) -> None:
    """Every target of an expanded case is in the torch namespaces or under a declared import (whose
    file is located and read for the name, never imported); the declaration travels with the case
    (`imports`) so the worker checks it again before importing."""
    if case["kind"] == "pair":
        targets = [(f"pair.{s}.{d['kind']}", d["kind"], d["target"]) for s, d in case["pair"].items()]
    elif case["kind"] in ("opinfo", "onnx"):
        targets = []
    else:
        targets = [(case["kind"], case["kind"], case["target"])]
    named = {x[2] for x in targets}
    targets += [("construct", "module", t) for t in features.case_targets(case) if t not in named]
    if case.get("reference"):
        targets.append(("reference", "op", case["reference"]))
    for key, kind, target in targets:
        try:
            search = imports.search_path([str(features.repo_root(case["file"]))])
            if features.is_file_target(target):
                f = features.check_file_target(target, features.repo_root(case["file"]))
            else:  # located from the suite's repository root first: where the workers run
                hit = imports.check_suite_target(target, kind, declared, search)
                spec_ = imports.locate(hit[0], search) if hit and not imports.torch_target(target, kind) else None
                f = Path(spec_.origin) if spec_ is not None and spec_.has_location and spec_.origin else None
        except (imports.NotAllowed, ValueError) as e:
            cerr(str(e), key)
        why = features.not_a_class(target, f) if kind == "module" and key == "module" else None
        if why:
            cerr(why, key)
    if declared:
        case["imports"] = declared


def check_tolerances(rules, file: str) -> None:
    if not isinstance(rules, list):
        raise SuiteError(file, None, "tolerances", "expected a list of rules {dtype, case, kind, atol, rtol}")
    for i, r in enumerate(rules):
        key = f"tolerances[{i}]"
        if not isinstance(r, dict):
            raise SuiteError(file, None, key, "expected a mapping")
        for k in r:
            if k not in TOL_RULE_KEYS:
                raise SuiteError(file, None, f"{key}.{k}", f"unknown key. Valid: {', '.join(sorted(TOL_RULE_KEYS))}")
        if "atol" not in r or "rtol" not in r:
            raise SuiteError(file, None, key, "give atol and rtol together (torch.testing convention)")
        for k in ("atol", "rtol"):
            if not isinstance(r[k], (int, float)) or isinstance(r[k], bool) or r[k] < 0:
                raise SuiteError(file, None, f"{key}.{k}", f"expected a number >= 0, got {r[k]!r}")
        if r.get("kind", "out") not in TOL_KINDS:
            raise SuiteError(file, None, f"{key}.kind", f"unknown kind '{r['kind']}'. Valid: {', '.join(TOL_KINDS)}")


def check_selected(p: dict) -> None:
    """Every suite selected in params `p` expands (structure only); raise SuiteError 'suites.<name>:
    ...' on the first that does not. Called where suites are handled (the Hydra plugin at compose,
    `parity check`), not by parity.config.params, so no model stage depends on the suite format."""
    suites = p.get("suites") or {}
    if not isinstance(suites, dict):
        raise SuiteError("suites", None, None, f"expected a mapping (a multi-select group), got {suites!r}")
    for name, sec in suites.items():
        if "-" in name or "/" in name:
            raise SuiteError(f"suites.{name}", None, None, "suite names must not contain '-' or '/' (they build "
                             "stage keys)")
        if isinstance(sec, dict) and "tolerances" not in sec:
            raise SuiteError(f"suites.{name}", None, None, f"missing key 'tolerances' (conf/suites/{name}.yaml): "
                             f"give `tolerances: []` for none (the suite's diff stages depend on that key)")
        try:
            expand(name, copy.deepcopy(sec))
        except SuiteError as e:
            raise SuiteError(f"suites.{name}", None, None, str(e)) from None


def load_or_die(path) -> dict:
    """params.yaml for a suite stage: parity.config.params.load_or_die, then the selected suites checked
    (check_selected), a bad one said in one line (exit 2) before the stage writes anything."""
    p = config.load_or_die(path)
    try:
        check_selected(p)
    except SuiteError as e:
        config.die(e)
    return p


def expand(name: str, section: dict | None = None, root: Path | None = None, default_timeout=None) -> list[dict]:
    """Cases of suite `name`: from `section` (params.yaml's suites.<name>) or conf/suites/<name>.yaml."""
    if section is None:
        section, file = load_section(name, root)
    else:
        file = _rel(suite_file(name, root))
    return expand_section(name, section, file, root, default_timeout)


def tolerance_for(p: dict, suite: str, dtype: str, case_id: str, kind: str) -> tuple[float, float, str]:
    """(atol, rtol, source key): dtypes.<d>.tol, grads x suites_run.grad_tol_scale, then the suite's
    rules in order (last match wins)."""
    scale = float(schema.section(schema.SuitesRun, p.get("suites_run")).grad_tol_scale) if kind == "grad" else None
    return tolerance.resolve(p["dtypes"][dtype]["tol"], f"dtypes.{dtype}.tol", p["suites"][suite].get("tolerances"),
                             f"suites.{suite}.tolerances", dtype, kind, scale, "suites_run.grad_tol_scale",
                             case=case_id)
