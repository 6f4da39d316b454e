"""Import-graph figures of the layout (issue 37): what runs back up, and the rooms a stage walks through.

  python benchmarks/import_graph.py [--root DIR]
      static, from the source (ast, nothing imported): the imports that run back up a layer. Layers are
      tests/test_house.py's (core < config < models, backends < pipeline, analysis, suites < entries),
      and within layer 4 the order of tests/test_house.py's LAYER4 (suites < analysis < pipeline).
      Prints each upward folder pair with the modules that make it, and the totals.
  python benchmarks/import_graph.py --trace -- python -m stages.export ...   (in a composed repo)
      runs the command's module under a profile hook and prints the parity files its function calls
      enter (module bodies run at import are not counted), in order of first entry ("rooms"), and the returns: a call into a file that is already on the call
      stack below a frame of another file (control went down and came back up into a room it left).
      Pass the stage's own arguments; run it where the stage's inputs exist (a scratch clone).
"""

from __future__ import annotations

import argparse
import ast
import os
import runpy
import sys
from pathlib import Path

LAYERS = {"": 1, "core": 1, "config": 2, "models": 3, "backends": 3, "pipeline": 4, "analysis": 4, "suites": 4,
          "commands": 5, "stages": 5, "hydra_plugins": 5}
LAYER4 = {"suites": 0, "analysis": 1, "pipeline": 2}  # within layer 4, bottom up


def _module(root: Path, f: Path) -> str:
    parts = list(f.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(root: Path, f: Path) -> set[str]:
    mod = _module(root, f)
    pkg = mod if f.name == "__init__.py" else mod.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(f.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            found |= {base} | {f"{base}.{a.name}" for a in node.names}
    return found


def _folder(module: str) -> str:
    parts = module.split(".")
    return (parts[1] if len(parts) > 1 else "") if parts[0] == "parity" else parts[0]


def _rank(folder: str) -> tuple[int, int]:
    return LAYERS[folder], LAYER4.get(folder, 0)


def upward(root: Path) -> dict[tuple[str, str], list[str]]:
    """{(folder, folder it imports upward): ['module -> imported module', ...]}."""
    files = [f for top in ("parity", "stages", "hydra_plugins") for f in sorted((root / top).rglob("*.py"))
             if "__pycache__" not in f.parts]
    mods = {_module(root, f): f for f in files}
    out: dict[tuple[str, str], list[str]] = {}
    for m, f in mods.items():
        for i in sorted(_imports(root, f)):
            if i in mods and _rank(_folder(i)) > _rank(_folder(m)):
                out.setdefault((_folder(m), _folder(i)), []).append(f"{m} -> {i}")
    return out


def trace(cmd: list[str], root: Path) -> tuple[list[str], list[str], list[str]]:
    """Run `cmd` (`python -m module args...` or `python script args...`) in this process under a profile
    hook. Returns (rooms: parity files whose functions ran, in order of first entry; up-calls: 'caller
    -> callee' where the callee's file is already on the stack below another file; re-entries: each time
    the walk, call or return, comes back into a layer-4 file (pipeline, analysis, suites) it had left
    for another layer-4 file)."""
    rooms, upcalls, reentries, stack, walk = [], [], [], [], []
    top = str(root / "parity")

    def rel(frame):
        fn = frame.f_code.co_filename if frame is not None else ""
        # a module's own code running at import is no room the walk enters
        return fn[len(str(root)) + 1:] if fn.startswith(top) and frame.f_code.co_name != "<module>" else None

    def step(here):
        if here is None or _folder(here[:-3].replace("/", ".")) not in LAYER4:
            return
        if walk and walk[-1] == here:
            return
        if here in walk:
            reentries.append(here)
        walk.append(here)

    def hook(frame, event, arg):
        if event == "call":
            here = rel(frame)
            caller = next((s for s in reversed(stack) if s is not None), None)
            if here is not None:
                if here not in rooms:
                    rooms.append(here)
                elif caller != here and here in stack:
                    upcalls.append(f"{caller} -> {here}")
            stack.append(here)
            step(here)
        elif event == "return" and stack:
            stack.pop()
            step(next((s for s in reversed(stack) if s is not None), None))

    args = cmd[1:] if Path(cmd[0]).name.startswith("python") else cmd
    real_exit = os._exit
    os._exit = lambda code: (_ for _ in ()).throw(SystemExit(code))  # parity.core.io's fast exit: report first
    sys.setprofile(hook)
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = args
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
        os._exit = real_exit
    return rooms, upcalls, reentries


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path.cwd())
    ap.add_argument("--trace", action="store_true", help="then `-- python -m module args...`")
    argv = sys.argv[1:]
    cmd = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    root = a.root.resolve()
    if a.trace:
        sys.path.insert(0, str(root))
        rooms, upcalls, reentries = trace(cmd, root)
        l4 = [r for r in rooms if _folder(r[:-3].replace("/", ".")) in LAYER4]
        print(f"rooms (parity files whose functions ran, first-entry order): {len(rooms)}, {len(l4)} in layer 4")
        for r in rooms:
            print("  " + r)
        print(f"up-calls (a call into a file already on the stack below another): {len(set(upcalls))} distinct")
        for r in sorted(set(upcalls)):
            print("  " + r)
        print(f"returns (the walk back in a layer-4 file it had left for another): {len(set(reentries))} files, "
              f"{len(reentries)} times")
        for r in sorted(set(reentries)):
            print(f"  {r}: {reentries.count(r)}")
        return 0
    up = upward(root)
    print(f"imports that run back up a layer: {len(up)} folder pairs, "
          f"{sum(len(v) for v in up.values())} module imports, "
          f"{len({e.split(' -> ')[0] for v in up.values() for e in v})} files")
    for (a_, b_), edges in sorted(up.items()):
        print(f"  {a_} -> {b_}: {len(edges)}")
        for e in edges:
            print("    " + e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
