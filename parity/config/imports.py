"""Code named in config: which import paths a suite op or a provider runner may name, and where a
module is, found without importing it. Light: stdlib only (never torch, never the named module).

Every config key that names a module is code execution (suite ops/modules/gradchecks, a provider's
`runner:`, a model's `arch.source: import`). Two namespaces need no declaration:
  suite targets   aten::name[.overload], torch.<fn>, torch.nn.functional.<fn>, torch.special.<fn>,
                  torch.linalg.<fn>, torch.fft.<fn>, torch.nn.<Module> (module cases), and our own
                  test ops parity.suites.testops (the selftest/modules suites). Not the rest of
                  parity.* (sweep, cli, io run subprocesses and write files).
  runners         parity.backends.<module>:<Class> (the registry: conf/providers/*.yaml)
Anything else runs only where the config declares it with `import: <module>` (or a list): the
case, the suite's `spec`, or the provider names the module (or a package holding it) as code to run.
"""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import os
import re
import sys
from pathlib import Path

TORCH_FN_NAMESPACES = ("torch", "torch.nn.functional", "torch.special", "torch.linalg", "torch.fft")
TORCH_MODULE_NAMESPACE = "torch.nn"
OWN_MODULES = ("parity.suites.testops",)
# torch.<fn> that read/write files or load code: refused even though they are in the torch namespace
TORCH_DENIED = ("load", "save", "from_file", "compile", "PyTorchFileReader", "PyTorchFileWriter",
                "import_ir_module", "import_ir_module_from_buffer", "hub", "jit", "package", "utils", "ops",
                "classes", "library", "cuda", "distributed", "multiprocessing", "backends")
RUNNER_NAMESPACE = "parity.backends."
ALLOWED_SUITE = ("aten::, torch.*, torch.nn.functional.*, torch.special.*, torch.linalg.*, torch.fft.*, "
                 "torch.nn.<Module> (module cases), parity.suites.testops")
_IDENT = r"[A-Za-z_]\w*"
_DOTTED = re.compile(rf"{_IDENT}(\.{_IDENT})*")


class NotAllowed(ValueError):
    """A target outside the allowed namespaces, not declared with `import:`, or not found."""


def declared(value, where: str) -> list[str]:
    """The modules an `import:` value declares: a dotted module name or a list of them."""
    if value is None:
        return []
    vals = [value] if isinstance(value, str) else value
    if not isinstance(vals, list) or not vals or not all(isinstance(v, str) and _DOTTED.fullmatch(v) for v in vals):
        raise NotAllowed(f"{where}: expected a module name (e.g. mypkg.ops) or a list of them, got {value!r}")
    return list(vals)


def _under(mod: str, pkg: str) -> bool:
    return mod == pkg or mod.startswith(pkg + ".")


def torch_target(target: str, kind: str) -> bool:
    """True if `target` (dotted or 'mod:attr') is in the torch namespaces for this kind of case."""
    full = target.replace(":", ".")
    ns, _, name = full.rpartition(".")
    if not re.fullmatch(_IDENT, name or "") or name in TORCH_DENIED:
        return False
    if kind == "module":
        return ns == TORCH_MODULE_NAMESPACE
    return ns in TORCH_FN_NAMESPACES


def split_target(target: str, imports: list[str], search=None) -> tuple[str, str]:
    """(module, attribute path) of a non-aten target. 'mod:attr' is explicit; for 'a.b.c' the
    longest prefix that is a torch namespace, one of `imports` (or a module under one) that can be
    located, is the module."""
    if ":" in target:
        mod, attr = target.split(":", 1)
        return mod, attr
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        mod = ".".join(parts[:i])
        if mod in TORCH_FN_NAMESPACES or mod == TORCH_MODULE_NAMESPACE:
            return mod, ".".join(parts[i:])
        if mod in OWN_MODULES or any(_under(mod, d) for d in imports) and (
                mod in imports or locate(mod, search) is not None):
            return mod, ".".join(parts[i:])
    return parts[0], ".".join(parts[1:])


