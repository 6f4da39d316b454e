"""Every stage depends on exactly the code it runs, and on nothing Python generates.

- each stage's code deps in dvc.yaml equal its import closure, found statically (parity.core.codedeps):
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
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import BIN, ENV, ROOT, composed, config_error, env, make_repo, ran_stages
from parity.core import codedeps
from parity.commands import stagedeps

def closure(root: Path, module: str) -> set[str]:
    """Project files (relative) `python -m <module>` runs, statically (parity.commands.stagedeps)."""
    return stagedeps.closure(root, module)


def stage_module(stage: dict) -> str:
    return stagedeps.stage_module(stage)


def stages(root: Path) -> dict:
    """Every stage of ./dvc.yaml by name, and of the env probe's env/dvc.yaml by its DVC address."""
    st = {}
    for name, (rel, s) in stagedeps.stages(root).items():
        assert rel == "dvc.yaml" or s.get("wdir") == "..", f"{rel}: paths are written relative to the repo root"
        st[name] = s
    return st


def test_deps_check_passes():
    """`parity deps --check` (what CI runs): every stage's code deps equal its import closure, in the
    form `--write` gives them, so `--write` on this tree changes nothing (byte-stable)."""
    problems = stagedeps.problems(ROOT)
    assert not problems, "dvc.yaml code deps differ from the import closures (run `parity deps --write`):\n" + \
        "\n".join(problems)
    want = stagedeps.wanted(ROOT)
    assert (ROOT / stagedeps.CLOSURES).read_text() == stagedeps.closures_text(want)
    for rel in stagedeps.DVC_FILES:
        text = (ROOT / rel).read_text()
        assert stagedeps.rewrite(text, stagedeps.written(want), "" if rel == "dvc.yaml" else f"{rel}:") == text, rel
    for name, st in stages(ROOT).items():  # one code dep per dvc.yaml stage: the hashes env writes of its closure
        code = [d for d in st.get("deps", []) if isinstance(d, str) and stagedeps.is_code(d)]
        assert code == (want[name] if ":" in name else [f"artifacts/code/stage-{name}.json"]), name


def test_closure_follows_lazy_imports_strings_and_conf():
    c = closure(ROOT, "stages.export")
    assert {"parity/core/store.py", "parity/pipeline/inputs.py", "parity/core/io.py", "parity/models/layers.py",
            "parity/__init__.py", "stages/__init__.py"} <= c  # imported inside main()
    # the export runs the reference and the fp32 baseline (parity.pipeline.fold): the torch runner, no other
    assert "parity/backends/torch_cpu.py" in c and not {"parity/backends/ort_cpu.py", "parity/backends/trt.py"} & c
    runners = {"parity/backends/ort_int8.py", "parity/backends/trt.py"}
    assert not runners & closure(ROOT, "stages.capture")  # its runner: artifacts/code/provider-<p>.json
    assert runners <= closure(ROOT, "stages.suite_coverage")  # every conf/providers runner
    assert "parity/suites/worker.py" in closure(ROOT, "stages.suite_run")  # `-m parity.suites.worker`
    assert "parity/suites/render.py" in closure(ROOT, "stages.report")


def _code_tree(dst: Path) -> Path:
    """What `parity deps` reads (code, conf/, the dvc.yaml files), copied: no git, no DVC needed."""
    for d in (*stagedeps.CODE_DIRS, "conf"):
        shutil.copytree(ROOT / d, dst / d, ignore=shutil.ignore_patterns("__pycache__"))
    for rel in stagedeps.DVC_FILES:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dst / rel)
    return dst


def _deps_cli(capsys, *args) -> tuple[int, str]:
    from parity.commands import cli

    rc = cli.main(["deps", *args])
    return rc, capsys.readouterr().out


def test_deps_check_names_what_is_missing_and_extra_and_write_fixes_it(tmp_path, capsys):
    """A stage that gains an import its committed closure lacks, a closure that lists a file the stage
    never imports, or a code file listed in dvc.yaml by hand is named by `parity deps --check` (exit 1);
    `parity deps --write` is the one step that fixes stages/closures.json and dvc.yaml, touching only
    those stages' entries, and a second --write changes nothing."""
    root = _code_tree(tmp_path / "repo")
    diff_py, dvc_yaml, saved = root / "stages/diff.py", root / "dvc.yaml", root / stagedeps.CLOSURES
    diff_py.write_text(diff_py.read_text().replace("from parity.core import memory\n",
                                                   "from parity.core import memory\nfrom parity.core import ui\n", 1))
    closures = json.loads(saved.read_text())
    saved.write_text(json.dumps({**closures, "report": [*closures["report"], "parity/commands/sweep.py"]}, indent=1) + "\n")
    code = "      - artifacts/code/stage-suite_coverage.json\n"
    before = dvc_yaml.read_text().replace(code, code + "      - parity/commands/history.py\n")
    dvc_yaml.write_text(before)
    rc, out = _deps_cli(capsys, "--check", "--root", str(root))
    assert rc == 1 and out.splitlines()[:3] == [
        "diff: imports but stages/closures.json does not list: parity/core/ui.py",
        "report: is listed with but never imports: parity/commands/sweep.py",
        "suite_coverage: code deps not in the written form (artifacts/code/stage-suite_coverage.json)"], out
    assert _deps_cli(capsys, "--write", "--root", str(root)) == (0, "parity deps: rewrote stages/closures.json, dvc.yaml\n")
    after = json.loads(saved.read_text())
    assert after == {**closures, "diff": sorted([*closures["diff"], "parity/core/ui.py"])}
    assert dvc_yaml.read_text() == before.replace("      - parity/commands/history.py\n", "")
    assert _deps_cli(capsys, "--check", "--root", str(root))[0] == 0
    assert "up to date" in _deps_cli(capsys, "--write", "--root", str(root))[1]
    assert json.loads(saved.read_text()) == after


