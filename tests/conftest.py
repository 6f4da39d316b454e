"""Shared fixtures: real DVC in a temporary git repo holding a copy of the project.

Tests add a tiny model as a conf file (what a user does to add a model), select it in
conf/config.yaml, and drive the real pipeline with `dvc repro` / `dvc exp run`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = str(Path(sys.executable).parent)
PROJECT_FILES = ["dvc.yaml", "env", "conf", "stages", "parity", "hydra_plugins", ".dvcignore", "data"]
# The env probe's DVC address (it lives in env/dvc.yaml, with a dvc.lock of its own): how `dvc repro`
# prints it ("Running stage 'env/dvc.yaml:env'") and how `dvc status --json` / `dvc repro -s` name it.
ENV = "env/dvc.yaml:env"

TINY_MLP = """\
tiny_mlp:
  arch:
    source: parity
    name: mlp
    kwargs: {in_features: 16, hidden: 32, out_features: 8}
  input:
    - {name: input, shape: [4, 16], dtype: float32, init: normal, mean: 0.0, std: 1.0}
  tolerances: []
"""


CONF = ROOT / "conf"


def options(group: str) -> list[str]:
    """Every option of a conf/ group (one yaml file each)."""
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def composed(*overrides) -> dict:
    """Compose the real conf/ with Hydra, resolved, as DVC's compose does (plugins registered)."""
    import hydra_plugins.parity_conf  # noqa: F401  (${parity_validate:}, ${parity_coverage_dep:})
    import hydra_plugins.parity_providers  # noqa: F401  (${parity_providers:})
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(str(CONF), version_base=None):
        cfg = compose("config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


def config_error(params: dict, mutate) -> str:
    """The ConfigError message parity.config.params.validate gives for a mutated copy of `params`."""
    import copy

    from parity.config import params as config

    p = copy.deepcopy(params)
    mutate(p)
    with pytest.raises(config.ConfigError) as e:
        config.validate(p)
    return str(e.value)


def is_temp(path) -> bool:
    """A temp file parity.core.io.atomic_path writes before it publishes (`.<name>.*.tmp`), never an artifact."""
    from parity.core.io import TMP_SUFFIX

    name = Path(path).name
    return name.startswith(".") and name.endswith(TMP_SUFFIX)


def env() -> dict:
    e = dict(os.environ)
    e["PATH"] = BIN + os.pathsep + e.get("PATH", "")
    e.pop("PYTHONPATH", None)
    e["DVC_NO_ANALYTICS"] = "1"
    e["GIT_AUTHOR_NAME"] = e["GIT_COMMITTER_NAME"] = "parity-test"
    e["GIT_AUTHOR_EMAIL"] = e["GIT_COMMITTER_EMAIL"] = "test@parity.local"
    return e


def run(cmd: list[str] | str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    if isinstance(cmd, str):
        cmd = cmd.split()
    p = subprocess.run(cmd, cwd=cwd, env=env(), capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def ran_stages(output: str) -> list[str]:
    return re.findall(r"^Running stage '([^']+)'", output, re.M)


def tree_digest(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    return {str(f.relative_to(path)): hashlib.md5(f.read_bytes()).hexdigest()
            for f in sorted(path.rglob("*")) if f.is_file()}


class Repo:
    def __init__(self, path: Path):
        self.path = path

    def run(self, cmd, check=True):
        return run(cmd, self.path, check)

    def repro(self, *args) -> list[str]:
        return ran_stages(self.run(["dvc", "repro", *args]).stdout)

    def exp_run(self, *overrides) -> list[str]:
        args = [a for o in overrides for a in ("-S", o)]
        return ran_stages(self.run(["dvc", "exp", "run", *args]).stdout)

    def set_defaults(self, **groups):
        """Rewrite the `- group: [...]` lines of conf/config.yaml's defaults list."""
        cfg = self.path / "conf" / "config.yaml"
        text = cfg.read_text()
        for g, opts in groups.items():
            text, n = re.subn(rf"^  - {g}: \[.*\]$", f"  - {g}: [{', '.join(opts)}]", text, flags=re.M)
            assert n == 1, g
        cfg.write_text(text)

    def edit(self, rel: str, old: str, new: str):
        f = self.path / rel
        text = f.read_text()
        assert old in text, (rel, old)
        f.write_text(text.replace(old, new))

    def commit(self, msg="update"):
        self.run(["git", "add", "-A"])
        self.run(["git", "commit", "-qm", msg, "--allow-empty"])


def make_repo(path: Path, models=("tiny_mlp",), dtypes=("fp32", "fp16"), providers=("torch_cpu", "ort_cpu"),
              compose=True) -> Repo:
    path.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_FILES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, path / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, path / name)
    (path / "conf" / "models" / "tiny_mlp.yaml").write_text(TINY_MLP)
    (path / ".gitignore").write_text("/artifacts/\n__pycache__/\n")
    repo = Repo(path)
    repo.run("git init -q")
    repo.run("dvc init -q")
    repo.run("dvc config hydra.enabled true")
    repo.run("dvc config core.autostage true")
    # the project's cache link type (.dvc/config: links, not copies; README "Disk")
    cache_type = re.search(r"^\[cache\]\n(?:\s+.*\n)*?\s+type = \"?([\w,]+)", (ROOT / ".dvc/config").read_text(), re.M)
    if cache_type:
        repo.run(["dvc", "config", "cache.type", cache_type.group(1)])
    repo.set_defaults(models=models, dtypes=dtypes, providers=providers)
    repo.edit("conf/config.yaml", "repeats: 10", "repeats: 2")
    if compose:
        repo.run([f"{BIN}/parity", "compose"])
    repo.commit("init")
    return repo


def fp16_regression(path: Path, tight: str) -> Repo:
    """Two commits, verdicts by tolerance on ort_cpu: fp16 at a loose tolerance (every cell passes),
    then fp16 at `tight` (a `tol: {...}` flow mapping the fp16 cells cannot meet: they regress)."""
    r = make_repo(path, providers=("ort_cpu",))
    r.edit("conf/config.yaml", "verdict: oracle", "verdict: tolerance")  # the verdict these tolerances decide
    r.edit("conf/dtypes/fp16.yaml", "tol: {atol: 1.0e-5, rtol: 1.0e-3}", "tol: {atol: 1.0, rtol: 1.0}")
    r.exp_run()
    r.commit("loose fp16")
    r.edit("conf/dtypes/fp16.yaml", "tol: {atol: 1.0, rtol: 1.0}", tight)
    r.exp_run()
    r.commit("tight fp16")
    return r


@pytest.fixture
def repo(tmp_path) -> Repo:
    return make_repo(tmp_path / "repo")
