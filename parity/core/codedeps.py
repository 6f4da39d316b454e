"""Which source files a module's code is made of, found without importing anything.

Three users:
- the env stage hashes the closure of each selected provider's runner module into
  artifacts/code/provider-<provider>.json, what the stages running that one runner depend on;
- the env stage hashes the source of every `arch.source: import` model (models.<m>.arch.name
  'package.module:callable') into a per-model file that the model's stages depend on, so editing a
  user's model re-runs exactly that model's stages (dvc.yaml: artifacts/code/<model>.json); the same
  file holds, hashed by streaming, every file a model reads (an ONNX file and its external data, a
  checkpoint folder's weights, config and tokenizer files, a `weights:` file: parity.core.modelfiles);
- parity.commands.stagedeps (`parity deps --write|--check`) computes each stage's import closure and writes it
  to stages/closures.json (env/dvc.yaml's stage: as its code `deps:`); the env stage hashes each
  closure into artifacts/code/stage-<stage>.json (stages_code), that stage's one code dependency.

Static analysis (ast) only: `import a.b`, `from a import b` (b may be a submodule), relative imports,
imports inside functions, and string constants naming a module ('pkg.mod' or 'pkg.mod:attr', as
passed to `python -m` or importlib). Modules are located by walking search roots for
pkg/mod.py or pkg/mod/__init__.py, never with importlib (find_spec on a dotted name imports its
parents, which would run user code).

Not covered: modules imported by a computed name, extension modules (.so), data files a module reads,
and installed third-party packages (their versions are in the env fingerprints).
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sys
from pathlib import Path

from parity.core import modelfiles

CLOSURES = "stages/closures.json"  # every dvc.yaml stage's import closure (parity deps --write)


class CodeDepsError(LookupError):
    """A one-line error about the project's own code deps (a corrupt closures file, a module that does not
    parse): a stage prints it as it is (parity.config.stageargs' hook reads `one_line`), `parity deps` too."""
    one_line = True
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(:[A-Za-z_][\w.]*)?$|^[A-Za-z_]\w*:[A-Za-z_][\w.]*$")


def search_roots(cwd: str | Path | None = None) -> list[Path]:
    """Where `python -m stages.<x>` run from the repo root finds modules: the repo root (cwd), then
    sys.path (PYTHONPATH, the standard library, site-packages), then the source trees of editable
    installs (`pip install -e`), whose finders import from outside sys.path."""
    roots = [Path(cwd or Path.cwd()).resolve()]
    for p in sys.path:
        r = Path(p or ".").resolve()
        if r not in roots and r.is_dir():
            roots.append(r)
    for r in _editable_roots(list(roots)):
        if r not in roots:
            roots.append(r)
    return roots


def _editable_roots(dirs) -> list[Path]:
    """Parents of the packages setuptools' editable finders map (`MAPPING = {name: path}` in
    site-packages/__editable___*_finder.py), read as data, never imported."""
    out = []
    for d in dirs:
        for f in sorted(d.glob("__editable___*_finder.py")):
            for node in ast.parse(f.read_bytes()).body:
                target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
                if isinstance(target, ast.Name) and target.id == "MAPPING" and node.value is not None:
                    try:
                        mapping = ast.literal_eval(node.value)
                    except ValueError:
                        continue
                    out += [Path(p).parent for p in mapping.values()]
    return out


def find_module(name: str, roots) -> tuple[Path, Path] | None:
    """(root, file) of module `name` (pkg/mod.py or pkg/mod/__init__.py) under the first root that
    holds it, or None."""
    if not name or not all(part.isidentifier() for part in name.split(".")):
        return None
    rel = Path(*name.split("."))
    for root in roots:
        for f in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
            if f.is_file():
                return Path(root), f
    return None


def searched(name: str) -> str:
    """The files find_module looks for, for error messages."""
    rel = "/".join(name.split("."))
    return f"{rel}.py or {rel}/__init__.py"


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imported_names(path: Path, modname: str) -> set[str]:
    """Module names `path` (module `modname`) may import, as written: every import statement (at any
    depth), `from x import y` as both x and x.y, and module names in an import position as strings
    (`"-m", "pkg.mod"` in an argv list, `import_module("pkg.mod")`). Parsed once per file version
    (`parity deps` walks the same modules for every stage)."""
    data = path.read_bytes()
    key = (str(path), modname, hashlib.sha256(data).hexdigest())
    if key not in NAMES_MEMO:
        NAMES_MEMO[key] = _imported_names(path, modname, data)
    return set(NAMES_MEMO[key])


# (file, module, sha256 of its bytes) -> the names it imports; public: parity.core.importmemo keeps it
# between env-stage runs (load / save)
NAMES_MEMO: dict[tuple[str, str, str], frozenset[str]] = {}


def _imported_names(path: Path, modname: str, data: bytes) -> frozenset[str]:
    try:
        tree = ast.parse(data, filename=str(path))
    except SyntaxError as e:  # issue 36 item 8: `parity deps --write` over such a module gave a traceback
        raise CodeDepsError(f"{path}:{e.lineno}: syntax error ({e.msg}): its imports cannot be read; fix the "
                            "module and run again") from None
    package = modname if path.name == "__init__.py" else modname.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names if a.name != "*")
        elif isinstance(node, (ast.List, ast.Tuple)):  # [sys.executable, "-m", "pkg.mod", ...]
            elts = node.elts
            for a, b in zip(elts, elts[1:]):
                if _const(a) == "-m" and _const(b) and _DOTTED.match(_const(b)):
                    names.add(_const(b))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            if node.args and _const(node.args[0]) and _DOTTED.match(_const(node.args[0])):
                names.add(_const(node.args[0]).partition(":")[0])
    return frozenset(n for n in names if n)


