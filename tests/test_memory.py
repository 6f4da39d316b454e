"""Know before you run out (parity/core/memory.py): a heavy stage refuses a cell whose estimated peak exceeds
the memory available, before it writes anything; every stage records its peak RSS apart from the values;
a stage killed before its output is published leaves no output file; DVC's cache shares bytes with the
workspace (links) and stages still replace their outputs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import env, is_temp, make_repo, tree_digest

from parity.core import memory

MODEL, CELL = "tiny_mlp", "tiny_mlp-fp32-ort_cpu"
STAGES = {  # each heavy stage's command, as dvc.yaml gives it (outputs under a scratch folder here)
    "export": ["stages.export", "--model", MODEL, "--out", "{out}/models", "--timing", "{out}/t-export.json"],
    "reference": ["stages.reference", "--model", MODEL, "--inputs", "artifacts/inputs/tiny_mlp.parquet",
                  "--out", "{out}/reference", "--timing", "{out}/t-reference.json"],
    "baseline": ["stages.baseline", "--model", MODEL, "--dtype", "fp32", "--model-dir", "artifacts/models/tiny_mlp",
                 "--inputs", "artifacts/inputs/tiny_mlp.parquet",
                 "--reference", "artifacts/reference/tiny_mlp/fp64.parquet", "--out", "{out}/baseline",
                 "--timing", "{out}/t-baseline.json"],
    "capture": ["stages.capture", "--model", MODEL, "--dtype", "fp32", "--provider", "ort_cpu",
                "--model-dir", "artifacts/models/tiny_mlp", "--inputs", "artifacts/inputs/tiny_mlp.parquet",
                "--reference", "artifacts/reference/tiny_mlp/fp64.parquet", "--out", "{out}/capture",
                "--timing", "{out}/t-capture.json"],
}


def stage_cmd(stage: str, out: str) -> list[str]:
    return [sys.executable, "-m", *(a.format(out=out) for a in STAGES[stage])]


def run_env(**extra) -> dict:
    e = env()
    e.pop(memory.CHECK_ENV, None)
    e.pop(memory.AVAILABLE_ENV, None)
    e.update(extra)
    return e


def digest(repo) -> dict:
    d = tree_digest(repo.path / "artifacts")
    d["params.yaml"] = hashlib.md5((repo.path / "params.yaml").read_bytes()).hexdigest()
    return d


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    r = make_repo(tmp_path_factory.mktemp("mem") / "repo", dtypes=("fp32",), providers=("ort_cpu",))
    r.run(["dvc", "repro"])
    return r


def test_the_estimate_and_its_refusal_line(monkeypatch):
    monkeypatch.delenv(memory.CHECK_ENV, raising=False)
    a, b, base = memory.COEFFICIENTS["capture"]
    w, sa = 2 << 30, 1 << 30
    assert memory.estimate("capture", w, sa) == int(a * w + b * sa + base * memory.GiB)
    monkeypatch.setenv(memory.AVAILABLE_ENV, str(1 << 30))
    line = memory.refusal("capture", "m-fp32-ort_cpu", "m", w, sa, 2)
    assert "\n" not in line and line.startswith("capture@m-fp32-ort_cpu: refused before allocating")
    for part in (f"{memory.estimate('capture', w, sa) / memory.GiB:.2f} GiB", "W 2.00 GiB", "SA 1.00 GiB",
                 "1.00 GiB available (PARITY_MEMORY_AVAILABLE)", "inputs.samples=2", "models.m.input",
                 "lower precision dtype", "PARITY_MEMORY_CHECK=0"):
        assert part in line, (part, line)
    monkeypatch.setenv(memory.AVAILABLE_ENV, str(memory.estimate("capture", w, sa)))
    assert memory.refusal("capture", "m-fp32-ort_cpu", "m", w, sa, 2) is None  # fits exactly
    monkeypatch.setenv(memory.AVAILABLE_ENV, "1")
    monkeypatch.setenv(memory.CHECK_ENV, "0")
    assert memory.refusal("capture", "m-fp32-ort_cpu", "m", w, sa, 2) is None  # the escape hatch


def test_meta_sizing_matches_what_a_real_run_holds():
    """W and SA from the meta device equal the fp32 weights and every recorded output of a real run,
    for a zoo MLP and a Hugging Face decoder (whose mask helpers branch on tensor values); the meta
    override of `.item()` does not outlive the sizing."""
    import torch

    from parity.models import build
    from parity.pipeline import memsize
    from parity.models.layers import LayerRecorder

    gpt2 = {"arch": {"source": "hf", "name": "gpt2",
                     "kwargs": {"vocab_size": 64, "n_embd": 16, "n_layer": 2, "n_head": 2, "n_positions": 32}},
            "input": [{"name": "input_ids", "shape": [1, 8], "dtype": "int64", "init": "tokens"}]}
    mlp = {"arch": {"source": "parity", "name": "mlp", "kwargs": {"in_features": 16, "hidden": 32, "out_features": 8}},
           "input": [{"name": "input", "shape": [4, 16], "dtype": "float32"}]}
    for name, m in (("mlp", mlp), ("gpt2", gpt2)):
        w, sa = memsize.sizes({"models": {name: m}}, name, samples=3)
        net = build(m["arch"], 0)
        assert w == sum(t.numel() * 4 for t in [*net.parameters(), *net.buffers()] if t.is_floating_point())
        x = torch.zeros(m["input"][0]["shape"], dtype=getattr(torch, m["input"][0]["dtype"]))
        with torch.no_grad():
            outs = LayerRecorder(net)(x)
        assert sa == 3 * sum(o.numel() * 4 for o in outs if o.is_floating_point()), name
    with pytest.raises(RuntimeError, match="meta"):
        torch.zeros(2, device="meta").sum().item()


def test_a_refused_stage_exits_nonzero_with_one_line_and_writes_nothing(repo):
    before = digest(repo)
    for stage in STAGES:
        p = subprocess.run(stage_cmd(stage, "artifacts"), cwd=repo.path, capture_output=True, text=True,
                           env=run_env(PARITY_MEMORY_AVAILABLE="1000"))
        lines = [x for x in p.stderr.splitlines() if x.strip()]
        assert p.returncode != 0 and len(lines) == 1, (stage, p.returncode, p.stderr)
        assert lines[0].startswith(f"{stage}@") and "refused before allocating" in lines[0], lines[0]
        assert " GiB" in lines[0] and "W " in lines[0] and "available (PARITY_MEMORY_AVAILABLE)" in lines[0]
    assert digest(repo) == before  # nothing written, not even a temp file
    # the same through DVC: the stage fails, its outputs are not created
    e = run_env(PARITY_MEMORY_AVAILABLE="1000")
    p = subprocess.run(["dvc", "repro", "-s", "-f", "export@tiny_mlp"], cwd=repo.path, capture_output=True,
                       text=True, env=e)
    assert p.returncode != 0 and "export@tiny_mlp: refused before allocating" in p.stderr + p.stdout
    assert not (repo.path / "artifacts/models/tiny_mlp").exists()
    # the escape hatch: PARITY_MEMORY_CHECK=0 runs it anyway
    p = subprocess.run(["dvc", "repro", "-s", "-f", "export@tiny_mlp"], cwd=repo.path, capture_output=True,
                       text=True, env={**e, "PARITY_MEMORY_CHECK": "0"})
    assert p.returncode == 0, p.stderr
    assert repo.run(["dvc", "status", "export@tiny_mlp"]).stdout.strip().endswith("up to date.")


def test_every_heavy_stage_records_its_peak_rss_apart_from_the_values(repo):
    art = repo.path / "artifacts"
    for rel in ("timing/export/tiny_mlp.json", f"timing/{CELL}.json"):
        t = json.loads((art / rel).read_text())
        assert t["peak_rss_kib"] > 10_000 and t["estimate_bytes"] > t["w_bytes"] > 0, (rel, t)
    # the reference and the fp32 baseline are made in the export's process (parity.pipeline.fold): their
    # stages publish them, holding no model (no estimate), and say where they were made
    for rel in ("timing/reference/tiny_mlp.json", "timing/baseline/tiny_mlp-fp32.json"):
        t = json.loads((art / rel).read_text())
        assert t["peak_rss_kib"] > 5_000 and t["made_by"] == "export@tiny_mlp" and "estimate_bytes" not in t, (rel, t)
    assert json.loads((art / f"timing/{CELL}.json").read_text())["latency"] is False  # capture's keys kept
    md = (art / "report/report.md").read_text()
    table = md[md.index("## Memory: peak RSS per stage"):md.index("## Environment")]
    assert json.loads((art / f"timing/diff/{CELL}.json").read_text())["peak_rss_kib"] > 10_000  # light: no estimate
    for stage in ("export@tiny_mlp", "reference@tiny_mlp", "baseline@tiny_mlp-fp32", f"capture@{CELL}", f"diff@{CELL}"):
        row = next(x for x in table.splitlines() if x.startswith(f"| {stage} |"))
        assert " MiB |" in row, row
    assert "<section id='memory'>" in (art / "report/report.html").read_text()


def test_the_report_works_without_timing_files(repo, tmp_path):
    """An older run has no per-stage timing files: the report shows '-' for them."""
    art = repo.path / "artifacts"
    shutil.copytree(art, tmp_path / "art", symlinks=True)
    shutil.rmtree(tmp_path / "art/timing/reference")
    (tmp_path / "art" / "timing" / f"{CELL}.json").unlink()
    repo.run([sys.executable, "-m", "stages.report", "--artifacts", str(tmp_path / "art"), "--out", str(tmp_path / "rep")])
    md = (tmp_path / "rep/report.md").read_text()
    assert "| reference@tiny_mlp | - | - |" in md and f"| capture@{CELL} | - | - |" in md
    assert "| export@tiny_mlp | " in md and "| export@tiny_mlp | - |" not in md


def test_a_stage_killed_before_its_output_is_published_leaves_no_output_file(repo):
    """SIGKILL while reference's fp32.parquet is written but not yet renamed into place: no fp32.parquet,
    only the hidden temp file of parity.core.io.atomic_path (conftest.is_temp); the next run publishes complete
    files, and `dvc repro` of the stage clears a temp file left in its output folder."""
    from parity.core import store
    from parity.core.io import PAUSE_ENV

    out = repo.path / "artifacts/killed"
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.Popen(stage_cmd("reference", "artifacts/killed"), cwd=repo.path, env=run_env(**{
        PAUSE_ENV: "fp32.parquet"}), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not list((out / "reference").glob(".fp32.parquet.*.tmp")):
            assert proc.poll() is None and time.monotonic() < deadline, "the stage ended before writing"
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    left = sorted(p.name for p in (out / "reference").iterdir())
    assert left and all(is_temp(n) for n in left), left  # no fp32.parquet, no fp64.parquet
    assert not (out / "t-reference.json").exists()
    subprocess.run(stage_cmd("reference", "artifacts/killed"), cwd=repo.path, env=run_env(), check=True,
                   capture_output=True)
    assert sum(1 for _ in store.read(out / "reference/fp32.parquet")) > 0  # complete, readable
    # a temp file left inside a DVC output: the stage's re-run starts from an empty folder
    stale = repo.path / "artifacts/reference/tiny_mlp" / left[0]
    shutil.copy(out / "reference" / left[0], stale)
    repo.run(["dvc", "repro", "-s", "reference@tiny_mlp"])
    assert not stale.exists()
    assert "up to date" in repo.run(["dvc", "status", "reference@tiny_mlp"]).stdout
    shutil.rmtree(out)


def test_cache_links_the_workspace_and_forced_reruns_replace_outputs(repo):
    """cache.type (.dvc/config): outputs are links into the cache, not copies; `dvc repro -f` replaces
    them by atomic rename and `dvc checkout` restores them."""
    f = repo.path / "artifacts/reference/tiny_mlp/fp32.parquet"
    assert f.stat().st_nlink >= 2 or f.is_symlink()  # shared with .dvc/cache
    before = digest(repo)
    repo.run(["dvc", "repro", "-f", "-s", "reference@tiny_mlp"])
    assert f.stat().st_nlink >= 2 or f.is_symlink()
    after = digest(repo)
    assert {k for k in before if before[k] != after.get(k)} <= {"timing/reference/tiny_mlp.json"}
    f.unlink()
    repo.run(["dvc", "checkout", "reference@tiny_mlp"])
    assert digest(repo) == after
    assert "up to date" in repo.run(["dvc", "status", "reference@tiny_mlp"]).stdout
