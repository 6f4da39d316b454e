"""Every stage depends on exactly the code it runs, and on nothing Python generates.

- each stage's code deps in dvc.yaml equal its import closure, found statically (parity.codedeps):
  imports at any depth (inside functions too), parent packages' __init__.py, modules named in strings
  (`python -m parity.suites.worker`), plus the modules conf/ names (providers' `runner:` for the
  stages that load runners, suite ops for suite_run);
- a user model's own code (`arch.source: import`) is a dependency of exactly that model's stages;
- editing a project module makes exactly the stages whose closure holds it stale;
- bytecode written by imports (PYTHONDONTWRITEBYTECODE unset, as on a user's machine) makes nothing
  stale: a fresh clone's second `dvc repro` runs only `env`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import BIN, ENV, ROOT, composed, config_error, env, make_repo, ran_stages
from parity import codedeps

CODE_DIRS = ("parity", "stages", "hydra_plugins")
# the conf/ groups whose YAML names modules a stage imports at run time (by stage module)
CONF_CODE = {"capture": ("providers",), "engine": ("providers",), "reduce": ("providers",),
             "suite_run": ("suites", "providers"),
             "suite_coverage": ("providers",), "fuzz": ("suites", "providers")}


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


def stage_module(stage: dict) -> str:
    words = stage["cmd"].split()
    return words[words.index("-m") + 1]


def closure(root: Path, module: str) -> set[str]:
    """Project files (relative) `python -m <module>` runs, statically."""
    extra = {m for g in CONF_CODE.get(module.rpartition(".")[2], ()) for m in conf_modules(root, g)}
    found = codedeps.closure([module, *sorted(extra)], [root])
    return {f.relative_to(root).as_posix() for f in found.values()}


def declared_code(root: Path, stage: dict) -> set[str]:
    """The stage's deps under the code folders, a folder standing for every file in it (bytecode
    excluded, as .dvcignore excludes it)."""
    files = set()
    for d in stage.get("deps", []):
        if d.split("/")[0] not in CODE_DIRS:
            continue
        p = root / d
        if p.is_dir():
            files |= {f.relative_to(root).as_posix() for f in p.rglob("*")
                      if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"}
        else:
            files.add(d)
    return files


def stages(root: Path) -> dict:
    """Every stage of ./dvc.yaml by name, and of the env probe's env/dvc.yaml by its DVC address
    (its paths are relative to the repo root too: wdir: ..)."""
    st = dict(yaml.safe_load((root / "dvc.yaml").read_text())["stages"])
    for name, s in yaml.safe_load((root / "env" / "dvc.yaml").read_text())["stages"].items():
        assert s.get("wdir") == "..", "env/dvc.yaml: paths are written relative to the repo root"
        st[f"env/dvc.yaml:{name}"] = s
    return st


def dep_problems(root: Path) -> list[str]:
    problems = []
    for name, st in stages(root).items():
        want, got = closure(root, stage_module(st)), declared_code(root, st)
        if want - got:
            problems.append(f"{name}: imports but does not depend on: {', '.join(sorted(want - got))}")
        if got - want:
            problems.append(f"{name}: depends on but never imports: {', '.join(sorted(got - want))}")
    return problems


def test_stage_code_deps_equal_import_closure():
    problems = dep_problems(ROOT)
    assert not problems, "dvc.yaml code deps differ from the import closures:\n" + "\n".join(problems)


def test_closure_follows_lazy_imports_strings_and_conf():
    c = closure(ROOT, "stages.export")
    assert {"parity/store.py", "parity/pipeline/inputs.py", "parity/io.py", "parity/models/layers.py",
            "parity/__init__.py", "stages/__init__.py"} <= c  # imported inside main()
    assert "parity/backends/base.py" not in c
    cap = closure(ROOT, "stages.capture")
    assert {"parity/backends/ort_int8.py", "parity/backends/trt.py"} <= cap  # conf/providers runners
    assert "parity/suites/worker.py" in closure(ROOT, "stages.suite_run")  # `-m parity.suites.worker`
    assert "parity/suites/render.py" in closure(ROOT, "stages.report")


def test_the_check_names_what_is_missing_and_extra(tmp_path):
    """A stage that gains an import without a dep (or keeps a dep it no longer imports) is named."""
    repo = make_repo(tmp_path / "repo", compose=False)
    repo.edit("stages/diff.py", "from parity import config\n", "from parity import config, fingerprint\n")
    repo.edit("dvc.yaml", "      - stages/suite_coverage.py\n",
              "      - stages/suite_coverage.py\n      - parity/history.py\n")
    problems = dep_problems(repo.path)
    assert problems == ["diff: imports but does not depend on: parity/fingerprint.py",
                        "suite_coverage: depends on but never imports: parity/history.py"], problems


def test_model_code_dep_is_on_every_stage_that_builds_the_model():
    """A stage builds the model iff it reads models.<m>.arch; exactly those depend on its code."""
    for name, st in stages(ROOT).items():
        builds = "models.${item.model}.arch" in st.get("params", [])
        assert ("artifacts/code/${item.model}.json" in st.get("deps", [])) == builds, name


def test_dvcignore_ignores_bytecode():
    lines = (ROOT / ".dvcignore").read_text().split()
    assert "__pycache__/" in lines and "*.pyc" in lines


def test_missing_import_module_is_a_config_error():
    msg = config_error(composed("models=[mlp]"), lambda p: p["models"]["mlp"]["arch"].update(
        source="import", name="nosuchpkg.nets:Net"))
    assert msg.startswith("models.mlp.arch.name: cannot find module 'nosuchpkg.nets'"), msg
    assert "nosuchpkg/nets.py or nosuchpkg/nets/__init__.py" in msg and "\n" not in msg


def test_compose_refuses_a_missing_import_module_in_one_line(tmp_path):
    repo = make_repo(tmp_path / "repo", compose=False)
    (repo.path / "conf/models/tiny_mlp.yaml").write_text(
        (repo.path / "conf/models/tiny_mlp.yaml").read_text().replace("source: parity", "source: import")
        .replace("name: mlp", "name: mynets.mlp:MLP"))
    p = repo.run([f"{BIN}/parity", "compose"], check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert "models.tiny_mlp.arch.name: cannot find module 'mynets.mlp'" in lines[0]
    assert "mynets/mlp.py or mynets/mlp/__init__.py" in lines[0]
    assert not (repo.path / "params.yaml").exists()


def test_locating_a_user_module_never_imports_it(tmp_path):
    """Validation and hashing read files only: a package whose import would fail is still found."""
    pkg = tmp_path / "boom"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise SystemExit('imported!')\n")
    (pkg / "net.py").write_text("from . import blocks\nfrom boom.blocks import Block\n")
    (pkg / "blocks.py").write_text("Block = None\n")
    code = codedeps.model_code("boom.net", [tmp_path])
    assert sorted(code["files"]) == ["boom/__init__.py", "boom/blocks.py", "boom/net.py"]
    assert "boom" not in sys.modules


def test_editable_installs_are_found_without_importing(tmp_path):
    """`pip install -e` of src-layout packages imports through a finder, not sys.path: its MAPPING
    (read as data) gives the source tree to search."""
    site, src = tmp_path / "site", tmp_path / "proj" / "src"
    (src / "mynets").mkdir(parents=True)
    (src / "mynets" / "__init__.py").write_text("")
    (src / "mynets" / "mlp.py").write_text("raise SystemExit('imported!')\n")
    site.mkdir()
    (site / "__editable___mynets_0_1_finder.py").write_text(
        f"import sys\nMAPPING: dict[str, str] = {{'mynets': {str(src / 'mynets')!r}}}\n")
    roots = [site, *codedeps._editable_roots([site])]
    assert codedeps.find_module("mynets.mlp", roots) == (src, src / "mynets" / "mlp.py")
    assert sorted(codedeps.model_code("mynets.mlp", roots)["files"]) == ["mynets/__init__.py", "mynets/mlp.py"]


# ----------------------------------------------------------------------------- real DVC, temp repo
USER_MODEL = """\
user_mlp:
  arch:
    source: import
    name: usermodels.net:Net
    kwargs: {d: 16}
  input:
    - {name: input, shape: [4, 16], dtype: float32, init: normal, mean: 0.0, std: 1.0}
  tolerances: []
