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

# a tiny transformer block (MatMul weights to quantise): the int4 / int8 / plan pipeline tests' model
TINY_TB = """\
tiny_tb:
  arch: {source: parity, name: transformer_block, kwargs: {d_model: 64, n_heads: 4, d_ff: 128}}
  input:
    - {name: input, shape: [2, 16, 64], dtype: float32, init: normal, mean: 0.0, std: 1.0}
  tolerances: []
"""

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


# The run-cache pool (the suite's CPU: issue 38). A stage run with the same command, dependencies and
# params is the same run wherever it happens; DVC's run-cache knows that. Every repo make_repo builds
# starts with a *copy* (never a link: a test that corrupts a file corrupts only its own) of the DVC cache
# (objects + run-cache entries) that the session's earlier `dvc repro` / `dvc exp run` / `parity repro`
# left; after each such command the repo's new, intact cache files go to the pool. So a stage one test
# already ran is restored ("Stage '...' is cached - skipping run, checking out outputs": the same bytes)
# instead of run again, and what DVC decides is stale is unchanged (ran_stages counts both). Each stage
# still really runs in the session, the first time any test needs it. A test that needs every stage to
# run in its own repo (cache contents counted, stage output read, a failure a faked environment causes)
# passes make_repo(..., pool=False). Set by the session fixture below (xdist workers share it), off
# outside pytest and with PARITY_TEST_POOL=0.
POOL: Path | None = None
NO_POOL = ".dvc/tmp/parity-no-pool"
POOL_MAX_OBJECT = 256 << 10  # bytes: a larger output is not pooled (its stage runs in each repo); tiny models fit


def _pool_sync(src: Path, dst: Path, verify: bool) -> None:
    """Copy the files of cache `src` (files/md5/.., runs/..) that `dst` lacks, each atomically; with
    `verify`, only objects whose content still has the md5 they are named by."""
    if not src.is_dir():
        return
    for f in src.rglob("*"):
        rel = f.relative_to(src)
        if not f.is_file() or rel.name.startswith(".") or rel.name.endswith(".tmp") or (dst / rel).exists():
            continue
        if verify and rel.parts[0] == "files":  # and small: the pool is copied into every new repo
            name = "".join(rel.parts[-2:]).removesuffix(".dir")
            if f.stat().st_size > POOL_MAX_OBJECT or hashlib.md5(f.read_bytes()).hexdigest() != name:
                continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        tmp = dst / rel.parent / f".{rel.name}.{os.getpid()}.tmp"
        shutil.copyfile(f, tmp)
        os.replace(tmp, dst / rel)


def _pooled(cmd: list[str]) -> bool:
    """A command that can run stages (and so add run-cache entries): `dvc repro`, `dvc exp run`. Not
    `parity repro` (cells at once): what the pool holds came from sequential runs, so a repo restored
    from it stands for a sequential `dvc repro` (tests/test_parallel.py compares the two)."""
    return Path(cmd[0]).name == "dvc" and ("repro" in cmd or "exp" in cmd)


