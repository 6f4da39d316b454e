"""`parity suite import-opdiff FILE.yaml`: convert an opdiff test suite (github.com/0xShug0/opdiff,
testgen/testcase_spec.md) into a parity suite (conf/suites/<name>.yaml), saying per case what could
not be converted and why. Light: yaml only (never torch, never the suite's code).

What maps to what (opdiff -> parity):
  dims, include                    dims (includes merged in, relative to the including file)
  tensor presets                   presets; kind/dtype float32|float16 -> `float` (follows the cell, as
                                   opdiff's fp16 presets cast float inputs), complex64 -> `complex`, other
                                   dtypes fixed; init normal/uniform/randint/bernoulli/zeros/ones
  const_tensor, scalar_tensor      a preset with `init: {fixed: [...]}` / shape [] (rank 0)
  other presets (scalar, list...)  inlined where they are referenced
  scalar (sampled), optional       {uniform}, {randint} (opdiff's int range is inclusive), {bernoulli},
                                   {choice}, {optional: ..., p_none}; const/int_list -> the literal
  list {len, elem}, tuple          a list of `len` independent draws of elem
  op: aten::name                   op case, `in` -> args, kwargs -> kwargs
  module / construct               module case (args/kwargs = constructor), `{construct: ...}` nodes
  file:path.py::Symbol             kept: a path relative to the repository root (copy the files there)
  template_module (vars, cases)    vars + `only:`; ids `<id>__k=v__...` as opdiff names them
  template_compare_pair            a `pair` case (A vs B on the same backend; `common` args merged)
The suite exports with the dynamo exporter at opset 18, as opdiff's ONNX backend does.
Dropped with a note: `impl` labels, `device: cpu`, `out` (opdiff does not check it),
`cast_input0_to_complex` (complex inputs travel natively: real [..., 2] views into ONNX),
`requires_grad` (set `grad: true` on the case for backward checks).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

from parity.core.io import write_text

FLOAT_FOLLOW = {"float32", "float16", "bfloat16", "float", "half"}
INT_FOLLOW = {"int64", "long"}
OPDIFF_TEST_KEYS = {"id", "impl", "op", "in", "kwargs", "out", "device", "cast_input0_to_complex"}


NAME = re.compile(r"[A-Za-z0-9_]+")  # as conf option names: a suite name is a file name and DVC stage name


class Unconvertible(ValueError):
    """A node or case that has no parity equivalent (the message says why)."""

    def __init__(self, msg: str, located: bool = False):
        super().__init__(msg)
        self.located = located  # the message starts with FILE:LINE:COL


def load(path: Path, _stack=()) -> dict:
    """An opdiff YAML with its includes merged (tests concatenated, dims/presets combined)."""
    path = path.resolve()
    if path in _stack:
        raise Unconvertible(f"include cycle: {' -> '.join(map(str, _stack + (path,)))}")
    try:
        doc = yaml.safe_load(path.read_text())
    except UnicodeDecodeError as e:
        raise Unconvertible(f"not an opdiff suite (not UTF-8 text: {e.reason})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        raise Unconvertible(f"{path}{where}: {getattr(e, 'problem', None) or e}", located=True) from None
    if not isinstance(doc, dict) or not ({"tests", "include"} & set(doc)):
        raise Unconvertible("not an opdiff suite (a YAML mapping with tests: and optional dims:, presets:, "
                            f"include:); {_found(doc)}")
    if not isinstance(doc.get("tests") or [], list):
        raise Unconvertible(f"not an opdiff suite: tests: is a {type(doc['tests']).__name__}, not a list")
    inc = doc.get("include") or []
    merged = {"dims": {}, "presets": {}, "tests": []}
    for f in [inc] if isinstance(inc, str) else inc:
        sub = load(path.parent / f, _stack + (path,))
        for k in ("dims", "presets"):
            merged[k].update(sub[k])
        merged["tests"] += sub["tests"]
    merged["dims"].update(doc.get("dims") or {})
    merged["presets"].update(doc.get("presets") or {})
    merged["tests"] += doc.get("tests") or []
    return merged


def _found(doc) -> str:
    if isinstance(doc, dict):
        return f"found the keys {sorted(map(str, doc))[:6]}"
    return f"found a {type(doc).__name__}"


class Converter:
    def __init__(self, doc: dict):
        self.dims = dict(doc.get("dims") or {})
        self.raw_presets = dict(doc.get("presets") or {})
        self.presets: dict = {}
        self.notes: list[str] = []
        for name, node in self.raw_presets.items():
            if self._is_tensor(node):
                self.presets[name] = self.tensor(node)

    # ------------------------------------------------------------------------------------------ nodes
    @staticmethod
    def _type(node) -> str | None:
        if not isinstance(node, dict):
            return None
        if "type" in node:
            return node["type"]
        if "ref" in node:
            return "ref"
        if set(node) == {"var"}:
            return "var"
        return None

    def _is_tensor(self, node) -> bool:
        return self._type(node) in ("tensor", "const_tensor", "scalar_tensor")

    def _num(self, v):
        return self.dims.get(v, v) if isinstance(v, str) else v

    def _dtype(self, node) -> str:
        dt = str(node.get("dtype") or node.get("kind") or "float")
        if dt in FLOAT_FOLLOW:
            return "float"
        if dt in INT_FOLLOW or dt == "int":
            return "int"
        if dt == "complex64":
            return "complex"
        if dt in ("bool", "float64", "complex128", "int8", "int16", "int32", "uint8"):
            return dt
        raise Unconvertible(f"tensor dtype {dt!r} has no parity preset dtype")

    def tensor(self, node: dict) -> dict:
        t = node.get("type", "tensor")
        dt = self._dtype(node)
        shape = [] if t == "scalar_tensor" else list(node.get("shape") or [])
        if t != "scalar_tensor" and not shape and "value" not in node:
            raise Unconvertible("a tensor needs a non-empty shape")
        out = {"shape": shape, "dtype": dt}
        if "value" in node and node["value"] is not None:
            vals = _flatten(node["value"])
            if not shape and t != "scalar_tensor":
                out["shape"] = _shape_of(node["value"])
            out["init"] = {"fixed": vals}
            return out
        init = node.get("init") or {"bool": "bernoulli", "int": "randint"}.get(dt, "normal")
        lo, hi = self._num(node.get("low")), self._num(node.get("high"))
        if init == "normal":
            out["init"] = {"normal": [float(node.get("mean", 0.0)), float(node.get("std", 1.0))]}
        elif init == "uniform":
            out["init"] = {"uniform": [float(lo if lo is not None else 0.0), float(hi if hi is not None else 1.0)]}
        elif init == "randint":  # opdiff: torch.randint(low, high) for tensors, high exclusive
            out["init"] = {"randint": [int(lo if lo is not None else 0), int(hi if hi is not None else 10)]}
        elif init == "bernoulli":
            out["init"] = {"bernoulli": float(node.get("p", 0.5))}
        elif init in ("zeros", "ones"):
            out["init"] = {"fill": 0 if init == "zeros" else 1}
        else:
            raise Unconvertible(f"tensor init {init!r} has no parity equivalent")
        if node.get("requires_grad"):
            self.notes.append("requires_grad dropped (set `grad: true` on the case for backward checks)")
        return out

    def value(self, node):
        """A parity argument value for an opdiff node."""
        t = self._type(node)
        if t is None:
            if isinstance(node, list):
                return [self.value(x) for x in node]
            if isinstance(node, dict):
                return {k: self.value(v) for k, v in node.items()}
            return node
        if t == "var":
            name = node.get("var", node.get("name"))
            return f"{{{name}}}"
        if t == "ref":
            ref = node["ref"]
            if isinstance(ref, dict):  # {ref: {var: name}}: a template variable naming a preset
                # (not "${name}": suite files are Hydra conf files, where ${...} is an interpolation)
                return {"preset": f"{{{ref.get('var', ref.get('name'))}}}"}
            if ref in self.presets:
                return f"${ref}"
            if ref in self.raw_presets:
                return self.value(self.raw_presets[ref])
            raise Unconvertible(f"unknown preset {ref!r}")
        if t in ("tensor", "const_tensor", "scalar_tensor"):
            return self.tensor(node)
        if t == "const":
            return node.get("value")
        if t == "int_list":
            return [self._num(x) for x in node.get("elems") or []]
        if t == "tuple":
            return [self.value(x) for x in node.get("elems") or []]
        if t == "list":
            n = self._num(node.get("len", 0))
            return [self.value(node["elem"]) for _ in range(int(n))]
        if t == "optional":
            p = float(node.get("p_none", 0.0))
            inner = self.value(node["elem"])
            return inner if p == 0 else {"optional": inner, "p_none": p}
        if t == "scalar":
            return self.scalar(node)
        if t == "construct":
            return {"construct": node["path"], "args": self.value(node.get("args") or []),
                    "kwargs": self.value(node.get("kwargs") or {})}
        raise Unconvertible(f"node type {t!r} has no parity equivalent")

    def scalar(self, node: dict):
        if node.get("value") is not None:
            return node["value"]
        if node.get("choices") is not None:
            return {"choice": list(node["choices"])}
        kind = str(node.get("kind") or node.get("dtype") or "float")
        lo, hi = self._num(node.get("low")), self._num(node.get("high"))
        if kind.startswith("int"):  # opdiff: randint(low, high + 1), high inclusive
            return {"randint": [int(lo), int(hi) + 1]}
        if kind == "bool":
            return {"bernoulli": float(node.get("p", 0.5))}
        return {"uniform": [float(lo), float(hi)]}

    # ------------------------------------------------------------------------------------------ cases
    def module_side(self, op: dict) -> dict:
        side = {"module": op["path"]}
        if op.get("args"):
            side["args"] = self.value(op["args"])
        if op.get("kwargs"):
            side["kwargs"] = self.value(op["kwargs"])
        return side

    def case(self, t: dict, index: int) -> tuple[dict, list[str]]:
        """(parity case, notes) of one opdiff test; raises Unconvertible."""
        self.notes = []
        extra = set(t) - OPDIFF_TEST_KEYS
        if extra:
            raise Unconvertible(f"unknown test keys {sorted(extra)}")
        op = t.get("op")
        base = t.get("id") or (f"{op.replace('::', '_')}_{index}" if isinstance(op, str) else f"test_{index}")
        ins = [self.value(x) for x in t.get("in") or []]
        kwargs = {k: self.value(v) for k, v in (t.get("kwargs") or {}).items()}
        for k, why in (("impl", "an implementation label"), ("out", "opdiff does not check it either"),
                       ("cast_input0_to_complex", "complex inputs travel natively (real [..., 2] views in ONNX)")):
            if k in t:
                self.notes.append(f"{k}: {t[k]!r} dropped ({why})")
        if t.get("device", "cpu") != "cpu":
            self.notes.append(f"device {t['device']!r} dropped (the provider decides the device)")
        if isinstance(op, str):
            c = {"id": base, "op": op}
            if ins:
                c["args"] = ins
            if kwargs:
                c["kwargs"] = kwargs
            return c, self.notes
        if not isinstance(op, dict):
            raise Unconvertible(f"op: expected an operator name or a module node, got {op!r}")
        kind = op.get("type")
        if kwargs and kind != "template_compare_pair":
            raise Unconvertible("forward kwargs of a module test have no parity equivalent (inputs are positional)")
        if kind == "module":
            c = {"id": base, **self.module_side(op)}
        elif kind == "template_module":
            c = {"id": base, **self.module_side(op)}
            self._template(c, op)
        elif kind == "template_compare_pair":
            common = op.get("common") or {}
            sides = {}
            for s in ("a", "b"):
                side = dict(op[s])
                if side.get("type", "module") != "module":
                    raise Unconvertible(f"pair side {s}: only module sides convert, got {side.get('type')!r}")
                if side.get("impl"):
                    self.notes.append(f"pair side {s}: impl {side['impl']!r} dropped (a label)")
                sides[s] = self.module_side({"path": side["path"], "args": side.get("args", common.get("args")),
                                             "kwargs": {**(common.get("kwargs") or {}), **(side.get("kwargs") or {})}})
            c = {"id": base, "pair": sides}
            self._template(c, op)
        else:
            raise Unconvertible(f"op type {kind!r} has no parity equivalent")
        if ins:
            c["inputs"] = ins
        return c, self.notes

    def _template(self, c: dict, op: dict) -> None:
        vs = op.get("vars") or {}
        if not vs:
            return
        keys = sorted(vs)  # opdiff names expanded tests <id>__k=v__k=v with the keys sorted
        c["id"] = c["id"] + "".join(f"__{k}={{{k}}}" for k in keys)
        c["vars"] = {k: list(v) for k, v in vs.items()}
        if op.get("cases"):
            c["only"] = [dict(x) for x in op["cases"]]


def _flatten(v) -> list:
    return [y for x in v for y in _flatten(x)] if isinstance(v, list) else [v]


def _shape_of(v) -> list:
    return [len(v), *_shape_of(v[0])] if isinstance(v, list) and v else []


def convert(path: Path, name: str) -> tuple[dict, list[tuple[str, str, str]]]:
    """({name: suite section}, report): report rows (opdiff id, 'converted' | 'note' | 'NOT CONVERTED',
    detail)."""
    doc = load(path)
    if not doc["tests"]:
        raise Unconvertible("not an opdiff suite: it (with its includes) has no tests")
    conv = Converter(doc)
    cases, report = [], []
    for i, t in enumerate(doc["tests"]):
        tid = t.get("id") or f"#{i}"
        try:
            c, notes = conv.case(t, i)
        except (Unconvertible, KeyError, TypeError, ValueError) as e:
            report.append((tid, "NOT CONVERTED", f"{type(e).__name__}: {e}" if not isinstance(e, Unconvertible)
                           else str(e)))
            continue
        cases.append(c)
        report.append((tid, "note" if notes else "converted", "; ".join(notes)))
    # opdiff's ONNX backend exports with the dynamo exporter at opset 18 (backends/onnx_backend.py)
    spec = {"export": {"exporter": "dynamo", "opset": 18}, "dims": conv.dims, "presets": conv.presets, "cases": cases}
    return {name: {"tolerances": [], "spec": spec}}, report


def file_targets(section: dict) -> list[str]:
    """The file: paths a converted suite names (they must exist relative to the repository root)."""
    out = []

    def walk(x):
        if isinstance(x, str) and x.startswith("file:"):
            out.append(x[5:].split("::")[0])
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(section)
    return sorted(set(out))


def _one_line(src: Path, e: Exception) -> str:
    msg = " ".join(str(e).split())
    return msg if getattr(e, "located", False) else f"{src}: {msg}"


def main(argv=None, prog: str = "parity suite import-opdiff") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", help="an opdiff suite (YAML with dims/presets/tests)")
    ap.add_argument("--name", help="suite name (default: the file's stem, '-' -> '_')")
    ap.add_argument("--out", help="where to write (default: conf/suites/<name>.yaml)")
    ap.add_argument("--force", action="store_true", help="overwrite an existing suite file")
    a = ap.parse_args(argv)
    src = Path(a.file)
    name = a.name or src.stem.replace("-", "_")
    if not src.is_file():
        print(f"{prog}: error: no such file {src}", file=sys.stderr)
        return 2
    if not NAME.fullmatch(name):
        print(f"{prog}: error: suite name {name!r} is not a plain name ([A-Za-z0-9_]; it becomes "
              f"conf/suites/<name>.yaml and DVC stage names): pass --name", file=sys.stderr)
        return 2
    out = Path(a.out or f"conf/suites/{name}.yaml")
    if out.exists() and not a.force:
        print(f"{prog}: error: {out} exists (a suite named {name!r}); pass --name NEW or --force to overwrite it",
              file=sys.stderr)
        return 2
    try:
        doc, report = convert(src, name)
    except Unconvertible as e:
        print(f"{prog}: error: {_one_line(src, e)}", file=sys.stderr)
        return 2

    if not doc[name]["spec"]["cases"]:  # an empty suite would replace a working one (--force): write nothing
        for tid, status, detail in report:
            print(f"{tid}\t{status}" + (f"\t{detail}" if detail else ""))
        print(f"{prog}: error: none of the {len(report)} opdiff tests in {src} converted; {out} was not "
              f"{'replaced' if out.exists() else 'written'}", file=sys.stderr)
        return 1
    head = (f"# converted from the opdiff suite {src.name} by `parity suite import-opdiff`\n"
            f"# file: paths are relative to the repository root\n")
    write_text(out, head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120))
    for tid, status, detail in report:
        print(f"{tid}\t{status}" + (f"\t{detail}" if detail else ""))
    missing = [f for f in file_targets(doc[name]) if not Path(f).is_file()]
    for f in missing:
        print(f"note: the suite names file:{f}, which is not in this repository yet (copy it there)")
    bad = sum(1 for _, s, _ in report if s == "NOT CONVERTED")
    print(f"{prog}: {len(report)} opdiff tests -> {len(report) - bad} cases in {out}; "
          f"{sum(1 for _, s, _ in report if s == 'note')} with notes, {bad} not converted")
    return 1 if bad else 0
