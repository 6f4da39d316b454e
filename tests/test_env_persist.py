"""The env stage's outputs persist between runs (issue 38: env/dvc.yaml `persist: true`,
parity.pipeline.envfiles): the probe leaves every file whose bytes it would write unchanged as it is (not
rewritten: DVC, which no longer deletes them first, finds them unchanged in its state and hashes nothing;
it still re-links them, as it does every output of a stage that ran), a changed fingerprint replaces only
its files without writing through the link into DVC's cache, a provider dropped from params loses its
files, and the folders always hold exactly what a run from scratch writes."""

import hashlib
import subprocess
import sys

from conftest import BIN, env, make_repo, ran_stages

ENV = "env/dvc.yaml:env"
DIRS = ("artifacts/env", "artifacts/code")


def _files(root, dirs=DIRS):
    return {f.relative_to(root).as_posix(): (f.stat().st_ino, f.stat().st_ctime_ns, f.read_bytes())
            for d in dirs for f in sorted((root / d).iterdir())}


def _repro_env(repo, **extra):
    p = subprocess.run(["dvc", "repro", "-s", ENV], cwd=repo.path, env=dict(env(), **extra),
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert ran_stages(p.stdout) == [ENV]
    return _files(repo.path)


def _from_scratch(repo, tmp_path, **extra):
    out = tmp_path / "scratch"
    _probe(repo, out, **extra)
    return {f"artifacts/{f.relative_to(out).as_posix()}": f.read_bytes() for f in sorted(out.rglob("*.json"))}


def _probe(repo, out, **extra):
    p = subprocess.run([sys.executable, "-m", "stages.env", "--out", str(out / "env"), "--code", str(out / "code")],
                       cwd=repo.path, env=dict(env(), **extra), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def _cache_intact(repo):
    """Every object in DVC's cache still holds the bytes its name says (nothing written through a link)."""
    objs = [f for f in (repo.path / ".dvc/cache/files/md5").rglob("*") if f.is_file() and not f.name.endswith(".dir")]
    bad = [f for f in objs if hashlib.md5(f.read_bytes()).hexdigest() != f.parent.name + f.name]
    assert objs and not bad, bad


def test_a_noop_run_leaves_the_env_files_as_they_are(tmp_path):
    repo = make_repo(tmp_path / "repo", dtypes=("fp32",), providers=("torch_cpu", "ort_cpu"), pool=False)
    first = _repro_env(repo)
    assert {k: v[-1] for k, v in first.items()} == _from_scratch(repo, tmp_path)
    assert {k: v[::2] for k, v in _repro_env(repo).items()} == {k: v[::2] for k, v in first.items()}  # same links
    out = tmp_path / "direct"
    _probe(repo, out)
    written = _files(out, ("env", "code"))
    _probe(repo, out)  # again, no DVC: nothing rewritten (same inodes, ctimes untouched)
    assert _files(out, ("env", "code")) == written
    assert repo.run(["dvc", "status", ENV]).stdout.split() == [f"{ENV}:", "always", "changed"]

    masked = _repro_env(repo, ONEDNN_MAX_CPU_ISA="AVX2")  # a runtime change: the cpu fingerprint moves
    moved = {k for k in masked if masked[k][-1] != first[k][-1]}
    assert "artifacts/env/cpu.json" in moved and "artifacts/env/provider-ort_cpu.json" in moved
    assert all(masked[k][0] == first[k][0] for k in masked if k not in moved)  # the rest: the same links
    assert {k: v[-1] for k, v in masked.items()} == _from_scratch(repo, tmp_path / "m", ONEDNN_MAX_CPU_ISA="AVX2")
    _cache_intact(repo)
    assert {k: v[-1] for k, v in _repro_env(repo).items()} == {k: v[-1] for k, v in first.items()}  # and back


def test_a_provider_dropped_from_params_loses_its_files(tmp_path):
    repo = make_repo(tmp_path / "repo", dtypes=("fp32",), providers=("torch_cpu", "ort_cpu"), pool=False)
    before = _repro_env(repo)
    assert "artifacts/env/provider-ort_cpu.json" in before and "artifacts/code/provider-ort_cpu.json" in before
    repo.set_defaults(providers=("torch_cpu",))
    repo.run([f"{BIN}/parity", "compose"])
    after = _repro_env(repo)
    assert {k: v[-1] for k, v in after.items()} == _from_scratch(repo, tmp_path)
    assert set(before) - set(after) == {"artifacts/env/provider-ort_cpu.json", "artifacts/code/provider-ort_cpu.json"}
    _cache_intact(repo)