def run(cmd: list[str] | str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    if isinstance(cmd, str):
        cmd = cmd.split()
    p = subprocess.run(cmd, cwd=cwd, env=env(), capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    cache = Path(cwd) / ".dvc" / "cache"
    if POOL is not None and p.returncode == 0 and _pooled(cmd) and not (Path(cwd) / NO_POOL).exists():
        _pool_sync(cache, POOL, verify=True)
    return p


def ran_stages(output: str) -> list[str]:
    """The stages DVC found stale: those it ran, and those it restored from the run-cache."""
    return re.findall(r"^(?:Running stage|Stage) '([^']+)'(?::$| is cached - skipping run)", output, re.M)


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


# What `dvc init -q` writes under .dvc/ (its .gitignore, an empty config, a tmp/ folder), read once per
# process from one real `dvc init` and written into each new repo: a dvc process is ~1 s of CPU, and the
# suite builds over a hundred repos (issue 38). Not .dvc/tmp/btime: DVC creates it on its first
# command in the repo (it dates the repo for DVC's site cache; a copy would date every repo alike).
_DVC_INIT: dict[str, bytes | None] = {}


def _dvc_init(path: Path) -> None:
    """Write what `dvc init -q` writes into the git repo `path` (holding the project's .dvcignore)."""
    if not _DVC_INIT:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="parity-dvc-init-") as td:
            t = Path(td)
            shutil.copy2(ROOT / ".dvcignore", t / ".dvcignore")
            run("git init -q", t)
            run("dvc init -q", t)
            assert (t / ".dvcignore").read_bytes() == (ROOT / ".dvcignore").read_bytes()  # left as it was
            made = {str(f.relative_to(t)): None if f.is_dir() else f.read_bytes()
                    for f in sorted((t / ".dvc").rglob("*")) if f.name != "btime"}
            _DVC_INIT.update(made)
    for rel, data in _DVC_INIT.items():
        if data is None:
            (path / rel).mkdir(parents=True, exist_ok=True)
        else:
            (path / rel).parent.mkdir(parents=True, exist_ok=True)
            (path / rel).write_bytes(data)


# params.yaml as `parity compose` writes it, by the digest of the repo it composed in (conf/'s bytes, every
# other file's name and size): a Hydra composition in a fresh process is ~1.2 s of CPU, and most new repos
# compose the same few conf trees (issue 38). A repo not seen before in this process is composed by the
# real command.
_COMPOSED: dict[str, bytes] = {}


def _compose(repo: Repo) -> None:
    """Write the repo's params.yaml as `parity compose` does (the real command once per distinct repo)."""
    h = hashlib.md5()
    for f in sorted(repo.path.rglob("*")):
        rel = f.relative_to(repo.path)
        if f.is_file() and rel.parts[0] not in (".git", ".dvc"):
            h.update(f"{rel}\0{f.stat().st_size}\0".encode() + (f.read_bytes() if rel.parts[0] == "conf" else b""))
    key = h.hexdigest()
    if key in _COMPOSED:
        (repo.path / "params.yaml").write_bytes(_COMPOSED[key])
        return
    repo.run([f"{BIN}/parity", "compose"])
    _COMPOSED[key] = (repo.path / "params.yaml").read_bytes()


def make_repo(path: Path, models=("tiny_mlp",), dtypes=("fp32", "fp16"), providers=("torch_cpu", "ort_cpu"),
              compose=True, pool=True) -> Repo:
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
    _dvc_init(path)  # what `dvc init -q` writes
    # what `dvc config hydra.enabled true`, `dvc config core.autostage true` and `dvc config cache.type
    # <the project's link type>` write, written here (three dvc processes, ~2 s of CPU per repo: issue 38)
    dvc_config = "[hydra]\n    enabled = true\n[core]\n    autostage = true\n"
    if POOL is not None and pool:
        _pool_sync(POOL, path / ".dvc" / "cache", verify=False)
    elif POOL is not None:
        (path / NO_POOL).parent.mkdir(exist_ok=True)
        (path / NO_POOL).touch()  # nothing of this repo's goes to the pool either (git-ignored, as .dvc/tmp is)
    # the project's cache link type (.dvc/config: links, not copies; README "Disk")
    cache_type = re.search(r"^\[cache\]\n(?:\s+.*\n)*?\s+type = \"?([\w,]+)", (ROOT / ".dvc/config").read_text(), re.M)
    if cache_type:
        dvc_config += f'[cache]\n    type = "{cache_type.group(1)}"\n'
    assert not (path / ".dvc" / "config").read_text().strip()  # `dvc init` leaves it empty
    (path / ".dvc" / "config").write_text(dvc_config)
    repo.set_defaults(models=models, dtypes=dtypes, providers=providers)
    repo.edit("conf/config.yaml", "repeats: 10", "repeats: 2")
    if compose:
        _compose(repo)  # what `parity compose` writes
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


@pytest.fixture(scope="session", autouse=True)
def _run_cache_pool(tmp_path_factory):
    """The run-cache pool's folder: one per session, shared by xdist's workers."""
    global POOL
    if os.environ.get("PARITY_TEST_POOL", "1") == "0":
        yield
        return
    base = tmp_path_factory.getbasetemp()
    POOL = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "dvc-run-cache-pool"
    POOL.mkdir(exist_ok=True)
    yield
    POOL = None


@pytest.fixture
def repo(tmp_path) -> Repo:
    return make_repo(tmp_path / "repo")


# resolved once: a test that changes directory must not send the next lines elsewhere
CPU_LOG = os.path.abspath(os.environ["PARITY_TEST_CPU"]) if os.environ.get("PARITY_TEST_CPU") else None


def _cpu() -> float:
    """CPU seconds (user+sys) of this process and every child it has waited for (stages, dvc, git)."""
    import resource

    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """PARITY_TEST_CPU=<file>: append each test's CPU seconds (setup, call and teardown, its
    subprocesses included) to <file>, one `seconds<TAB>nodeid` line: where the suite's CPU goes."""
    out = CPU_LOG
    t0 = _cpu() if out else 0.0
    yield
    if out:
        with open(out, "a") as f:
            f.write(f"{_cpu() - t0:.2f}\t{item.nodeid}\n")
