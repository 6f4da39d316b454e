"""The fp32 baseline made in the reference stage's process (parity.pipeline.baseline_torch.fold): what
baseline@<model>-fp32 publishes is byte for byte what that stage computes on its own, and publishing it
imports no torch."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from conftest import env, make_repo, tree_digest

MODEL = "tiny_mlp"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    r = make_repo(tmp_path_factory.mktemp("fold") / "repo", dtypes=("fp32",), providers=("ort_cpu",))
    r.run(["dvc", "repro"])
    return r


def _baseline(repo, root: str, e=None) -> subprocess.CompletedProcess:
    """stages.baseline as dvc.yaml runs it, its --reference and --out under `root` (same depth as artifacts/)."""
    cmd = [sys.executable, "-m", "stages.baseline", "--model", MODEL, "--dtype", "fp32",
           "--model-dir", f"artifacts/models/{MODEL}", "--inputs", f"artifacts/inputs/{MODEL}.parquet",
           "--reference", f"{root}/reference/{MODEL}/fp64.parquet", "--out", f"{root}/baseline/{MODEL}/fp32",
           "--timing", f"{root}/t.json"]
    return subprocess.run(cmd, cwd=repo.path, env=e or env(), capture_output=True, text=True)


def test_the_published_fp32_baseline_is_what_the_baseline_stage_computes(repo):
    art = repo.path / "artifacts"
    published = tree_digest(art / "baseline" / MODEL / "fp32")
    assert {"layers.parquet", "own.parquet", "oracle_sums.json", "status.json"} <= set(published)
    # the same stage with no fold beside its reference runs torch itself: the same bytes
    shutil.copytree(art / "reference", repo.path / "nofold" / "reference", copy_function=shutil.copyfile)
    shutil.rmtree(repo.path / "nofold" / "reference" / MODEL / "baseline-fp32")
    p = _baseline(repo, "nofold")
    assert p.returncode == 0 and "made by reference@" not in p.stdout, p.stdout + p.stderr
    assert tree_digest(repo.path / "nofold" / "baseline" / MODEL / "fp32") == published
    # and the fold's layers are the reference's fp32 values, byte for byte (DVC's cache keeps them once)
    assert published["layers.parquet"] == tree_digest(art / "reference" / MODEL)["fp32.parquet"]


def test_publishing_the_fold_imports_no_torch(repo, tmp_path):
    fake = tmp_path / "no-torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('torch imported to publish the fp32 baseline')\n")
    shutil.copytree(repo.path / "artifacts" / "reference", repo.path / "pub" / "reference", copy_function=shutil.copyfile)
    e = env()
    e["PYTHONPATH"] = str(fake.parent)
    # the fold was made for artifacts/baseline/...: published for that folder only
    p = _baseline(repo, "pub", e)
    assert p.returncode != 0 and "torch imported" in p.stderr  # another folder: the stage runs torch itself
    p = _baseline(repo, "artifacts", e)
    assert p.returncode == 0 and "made by reference@" in p.stdout, p.stdout + p.stderr
