"""reduce@model-dtype-provider (analysis.reduce: true; parity/analysis/reduce.py): a fault injected into
one node by the ort_cpu diagnostic option `fault` fails the cell; the reduce stage shrinks the plain graph
to that node and writes a repro.py that exits 1 on the graph as the provider runs it and 0 on the
unfaulted one. The resnet50 case (slow) also runs repro.py in a fresh venv holding only numpy and
onnxruntime."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import make_repo
from tests.test_onnx_source import onnx_repo

FAULT = "+providers.ort_cpu.options.fault={node: %s, scale: 1.05}"


def _repro(cell: Path, *args, python=sys.executable) -> subprocess.CompletedProcess:
    return subprocess.run([python, "repro.py", *args], cwd=cell, capture_output=True, text=True)


def test_reduce_finds_the_faulty_node_and_repro_exits_1_then_0(tmp_path):
    r = onnx_repo(tmp_path / "repo", providers=("ort_cpu",))
    ran = r.exp_run("analysis.reduce=true", FAULT % "conv2", "dtypes=[fp32]")
    assert "reduce@tiny_onnx-fp32-ort_cpu" in ran
    cell = r.path / "artifacts/reduce/tiny_onnx-fp32-ort_cpu"
    red = json.loads((cell / "reduce.json").read_text())
    assert red["status"] == "REDUCED", red
    assert red["nodes"] == ["conv2"] and red["op_types"] == ["Conv"], red
    assert red["inputs"] == ["r1"] and red["outputs"] == ["c2"]
    bad = _repro(cell)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "MISMATCH c2" in bad.stdout
    good = _repro(cell, "reduced.source.onnx")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "all 1 outputs match" in good.stdout
    report = (r.path / "artifacts/report/report.md").read_text()
    assert "(../reduce/tiny_onnx-fp32-ort_cpu/repro.py)" in report  # the report links the repro
    # the same reduction gives the same bytes (DVC stops at unchanged outputs)
    first = {f.name: f.read_bytes() for f in cell.iterdir()}
    r.run(["dvc", "repro", "-f", "-s", "reduce@tiny_onnx-fp32-ort_cpu"])
    assert {f.name: f.read_bytes() for f in cell.iterdir()} == first


def test_reduce_skips_passing_cells_and_names_a_missing_fault_node(tmp_path):
    r = onnx_repo(tmp_path / "repo", providers=("ort_cpu",))
    r.exp_run("analysis.reduce=true", "dtypes=[fp32]")
    red = json.loads((r.path / "artifacts/reduce/tiny_onnx-fp32-ort_cpu/reduce.json").read_text())
    assert red["status"] == "SKIPPED" and "verdict PASS" in red["reason"]
    r.exp_run(FAULT % "no_such_node", "dtypes=[fp32]")
    st = json.loads((r.path / "artifacts/capture/tiny_onnx-fp32-ort_cpu/status.json").read_text())
    assert st["status"] == "EXPORT_FAIL" and "no_such_node" in st["reason"] and "conv1" in st["reason"], st


@pytest.mark.slow
def test_resnet50_fault_reduces_to_at_most_3_nodes_and_repro_runs_in_a_bare_venv(tmp_path):
    import onnx

    r = make_repo(tmp_path / "repo", models=("resnet50",), dtypes=("fp32",), providers=("ort_cpu",))
    r.repro("export@resnet50")
    from parity.models.onnx_weights import load_with_data  # weights.bin is hard-linked by DVC

    m = load_with_data(r.path / "artifacts/models/resnet50/model.onnx")
    convs = [n.name for n in m.graph.node if n.op_type == "Conv"]
    deep = convs[-5]  # layer4, deep in the graph
    r.exp_run("analysis.reduce=true", FAULT % deep)
    cell = r.path / "artifacts/reduce/resnet50-fp32-ort_cpu"
    red = json.loads((cell / "reduce.json").read_text())
    assert red["status"] == "REDUCED" and deep in red["nodes"] and len(red["nodes"]) <= 3, red
    venv = tmp_path / "reprovenv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    import numpy
    import onnxruntime

    pip = subprocess.run([str(venv / "bin/pip"), "install", "-q", f"numpy=={numpy.__version__}",
                          f"onnxruntime=={onnxruntime.__version__}"], capture_output=True, text=True)
    if pip.returncode:
        pytest.skip(f"no registry access for a fresh venv: {pip.stderr[-300:]}")
    py = str(venv / "bin/python")
    assert _repro(cell, python=py).returncode == 1
    assert _repro(cell, "reduced.source.onnx", python=py).returncode == 0
