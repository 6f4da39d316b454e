"""The GPU check's CPU side (issue 39, docs/gpu-verification.md): the first user flow - `dvc repro` after
a driver bump re-runs exactly the cells of the providers that use CUDA - rehearsed with an edited copy
of /proc/driver/nvidia (PARITY_NVIDIA_PROC, as scripts/gpu-check.sh does on the GPU machine), and the
kit's scripts parse."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import ROOT, make_repo

DRIVER = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {}  Thu Oct  9 2026\n"


def fake_driver(d, version: str):
    (d / "gpus" / "0000:00:05.0").mkdir(parents=True, exist_ok=True)
    (d / "version").write_text(DRIVER.format(version))
    (d / "gpus" / "0000:00:05.0" / "information").write_text("Model: \t\t NVIDIA H200\nIRQ:   \t\t 33\n")


def test_a_driver_bump_reruns_only_the_cuda_cells(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia"
    fake_driver(fake, "580.159.04")
    monkeypatch.setenv("PARITY_NVIDIA_PROC", str(fake))
    r = make_repo(tmp_path / "repo", dtypes=("fp32",), providers=("torch_cpu", "torch_cuda"))
    first = r.repro()
    assert any("torch_cuda" in s for s in first) and any("torch_cpu" in s for s in first), first
    cuda = json.loads((r.path / "artifacts/env/cuda.json").read_text())
    assert cuda == {"available": True, "driver": "580.159.04", "gpus": ["NVIDIA H200"]}
    assert r.repro() == ["env/dvc.yaml:env"]          # nothing changed: only the probe runs
    fake_driver(fake, "580.200.01")                    # the driver bump
    again = r.repro()
    cells = [s for s in again if s != "env/dvc.yaml:env"]
    assert cells and all("torch_cuda" in s or s == "report" for s in cells), again
    assert json.loads((r.path / "artifacts/env/cuda.json").read_text())["driver"] == "580.200.01"


@pytest.mark.parametrize("script", ["gpu-check.sh", "gpu-kit.sh", "gpu-rehearsal.sh"])
def test_the_kit_scripts_parse(script):
    p = subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_each_autocast_dtype_gets_its_own_inductor_cache(monkeypatch, tmp_path):
    """torch 2.11 (the GPU image's) served a graph compiled under autocast(float16) from Inductor's disk
    cache to an autocast(bfloat16) process: amp_bf16 cells computed fp16 (docs/gpu-verification.md).
    The compile runner gives each autocast dtype its own cache folder under the one in use."""
    import os

    import torch

    from parity.backends.torch_compile import CACHE_BASE_ENV, isolate_autocast_cache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv(CACHE_BASE_ENV, "")
    fp16 = isolate_autocast_cache(torch.float16)
    bf16 = isolate_autocast_cache(torch.bfloat16)
    assert fp16 == str(tmp_path / "inductor" / "autocast-float16")
    assert bf16 == str(tmp_path / "inductor" / "autocast-bfloat16")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == bf16
