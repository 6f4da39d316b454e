"""`parity deps --write | --check`: every stage depends on exactly its import closure.

A stage's code deps are the project files (under parity/, stages/, hydra_plugins/) that
`python -m <its module>` runs, found statically by parity.core.codedeps: imports at any depth (inside
functions too), parent packages' __init__.py, modules named in strings (`-m parity.suites.worker`),
plus the modules conf/ names for the stages that load every provider's runner or a suite's ops
(CONF_CODE). The stages that run one provider's runner (capture, engine, reduce, plan) do not list
runner code: they depend on artifacts/code/provider-<provider>.json, the hash of that runner's
closure written by the env stage (parity.core.codedeps.providers_code), so editing one runner re-runs
that provider's cells only.

Where the closure is written: the env stage (env/dvc.yaml, always run) lists its own as file deps. Every
stage of ./dvc.yaml lists one file instead, artifacts/code/stage-<stage>.json, which the env stage writes
on every `dvc repro` with the sha256 of each file of that stage's closure (the closures are committed in
stages/closures.json, parity.core.codedeps.stages_code). DVC rewrites the whole dvc.lock after each stage
it runs, parsing and dumping every dependency entry: ~40 code files per stage made resnet18's cold cell
1.2 s slower (BENCHMARKS.md 17g). Editing a module still re-runs exactly the stages whose closure holds
it, after env has re-hashed (`dvc repro` runs env first; `dvc status` alone shows env only).

--write writes stages/closures.json and rewrites only the code entries of each stage's `deps:` (one
sorted block where the first code entry was); every other line (artifact deps, comments, order) is kept
byte for byte, and a second run changes nothing. --check exits 1 naming each stage whose code deps
differ (missing / extra files, or not in the written form), 0 otherwise; the test suite runs it
(tests/test_deps.py).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

from parity.core import codedeps
from parity.core.codedeps import CodeDepsError

CODE_DIRS = ("parity", "stages", "hydra_plugins")
DVC_FILES = ("dvc.yaml", "env/dvc.yaml")
# the conf/ groups whose YAML names modules a stage imports at run time (by stage module)
CONF_CODE = {"suite_run": ("suites", "providers"), "suite_coverage": ("providers",),
             "fuzz": ("suites", "providers")}
# what the stages that run one provider's runner depend on instead of runner code
PROVIDER_CODE = "artifacts/code/provider-${item.provider}.json"
# every ./dvc.yaml stage's closure (committed), and the file of hashes env writes from it for each stage
CLOSURES = codedeps.CLOSURES
STAGE_CODE = "artifacts/code/stage-{}.json"
_ITEM = re.compile(r"^(\s*)- (.*?)\s*$")


def _yaml_strings(node):
    if isinstance(node, dict):
        for v in node.values():
            yield from _yaml_strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _yaml_strings(v)
    elif isinstance(node, str):
        yield node


def conf_modules(root: Path, group: str) -> set[str]:
    """Modules named 'package.module:attr' anywhere in conf/<group>/*.yaml (runners, suite ops)."""
    names = set()
    for f in sorted((root / "conf" / group).glob("*.yaml")):
        for s in _yaml_strings(yaml.safe_load(f.read_text())):
            mod, colon, attr = s.partition(":")
            if colon and attr and all(p.isidentifier() for p in mod.split(".")):
                names.add(mod)
    return names


def stage_module(stage: dict) -> str | None:
    """The module a stage runs (`python -m <module>` in its cmd), or None."""
    words = str(stage.get("cmd", "")).split()
    return words[words.index("-m") + 1] if "-m" in words[:-1] else None


def closure(root: Path, module: str) -> set[str]:
    """Project files (relative to root) `python -m <module>` runs, statically, plus the conf-named
    modules of CONF_CODE."""
    extra = {m for g in CONF_CODE.get(module.rpartition(".")[2], ()) for m in conf_modules(root, g)}
    found = codedeps.closure([module, *sorted(extra)], [root])
    return {f.relative_to(root).as_posix() for f in found.values()
            if f.relative_to(root).parts[0] in CODE_DIRS}


def stages(root: Path) -> dict[str, tuple[str, dict]]:
    """{stage name: (dvc file, stage)}: ./dvc.yaml's stages by name, env/dvc.yaml's by DVC address
    (its paths are relative to the repo root too: wdir: ..)."""
    out = {}
    for rel in DVC_FILES:
        f = root / rel
        if not f.is_file():
            continue
        for name, st in (yaml.safe_load(f.read_text()).get("stages") or {}).items():
            out[name if rel == "dvc.yaml" else f"{rel}:{name}"] = (rel, st)
    return out


def is_code(dep: str) -> bool:
    """A code entry of a stage's deps: a project file, or the hashes env writes of a stage's closure."""
    return dep.split("/")[0] in CODE_DIRS or dep.startswith(STAGE_CODE.partition("{")[0])


def hashed(name: str) -> bool:
    """A stage whose closure env hashes for it (every ./dvc.yaml stage; env/dvc.yaml's list files)."""
    return ":" not in name


def written(want: dict[str, list[str]]) -> dict[str, list[str]]:
    """{stage: its code entries as dvc.yaml lists them}."""
    return {n: [STAGE_CODE.format(n)] if hashed(n) else files for n, files in want.items()}


def closures_text(want: dict[str, list[str]]) -> str:
    """stages/closures.json's text: every hashed stage's closure."""
    return json.dumps({n: files for n, files in sorted(want.items()) if hashed(n)}, indent=1) + "\n"


def declared_code(root: Path, stage: dict) -> set[str]:
    """The stage's deps under the code folders, a folder standing for every file in it (bytecode
    excluded, as .dvcignore excludes it)."""
    files = set()
    for d in stage.get("deps", []):
        if not isinstance(d, str) or not is_code(d):
            continue
        p = root / d
        if p.is_dir():
            files |= {f.relative_to(root).as_posix() for f in p.rglob("*")
                      if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"}
        else:
            files.add(d)
    return files


def wanted(root: Path) -> dict[str, list[str]]:
    """{stage name: its code deps, sorted} for every stage that runs a `python -m` module."""
    out = {}
    for name, (_, st) in stages(root).items():
        mod = stage_module(st)
        if mod is not None:
            out[name] = sorted(closure(root, mod))
    return out


def _rewrite_deps(block: list[str], files: list[str], indent: str) -> list[str]:
    """A `deps:` block's lines with its code entries replaced by `files`, placed where the first code
    entry was (at the top if there was none); every other line kept as it is, in order (an entry with
    options on the lines below it, `- path:`, is not a plain code entry and is kept)."""
    kept, at = [], None
    for line, nxt in zip(block, [*block[1:], ""]):
        m = _ITEM.match(line)
        plain = m and not (nxt.strip() and _indent(nxt) > len(m.group(1)))
        if plain and is_code(m.group(2).split(" #")[0].strip("'\"")):
            at = len(kept) if at is None else at
        else:
            kept.append(line)
    at = 0 if at is None else at
    return kept[:at] + [f"{indent}- {f}\n" for f in files] + kept[at:]


def rewrite(text: str, want: dict[str, list[str]], prefix: str = "") -> str:
    """`text` (a dvc.yaml) with each stage's code deps replaced by want[prefix + stage name]."""
    out, chunk, name, in_stages = [], [], None, False
    for line in text.splitlines(keepends=True):
        top = line[:1] not in ("", " ", "#", "\n")  # a top-level key
        m = re.match(r"^  ([A-Za-z_][\w-]*):\s*(#.*)?$", line) if in_stages and not top else None
        if top or m:
            out += _stage(chunk, want.get(name))
            chunk, name = [], (prefix + m.group(1) if m else None)
            in_stages = line.startswith("stages:") if top else in_stages
        chunk.append(line)
    return "".join(out + _stage(chunk, want.get(name)))


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _stage(lines: list[str], files: list[str] | None) -> list[str]:
    """One stage's lines with its code deps written as `files` (None: not a stage we write). A stage
    without a `deps:` block gets one before its params/outs."""
    if files is None:
        return lines
    for i, line in enumerate(lines):
        m = re.match(r"^(\s+)deps:\s*$", line)
        if m:
            j = i + 1
            while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > len(m.group(1))):
                j += 1
            while j > i + 1 and not lines[j - 1].strip():  # trailing blank lines belong to what follows
                j -= 1
            first = next((_ITEM.match(b) for b in lines[i + 1:j] if _ITEM.match(b)), None)
            indent = first.group(1) if first else m.group(1) + "  "
            return lines[:i + 1] + _rewrite_deps(lines[i + 1:j], files, indent) + lines[j:]
    for i, line in enumerate(lines):
        m = re.match(r"^(\s+)(params|outs|metrics|plots|always_changed):", line)
        if m and files:
            return lines[:i] + [f"{m.group(1)}deps:\n", *(f"{m.group(1)}  - {f}\n" for f in files)] + lines[i:]
    return lines


def write(root: Path) -> list[str]:
    """Rewrite the code deps of dvc.yaml and env/dvc.yaml under root; the files changed."""
    want, changed = wanted(root), []
    f = root / CLOSURES
    if not f.is_file() or f.read_text() != closures_text(want):
        f.write_text(closures_text(want))
        changed.append(CLOSURES)
    for rel in DVC_FILES:
        f = root / rel
        if not f.is_file():
            continue
        old = f.read_text()
        new = rewrite(old, written(want), "" if rel == "dvc.yaml" else f"{rel}:")
        if new != old:
            yaml.safe_load(new)  # never write a file DVC cannot read
            f.write_text(new)
            changed.append(rel)
    return changed


def problems(root: Path) -> list[str]:
    """One line per stage whose code deps are not its import closure in the written form."""
    out, want = [], wanted(root)
    try:
        saved = json.loads((root / CLOSURES).read_text())
    except (OSError, ValueError):
        saved = {}
        out.append(f"{CLOSURES}: missing or not JSON")
    for name, (rel, st) in stages(root).items():
        if name not in want:
            continue
        listed = [d for d in st.get("deps", []) if isinstance(d, str) and is_code(d)]
        w, got = set(want[name]), set(saved.get(name, [])) if hashed(name) else declared_code(root, st)
        where = f"{CLOSURES} does not list" if hashed(name) else "does not depend on"
        if w - got:
            out.append(f"{name}: imports but {where}: {', '.join(sorted(w - got))}")
        if got - w:
            out.append(f"{name}: {'is listed with' if hashed(name) else 'depends on'} but never imports: "
                       f"{', '.join(sorted(got - w))}")
        if listed != written(want)[name] and (w == got or hashed(name)):
            out.append(f"{name}: code deps not in the written form ("
                       f"{STAGE_CODE.format(name) if hashed(name) else 'one sorted list of files'})")
    stale = sorted(set(saved) - {n for n in want if hashed(n)})
    if stale:
        out.append(f"{CLOSURES}: lists stages dvc.yaml does not have: {', '.join(stale)}")
    return out


def main(args) -> int:
    """`parity deps --write | --check` from the repo root (args.root)."""
    root = Path(args.root).resolve()
    try:
        return _run(root, args.write)
    except CodeDepsError as e:
        print(f"parity deps: {e}", file=sys.stderr)
        return 2


def _run(root: Path, write_: bool) -> int:
    if write_:
        changed = write(root)
        print(f"parity deps: rewrote {', '.join(changed)}" if changed else "parity deps: dvc.yaml and "
              f"{CLOSURES} up to date")
        return 0
    found = problems(root)
    for line in found:
        print(line)
    if found:
        print(f"parity deps: {len(found)} stage(s) with stale code deps; run `parity deps --write`")
        return 1
    print(f"parity deps: code deps of {len(wanted(root))} stages equal their import closures")
    return 0