def _const(node) -> str | None:
    """A string constant's value (None for anything else). Only strings in an import position count
    as imports (`-m pkg.mod` in an argv list, importlib.import_module("pkg.mod")): a module name as
    data (a table keyed by runner paths, an allow-list of namespaces) is not an import."""
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def closure(modules, roots, keep=lambda root, f: True) -> dict[str, Path]:
    """{module name: file} for `modules`, their parent packages and everything they import in turn,
    as far as find_module resolves a name under `roots` and keep(root, file) accepts it."""
    found: dict[str, Path] = {}
    todo = list(modules)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        hit = find_module(name, roots)
        if hit is None or not keep(*hit):
            continue
        found[name] = hit[1]
        todo.extend(_parents(name))
        todo.extend(imported_names(hit[1], name))
    return found


def _installed(root: Path) -> bool:
    prefixes = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return "site-packages" in root.parts or any(root == p or p in root.parents for p in prefixes)


def model_code(module: str, roots=None) -> dict:
    """What an `import` model's stages depend on: sha256 of the module's file, its packages'
    __init__.py, and the modules it imports in turn from the same source tree (for a module installed
    in site-packages: from its own top-level package only). Paths are relative to the root the module
    was found under, so the same code gives the same bytes on every machine.

    Raises LookupError if the module's file cannot be found."""
    roots = search_roots() if roots is None else list(roots)
    hit = find_module(module, roots)
    if hit is None:
        raise LookupError(f"cannot find module '{module}' (searched {searched(module)} under "
                          f"{', '.join(map(str, roots))})")
    home, top = hit[0], module.split(".")[0]

    def keep(root: Path, f: Path) -> bool:
        if root != home:
            return False
        return not _installed(home) or f.relative_to(home).parts[0] in (top, f"{top}.py")

    # a name found under an earlier root is not the module's own and one found only under a later root is
    # never reached: searching up to `home` gives the same closure without a stat per root per name
    upto = next(i for i, r in enumerate(roots) if Path(r) == home)
    files = closure([module], roots[: upto + 1], keep).values()
    return {"source": "import", "module": module,
            "files": {f.relative_to(home).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest()
                      for f in sorted(files)}}


def models_code(models: dict, roots=None, digests: modelfiles.Digests | None = None) -> dict[str, dict]:
    """{model: what its stages depend on} for every model of params `models`: an `import` model's
    source (model_code); every file an ONNX file or a Hugging Face checkpoint folder (`source: hf,
    path:`) has its model read (onnx_file_code, hf_checkpoint_code); and a torch model's `weights:`
    file, under "weights". Other parity and torchvision models get a constant: their code is
    parity/models (a file dep of the stages) and torchvision (whose version is in the torch
    fingerprint). Files are hashed by streaming, each once per change (`digests`: by default
    remembered under the repository's .dvc/tmp, parity.core.modelfiles.Digests)."""
    digests = modelfiles.Digests.for_repo() if digests is None else digests
    out = {}
    for name, m in sorted(models.items()):
        arch = m["arch"]
        if arch["source"] == "import":
            out[name] = model_code(str(arch["name"]).partition(":")[0], roots)
        elif modelfiles.is_onnx_file(m):
            out[name] = onnx_file_code(Path(str(arch["path"])), digests)
        elif arch["source"] == "hf" and arch.get("path"):
            out[name] = hf_checkpoint_code(Path(str(arch["path"])), digests)
        else:
            out[name] = {"source": arch["source"]}
        if arch.get("weights"):
            out[name]["weights"] = file_code(Path(str(arch["weights"])), digests)
    digests.save()
    return out


# what the inputs stage reads of a checkpoint folder (parity.pipeline.inputfiles: text inputs, token bounds)
INPUT_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json")