ORT_ONLY = {"parity/backends/ort_cpu.py", "parity/backends/fault.py",
            "parity/models/onnx_cut.py", "parity/pipeline/onnx_reference.py", "parity/models/onnx_source.py"}


def _cpu_providers(root: Path) -> dict:
    provs = {}
    for f in sorted((root / "conf/providers").glob("*.yaml")):
        provs.update(yaml.safe_load(f.read_text()))
    return {n: pc for n, pc in provs.items() if not {"cuda", "tensorrt"} & set(pc["uses"])}


def test_closures_are_no_wider_than_the_work():
    """A CPU capture never depends on the TensorRT runner, no model stage on the suite format, the
    reference of a torch model on no onnxruntime code (the closures dvc.yaml is written from)."""
    st, want = stages(ROOT), stagedeps.wanted(ROOT)
    for name in ("capture", "capture_engine", "engine", "reduce", "plan"):  # one provider's runner each
        assert stagedeps.PROVIDER_CODE in st[name]["deps"], name
        assert not {f for f in want[name] if f.startswith("parity/backends/")} - {
            "parity/backends/__init__.py", "parity/backends/runner.py", "parity/backends/capture_driver.py",
            "parity/backends/loader.py", "parity/backends/fault.py",
            "parity/backends/fingerprint.py", "parity/backends/ops.py", "parity/backends/ort_cpu.py",
            "parity/backends/ort_int8.py"}, name
    assert "parity/backends/trt.py" not in want["capture"]
    cpu = codedeps.providers_code(_cpu_providers(ROOT), [ROOT])
    assert {"torch_cpu", "ort_cpu", "ort_int8"} <= set(cpu)
    for prov, code in cpu.items():  # what a CPU capture depends on for its runner
        assert "parity/backends/trt.py" not in code["files"] and "parity/suites/spec.py" not in code["files"], prov
    assert "parity/backends/ort_cpu.py" in cpu["ort_cpu"]["files"]
    assert "parity/backends/ort_cpu.py" not in cpu["torch_cpu"]["files"]
    model_stages = [n for n, s in st.items() if "model" in (s.get("matrix") or {})]
    assert {"inputs", "export", "reference", "reference_onnx", "baseline", "capture", "diff"} <= set(model_stages)
    for name in model_stages:
        assert "parity/suites/spec.py" not in want[name], name
    assert not ORT_ONLY & set(want["reference"])
    assert ORT_ONLY - {"parity/models/onnx_source.py"} <= set(want["reference_onnx"])


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


@pytest.mark.parametrize("rel", ["parity/core/io.py", "parity/pipeline/inputs.py", "parity/core/store.py", "parity/pipeline/layer_export.py",
                                 "parity/suites/render.py", "parity/backends/trt.py", "parity/backends/fingerprint.py"])
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
        assert repo.repro("-s", ENV) == [ENV]  # as every `dvc repro` does first: it hashes each closure
        assert status(repo) == want
    finally:
        repo.run(["git", "checkout", "--", rel])
        repo.repro("-s", ENV)
    if rel == "parity/core/io.py":
        assert want == set(lock) - {ENV}  # every stage writes through parity.core.io


def test_a_runner_or_the_suite_format_reruns_only_the_cells_that_run_it(two_models):
    """After env re-hashes the runners (as every `dvc repro` does first): editing the TensorRT runner
    makes nothing stale, the suite format only the report (it renders suites), never a model stage;
    editing the ORT CPU runner makes its captures stale and the stages that import it (baseline: the
    oracle's trusted ONNX path), never a torch model's reference nor a torch_cpu capture."""
    repo = two_models
    lock = yaml.safe_load((repo.path / "dvc.lock").read_text())["stages"]
    st = stages(repo.path)

    def importers(rel):
        return {n for n in lock if n != ENV and rel in closure(repo.path, stage_module(st[n.partition("@")[0]]))}

    assert importers("parity/backends/trt.py") == set() and importers("parity/suites/spec.py") == {"report"}
    edits, stale = [], set()
    try:
        for step in (("parity/backends/trt.py", "parity/suites/spec.py"), ("parity/backends/ort_cpu.py",)):
            for rel in step:
                (repo.path / rel).write_text((repo.path / rel).read_text() + "# touched\n")
                edits.append(rel)
            repo.repro("-s", ENV)
            mine = {n for n in lock if n.startswith("capture@") and n.endswith("-ort_cpu")} if len(edits) > 2 else set()
            stale = status(repo)
            assert stale == set().union(*map(importers, edits)) | mine, edits
        assert mine and not {n for n in stale if n.startswith("reference@") or n.endswith("-torch_cpu")}
    finally:
        repo.run(["git", "checkout", "--", *edits])
        repo.repro("-s", ENV)
    assert status(repo) == set()


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