def check_suite_target(target: str, kind: str, imports: list[str], search=None,
                       files: bool = True) -> tuple[str, str] | None:
    """None for aten::; else (module, attr) after checking the namespace rule and (files=True), for
    our own or a declared module, that its file exists and defines attr (read, not imported).
    Raises NotAllowed."""
    if target.startswith("aten::"):
        return None
    mod, attr = split_target(target, imports, search)
    if torch_target(target, kind):
        return mod, attr
    if mod not in OWN_MODULES and not any(_under(mod, d) for d in imports):
        name = target.replace(":", ".").rpartition(".")[2]
        if _under(mod, "torch") and name in TORCH_DENIED:
            raise NotAllowed(f"{kind} '{target}' reads/writes files or loads code; suites may not call it "
                             f"unless the case declares `import: {mod}`")
        if kind != "module" and target.replace(":", ".").rpartition(".")[0] == TORCH_MODULE_NAMESPACE:
            raise NotAllowed(f"{kind} '{target}': torch.nn.<Module> classes are for module cases "
                             f"(module: {target}, args: [constructor args])")
        how = (f"declare it as code to run with `import: {mod}` on the case (or the suite's spec)"
               if not imports else f"its module '{mod}' is not under the declared import {', '.join(imports)}")
        raise NotAllowed(f"{kind} '{target}' is not in the torch namespaces ({ALLOWED_SUITE}): "
                         f"it would import and run '{mod}'; {how}")
    if files:
        check_defined(mod, attr, search)
    return mod, attr


def search_path(extra=()) -> list[str]:
    """Where the stages and suite workers import from: the working directory (stages run at the repo
    root with `python -m`), this checkout, then sys.path."""
    here = str(Path(__file__).resolve().parents[2])
    out = []
    for p in [*extra, os.getcwd(), here, *sys.path]:
        if p and p not in out:
            out.append(p)
    return out


def locate(module: str, search=None):
    """The ModuleSpec of `module` found by the path/meta-path finders without executing any module
    (importlib.util.find_spec would import the parent packages), or None."""
    spec, path = None, search_path() if search is None else list(search)
    name = ""
    for part in module.split("."):
        name = f"{name}.{part}" if name else part
        if path is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None and name == part:
            for finder in sys.meta_path:  # builtins, frozen modules, editable-install finders
                if finder is importlib.machinery.PathFinder or not hasattr(finder, "find_spec"):
                    continue
                try:
                    spec = finder.find_spec(name, None)
                except (ImportError, ValueError, AttributeError):
                    spec = None
                if spec is not None:
                    break
        if spec is None:
            return None
        path = list(spec.submodule_search_locations or []) or None
    return spec