"""
USER_CODE = """\
from torch import nn

from usermodels.blocks import block


class Net(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(d, d), block(), nn.Linear(d, 8)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))
"""


def status(repo) -> set[str]:
    out = repo.run(["dvc", "status", "--json"]).stdout
    return set(json.loads(out or "{}")) - {ENV}  # env is always_changed


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    """tiny_mlp + a user model (arch.source: import), fp32 x torch_cpu + ort_cpu, reproduced."""
    repo = make_repo(tmp_path_factory.mktemp("deps") / "repo", models=("tiny_mlp", "user_mlp"),
                     dtypes=("fp32",), compose=False)
    (repo.path / "conf/models/user_mlp.yaml").write_text(USER_MODEL)
    (repo.path / "usermodels").mkdir()
    (repo.path / "usermodels/__init__.py").write_text("")
    (repo.path / "usermodels/net.py").write_text(USER_CODE)
    (repo.path / "usermodels/blocks.py").write_text("from torch import nn\n\n\ndef block():\n"
                                                     "    return nn.SiLU()\n")
    repo.run([f"{BIN}/parity", "compose"])
    repo.commit("user model")
    repo.repro()
    assert status(repo) == set()
    return repo


def test_editing_a_user_model_makes_exactly_its_stages_stale(two_models):
    repo = two_models
    code = json.loads((repo.path / "artifacts/code/user_mlp.json").read_text())
    assert sorted(code["files"]) == ["usermodels/__init__.py", "usermodels/blocks.py", "usermodels/net.py"]
    assert json.loads((repo.path / "artifacts/code/tiny_mlp.json").read_text()) == {"source": "parity"}
    mine = {"export@user_mlp", "reference@user_mlp", "capture@user_mlp-fp32-torch_cpu",
            "capture@user_mlp-fp32-ort_cpu", "baseline@user_mlp-fp32"}
    try:
        for rel, old, new in (("usermodels/blocks.py", "nn.SiLU()", "nn.GELU()"),  # imported in turn
                              ("usermodels/net.py", "self.fc1(x)", "self.fc1(x) * 1.0")):
            repo.edit(rel, old, new)
            assert repo.repro("-s", ENV) == [ENV]  # env re-hashes user code on every repro
            assert status(repo) == mine, rel
            repo.run(["git", "checkout", "--", rel])
            repo.repro("-s", ENV)
            assert status(repo) == set()
    finally:
        repo.run(["git", "checkout", "--", "usermodels"])
        repo.repro("-s", ENV)


@pytest.mark.parametrize("rel", ["parity/io.py", "parity/pipeline/inputs.py", "parity/store.py", "parity/export.py",
                                 "parity/suites/render.py", "parity/backends/trt.py", "parity/fingerprint.py"])
def test_touching_a_module_makes_exactly_its_importers_stale(two_models, rel):
    """Over every stage of the repo: stale after the edit == the stages whose closure holds the file."""
    repo = two_models
    lock = yaml.safe_load((repo.path / "dvc.lock").read_text())["stages"]
    st = stages(repo.path)
    want = {name for name in lock if name != ENV and rel in closure(repo.path, stage_module(
        st[name.partition("@")[0]]))}
    f = repo.path / rel
    try:
        f.write_text(f.read_text() + "# touched\n")
        assert status(repo) == want
    finally:
        repo.run(["git", "checkout", "--", rel])
    if rel == "parity/io.py":
        assert want == set(lock) - {ENV}  # every stage writes through parity.io


def _user_env() -> dict:
    """A user's shell: bytecode written, output buffered."""
    e = env()
    e.pop("PYTHONDONTWRITEBYTECODE", None)
    e.pop("PYTHONUNBUFFERED", None)
    return e


def test_fresh_clone_with_bytecode_on_reruns_only_env(tmp_path):
    src = make_repo(tmp_path / "src")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(src.path), str(clone)], check=True, env=_user_env())

    def sh(*cmd):
        p = subprocess.run(cmd, cwd=clone, env=_user_env(), capture_output=True, text=True)
        assert p.returncode == 0, f"{cmd}:\n{p.stdout}\n{p.stderr}"
        return p.stdout

    first = ran_stages(sh("dvc", "repro"))
    assert ENV in first and "report" in first
    mods = sorted({".".join(f.relative_to(clone).with_suffix("").parts).removesuffix(".__init__")
                   for d in ("parity", "stages") for f in (clone / d).rglob("*.py")})
    sh(sys.executable, "-c", f"import importlib\nfor m in {mods!r}: importlib.import_module(m)")
    pyc = list((clone / "parity/backends").rglob("*.pyc"))
    assert pyc, "bytecode was not written (PYTHONDONTWRITEBYTECODE still set?)"
    assert set(json.loads(sh("dvc", "status", "--json") or "{}")) == {ENV}
    assert ran_stages(sh("dvc", "repro")) == [ENV]
