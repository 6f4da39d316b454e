"""Speed is a feature: the light stages (env probe, inputs, diff, report) never import torch, and
the env probe writes byte-identical fingerprints on an unchanged machine."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT, env


@pytest.mark.parametrize("module", ["stages.env", "stages.inputs", "stages.diff", "stages.report",
                                    "parity.backends.ort_cpu", "parity.commands.cli"])
def test_light_modules_do_not_import_torch(module):
    code = (f"import sys, importlib; importlib.import_module({module!r}); "
            "heavy = [m for m in ('torch', 'torchvision', 'onnxscript') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env(), capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_env_probe_is_deterministic_and_per_provider(tmp_path):
    outs = []
    for k in range(2):
        out = tmp_path / f"env{k}"
        p = subprocess.run([sys.executable, "-m", "stages.env", "--out", str(out)], cwd=ROOT, env=env(),
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        outs.append({f.name: f.read_bytes() for f in sorted(out.iterdir())})
    assert outs[0] == outs[1]
    names = set(outs[0])
    assert {"provider-torch_cpu.json", "provider-ort_cpu.json", "stage-export.json", "cuda.json"} <= names
    import json

    torch_fp = json.loads(outs[0]["provider-torch_cpu.json"])
    ort_fp = json.loads(outs[0]["provider-ort_cpu.json"])
    # a driver bump touches neither; both depend on the CPU their kernels were chosen for
    assert set(torch_fp) == {"torch", "cpu"} and set(ort_fp) == {"onnx", "onnxruntime", "cpu"}


@pytest.mark.parametrize("module", ["stages.env", "stages.inputs", "stages.diff", "stages.report"])
def test_light_stage_help_loads_no_numeric_library(module):
    """`python -m stages.X --help` answers from argparse alone: numpy, pyarrow and torch (and the
    env stage's importlib.metadata) are imported only once a stage runs, so --help starts in ~0.1 s
    (benchmarks/bench.py --only help measures it)."""
    code = (f"import runpy, sys; sys.argv = [{module!r}, '--help']\n"
            f"try:\n    runpy.run_module({module!r}, run_name='__main__')\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "heavy = [m for m in ('numpy', 'pyarrow', 'torch', 'onnx') if m in sys.modules]\n"
            "print(heavy, file=sys.stderr); sys.exit(1 if heavy else 0)")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env(), capture_output=True, text=True)
    assert p.returncode == 0 and "usage: python -m " + module in p.stdout, p.stdout[-500:] + p.stderr


@pytest.mark.parametrize("module", ["stages.reference", "stages.baseline", "parity.pipeline.publish"])
def test_publishing_stages_start_without_numeric_libraries(module):
    """reference@ and baseline@<model>-fp32 mostly publish what the export made (parity.pipeline.fold):
    they import numpy, pyarrow and torch only once they compute, so publishing takes ~0.1 s a stage
    (BENCHMARKS.md 17g)."""
    code = (f"import sys, importlib; importlib.import_module({module!r}); "
            "heavy = [m for m in ('numpy', 'pyarrow', 'torch', 'onnx') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env(), capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