def _top_names(tree: ast.Module) -> tuple[set[str], bool]:
    """Names bound at a module's top level (through if/try/with blocks), and whether it may bind
    more dynamically (`from x import *`, a module __getattr__)."""
    names, dynamic = set(), False
    stack = list(tree.body)
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
            dynamic |= n.name == "__getattr__"
        elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                names |= {x.id for x in ast.walk(t) if isinstance(x, ast.Name)}
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            for a in n.names:
                dynamic |= a.name == "*"
                names.add(a.asname or a.name.split(".")[0])
        elif isinstance(n, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                for sub in getattr(n, field, []) or []:
                    stack.extend(sub.body if isinstance(sub, ast.ExceptHandler) else [sub])
    return names, dynamic


@functools.lru_cache(maxsize=64)
def _names_in(origin: str, mtime_ns: int, size: int) -> tuple[frozenset, bool]:
    names, dynamic = _top_names(ast.parse(Path(origin).read_text(encoding="utf-8", errors="replace"), origin))
    return frozenset(names), dynamic


@functools.lru_cache(maxsize=64)
def _tree_of(origin: str, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(Path(origin).read_text())


def _parsed(origin: str) -> ast.Module:
    """The module source at `origin`, parsed once per process while the file is unchanged (compose reads
    a runner's class literals several times: fingerprint components, options schema, its bases')."""
    st = os.stat(origin)
    return _tree_of(str(origin), st.st_mtime_ns, st.st_size)


def check_defined(module: str, attr: str, search=None) -> None:
    """Raise NotAllowed unless `module` can be located and (for a .py source) binds the first part of
    `attr` at top level or has it as a submodule. Reads the file; never imports it."""
    spec = locate(module, search)
    if spec is None:
        raise NotAllowed(f"module '{module}' not found (searched the working directory and sys.path)")
    first = attr.split(".")[0]
    origin = spec.origin if spec.has_location else None
    if not origin or not str(origin).endswith(".py"):
        return  # an extension, builtin or namespace package: located is all we can say
    st = os.stat(origin)
    try:
        names, dynamic = _names_in(str(origin), st.st_mtime_ns, st.st_size)
    except SyntaxError as e:
        raise NotAllowed(f"module '{module}' ({origin}:{e.lineno}) has a syntax error: {e.msg}") from None
    if first in names or dynamic or locate(f"{module}.{first}", search) is not None:
        return
    raise NotAllowed(f"module '{module}' ({origin}) defines no '{first}'")


def class_literal(module: str, cls: str, attr: str, search=None):
    """The literal value of `attr = ...` in the body of class `cls` of `module` (read, never imported),
    or None when the module, the class or a literal assignment is not there."""
    spec = locate(module, search)
    origin = spec.origin if spec is not None and spec.has_location else None
    if not origin or not str(origin).endswith(".py"):
        return None
    tree = _parsed(origin)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for st in node.body:
                target = st.target if isinstance(st, ast.AnnAssign) else (
                    st.targets[0] if isinstance(st, ast.Assign) and len(st.targets) == 1 else None)
                if isinstance(target, ast.Name) and target.id == attr and st.value is not None:
                    try:
                        return ast.literal_eval(st.value)
                    except ValueError:
                        return None
    return None


def class_value(module: str, cls: str, attr: str, search=None, depth: int = 0):
    """The literal value of class attribute `attr` of `module`:`cls` as Python would find it (read,
    never imported): the class body's `attr = <literal>`, else the first base's (a class of the
    module or one it imports by `from pkg.mod import Base`). A dict may spread a base's value,
    `{**Base.attr, "key": ...}`. None when not found or not literal."""
    spec = locate(module, search) if depth < 8 else None
    origin = spec.origin if spec is not None and spec.has_location else None
    if not origin or not str(origin).endswith(".py"):
        return None
    tree = _parsed(origin)
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
    if node is None:
        return None
    for st in node.body:
        target = st.target if isinstance(st, ast.AnnAssign) else (
            st.targets[0] if isinstance(st, ast.Assign) and len(st.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == attr and st.value is not None:
            return _literal(tree, module, st.value, attr, search, depth)
    for base in node.bases:
        where = _class_of(tree, module, base.id) if isinstance(base, ast.Name) else None
        got = class_value(*where, attr, search, depth + 1) if where else None
        if got is not None:
            return got
    return None


def _literal(tree: ast.Module, module: str, value: ast.expr, attr: str, search, depth: int):
    """ast.literal_eval, plus `**Base.<attr>` spreads in a dict (read with class_value)."""
    try:
        if not isinstance(value, ast.Dict) or all(k is not None for k in value.keys):
            return ast.literal_eval(value)
        out = {}
        for k, v in zip(value.keys, value.values):
            if k is not None:
                out[ast.literal_eval(k)] = ast.literal_eval(v)
                continue
            if not (isinstance(v, ast.Attribute) and v.attr == attr and isinstance(v.value, ast.Name)):
                return None
            where = _class_of(tree, module, v.value.id)
            base = class_value(*where, attr, search, depth + 1) if where else None
            if not isinstance(base, dict):
                return None
            out.update(base)
        return out
    except ValueError:
        return None


def _class_of(tree: ast.Module, module: str, name: str) -> tuple[str, str] | None:
    """(module, class) that `name` means in `module`: a class it defines or imports by name."""
    if any(isinstance(n, ast.ClassDef) and n.name == name for n in tree.body):
        return module, name
    for n in tree.body:
        if isinstance(n, ast.ImportFrom) and n.module and not n.level:
            for a in n.names:
                if (a.asname or a.name) == name:
                    return n.module, a.name
    return None


def check_runner(runner, imports: list[str], valid, search=None) -> tuple[str, str]:
    """(module, class) of a provider's `runner: pkg.mod:Class`: under parity.backends unless the
    provider declares `import:`; the module must be found and define the class (never imported).
    valid: a callable giving the registry's runners, for the error message."""
    choices = lambda: ", ".join(valid()) or "(none found)"  # noqa: E731  (read only on an error)
    if not isinstance(runner, str) or not re.fullmatch(rf"{_DOTTED.pattern}:{_IDENT}", runner):
        raise NotAllowed(f"expected 'package.module:ClassName', got {runner!r}. Valid runners: {choices()}")
    mod, cls = runner.split(":")
    if not (mod.startswith(RUNNER_NAMESPACE) or any(_under(mod, d) for d in imports)):
        raise NotAllowed(f"'{runner}' is not a parity backend ({RUNNER_NAMESPACE}*). Valid runners: {choices()}; "
                         f"a runner of your own is code to run: declare it with `import: {mod}` on the provider")
    try:
        check_defined(mod, cls, search)
    except NotAllowed as e:
        raise NotAllowed(f"'{runner}': {e}. Valid runners: {choices()}") from None
    return mod, cls