def inputs_code(models: dict, digests: modelfiles.Digests | None = None) -> dict[str, dict]:
    """{"<model>.inputs": what inputs@<model> reads of the model's own files}: for a checkpoint folder
    (`source: hf, path:`) the sha256 of its INPUT_FILES that exist (its tokenizer tokenises `init: text`
    inputs; config.json bounds token ids), else a constant. A changed tokenizer.json re-runs the inputs,
    a changed shard does not (the model's stages depend on <model>.json for those)."""
    digests = modelfiles.Digests.for_repo() if digests is None else digests
    out = {}
    for name, m in sorted(models.items()):
        arch, files = m["arch"], {}
        if arch["source"] == "hf" and arch.get("path"):
            folder = Path(str(arch["path"]))
            files = {f: digests.sha256(folder / f) for f in INPUT_FILES if (folder / f).is_file()}
        out[f"{name}.inputs"] = {"source": arch["source"], "files": files}
    digests.save()
    return out


def providers_code(providers: dict, roots=None) -> dict[str, dict]:
    """{provider: what its cells' stages depend on for runner code}: model_code of the module its
    `runner:` ('package.module:Class') names, i.e. the runner's import closure. The stages that run one
    provider's runner (capture, engine, reduce, plan) depend on this instead of on every runner module,
    so editing one runner (parity/backends/trt.py) re-runs only that provider's cells."""
    return {name: model_code(str(pc["runner"]).partition(":")[0], roots)
            for name, pc in sorted(providers.items())}


def stages_code(closures: Path) -> dict[str, dict]:
    """{stage: {"files": {file: sha256}}} for every stage of `closures` (stages/closures.json: each
    stage's import closure, paths relative to the repo root, the cwd), each file read once. A file the
    closure names but the tree lacks stops the env stage: `parity deps --check` says what is stale."""
    try:
        names, digest = json.loads(Path(closures).read_text()), {}
    except ValueError as e:  # issue 36 item 8: a JSONDecodeError traceback that did not name the file
        raise CodeDepsError(f"{closures}: corrupt ({e}): run `parity deps --write` to make it again") from None
    if not isinstance(names, dict):
        raise CodeDepsError(f"{closures}: corrupt (not a JSON object): run `parity deps --write` to make it again")
    for f in sorted({f for files in names.values() for f in files}):
        try:
            digest[f] = hashlib.sha256(Path(f).read_bytes()).hexdigest()
        except FileNotFoundError:
            raise CodeDepsError(f"{closures} names {f}, which does not exist: run `parity deps --write`") from None
    return {stage: {"files": {f: digest[f] for f in files}} for stage, files in sorted(names.items())}


def file_code(path: Path, digests: modelfiles.Digests) -> dict:
    """{path: sha256} of one file a model reads ({path: "missing"} when it is not there: the stage that
    reads it says so, and creating it changes this)."""
    return {str(path): digests.sha256(path) if path.is_file() else "missing"}


def onnx_file_code(path: Path, digests: modelfiles.Digests | None = None) -> dict:
    """An `arch.source: onnx` model's dependency: the sha256 of the file and of every external-data file
    its tensors name (modelfiles.onnx_locations: wherever under the file's folder, `data/w.bin` too,
    and the initializers of If/Loop/Scan bodies), i.e. what onnxruntime reads, keyed by location. So
    changing the model or its weights re-runs exactly its stages, and a file beside it that the model
    does not read changes nothing (and is never opened). A location parity refuses to read (outside
    the folder: the export stage names it) is recorded, not read."""
    digests = modelfiles.Digests() if digests is None else digests
    files = {}
    if path.is_file():
        files[path.name] = digests.sha256(path)
        try:
            locations = modelfiles.onnx_locations(path)
        except ValueError:  # not a protobuf: the export stage says so (onnx_source.load_checked)
            locations = []
        for loc in locations:
            try:
                files[loc] = digests.sha256(modelfiles.external_file(path.parent, loc))
            except FileNotFoundError:
                files[loc] = "missing"
            except modelfiles.ExternalDataError as e:
                files[loc] = f"refused: {e}"
    return {"source": "onnx", "path": str(path), "files": files}


def hf_checkpoint_code(folder: Path, digests: modelfiles.Digests) -> dict:
    """A `source: hf, path: <folder>` model's dependency: the sha256 of every file of the checkpoint
    that transformers reads (modelfiles.hf_files: config, the weights it picks with every shard,
    tokenizer files), keyed by name; a shard or tokenizer file changed re-runs exactly its stages."""
    files = {}
    if folder.is_dir():
        for name in modelfiles.hf_files(folder):
            f = folder / name
            files[name] = digests.sha256(f) if f.is_file() else "missing"
    return {"source": "hf", "path": str(folder), "files": files}
