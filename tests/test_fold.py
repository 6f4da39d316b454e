"""The torch work of a model in one process (parity.pipeline.fold): the export stage also makes the
reference's files and the fp32 baseline's, on the model it built; reference@<model> and
baseline@<model>-fp32 publish them. What they publish is byte for byte what those stages compute on
their own, and publishing imports no torch."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from conftest import env, make_repo, ran_stages, tree_digest

MODEL = "tiny_mlp"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    r = make_repo(tmp_path_factory.mktemp("fold") / "repo", dtypes=("fp32",), providers=("ort_cpu",))
    r.run(["dvc", "repro"])
    return r


def _stage(repo, name: str, root: str, e=None, staged: bool = False) -> subprocess.CompletedProcess:
    """stages.reference or stages.baseline as dvc.yaml runs them, their folders under `root` (the
    depth of artifacts/: own.parquet's reference path is relative)."""
    ref, base = f"{root}/reference/{MODEL}", f"{root}/baseline/{MODEL}/fp32"
    if name == "reference":
        args = ["--inputs", f"artifacts/inputs/{MODEL}.parquet", "--out", ref, "--baseline-out", base]
        args += ["--staged", f"artifacts/models/{MODEL}/reference"] if staged else []
    else:
        args = ["--dtype", "fp32", "--model-dir", f"artifacts/models/{MODEL}", "--inputs",
                f"artifacts/inputs/{MODEL}.parquet", "--reference", f"{ref}/fp64.parquet", "--out", base]
    cmd = [sys.executable, "-m", f"stages.{name}", "--model", MODEL, *args, "--timing", f"{root}/t-{name}.json"]
    return subprocess.run(cmd, cwd=repo.path, env=e or env(), capture_output=True, text=True)


def test_what_is_published_is_what_the_stages_compute_on_their_own(repo):
    art = repo.path / "artifacts"
    ref, base = tree_digest(art / "reference" / MODEL), tree_digest(art / "baseline" / MODEL / "fp32")
    assert {"fp32.parquet", "fp64.parquet", "baseline-fp32/own.parquet"} <= set(ref)
    assert {"layers.parquet", "own.parquet", "oracle_sums.json", "status.json"} <= set(base)
    # the reference stage with no staging computes the reference and the fp32 baseline itself
    p = _stage(repo, "reference", "alone")
    assert p.returncode == 0 and "made by export@" not in p.stdout, p.stdout + p.stderr
    alone = tree_digest(repo.path / "alone" / "reference" / MODEL)
    assert alone.pop("baseline-fp32/fold.json") != ref.pop("baseline-fp32/fold.json")  # the folder it is for
    assert alone == ref
    # the baseline stage with no fp32 baseline beside its reference runs torch itself: the same bytes
    shutil.rmtree(repo.path / "alone" / "reference" / MODEL / "baseline-fp32")
    p = _stage(repo, "baseline", "alone")
    assert p.returncode == 0 and "made by" not in p.stdout, p.stdout + p.stderr
    assert tree_digest(repo.path / "alone" / "baseline" / MODEL / "fp32") == base
    # the fp32 baseline's layers are the reference's fp32 values, byte for byte (DVC's cache keeps them once)
    assert base["layers.parquet"] == ref["fp32.parquet"]


def test_publishing_imports_no_torch(repo, tmp_path):
    fake = tmp_path / "no-torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('torch imported to publish')\n")
    e = env()
    e["PYTHONPATH"] = str(fake.parent)
    # staged for artifacts/...: published there only; elsewhere the stage runs torch itself
    p = _stage(repo, "reference", "pub", e, staged=True)
    assert p.returncode != 0 and "torch imported" in p.stderr
    for name, said in (("reference", "made by export@"), ("baseline", "made by export@")):
        p = _stage(repo, name, "artifacts", e, staged=True)
        assert p.returncode == 0 and said in p.stdout, p.stdout + p.stderr


def test_an_opset_change_reruns_the_reference_inside_the_export_and_nothing_after_it(repo):
    before = tree_digest(repo.path / "artifacts" / "reference" / MODEL)
    repo.edit("conf/config.yaml", "opset: 18", "opset: 20")
    ran = set(ran_stages(repo.run(["dvc", "exp", "run"]).stdout))
    assert {"export@tiny_mlp", "reference@tiny_mlp"} <= ran  # the reference publishes again: same bytes
    assert "baseline@tiny_mlp-fp32" not in ran
    assert tree_digest(repo.path / "artifacts" / "reference" / MODEL) == before
