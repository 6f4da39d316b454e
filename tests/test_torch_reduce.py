"""Reduce against torch (parity.analysis.torch_reduce): a fault in the exported graph itself (what an
exporter bug looks like) is one the provider shares with ORT, so the provider-vs-ORT reduction cannot
see it. Checked against torch's recorded per-layer values instead, the faulty layer is found in
layers.onnx (a fault in both graphs) or in model.onnx alone (a fault only in the plain graph), cut to
its nodes, and repro.py exits 1 on it against torch's values and 0 on the same node unfaulted.

In process, on TINY_MLP exported by the export stage's own function (one weights.bin), with the
reference (fp64, LayerRecorder with inputs) and the baseline's own values (torch CPU fp32) computed
as those stages compute them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from parity.core import store  # noqa: E402
from parity.analysis import torch_reduce  # noqa: E402
from parity.analysis.faults import inject, inject_dir  # noqa: E402

ARCH = {"source": "parity", "name": "mlp", "kwargs": {"in_features": 16, "hidden": 32, "out_features": 8}}
MODEL = {"arch": ARCH, "input": [{"name": "input", "shape": [4, 16], "dtype": "float32", "init": "normal",
                                  "mean": 0.0, "std": 1.0}], "tolerances": []}
K, SLACK = 4.0, 1e-6


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """(clean model dir, samples, fp64 {(s, name): Tensor}, baseline own {(s, name): Tensor})."""
    import torch

    from parity.backends.runner import CaptureJob
    from parity.backends.torch_cpu import TorchCpuRunner
    from parity.models import build
    from parity.models.layers import LayerRecorder
    from parity.pipeline.export import export_model

    d = tmp_path_factory.mktemp("tr") / "clean"
    export_model({"models": {"tiny": MODEL}, "export": {"exporter": "dynamo", "opset": 18}, "seed": 0}, "tiny", d)
    samples, gold, base_own = [], {}, {}
    job = CaptureJob(model="tiny", model_cfg=MODEL, dtype="fp32", dtype_cfg={"torch": "float32"},
                     provider="torch_cpu", provider_cfg={}, model_dir=d)
    base = TorchCpuRunner(job)
    base.activate()
    for s in range(2):
        x = np.random.default_rng(s).standard_normal((4, 16)).astype(np.float32)
        rec = LayerRecorder(build(ARCH, 0).double(), inputs=True)
        with torch.no_grad():
            outs = rec(torch.from_numpy(x).double())
        ref = {n: v.numpy() for n, v in zip(rec.names, outs)}
        samples.append(({"input": x}, ref))
        gold.update({(s, n): store.Tensor(s, n, i, v) for i, (n, v) in enumerate(ref.items())})
        own = base.infer_own({"input": x}, ref)
        base_own.update({(s, n): store.Tensor(s, n, i, np.asarray(v)) for i, (n, v) in enumerate(own)})
    base.deactivate()
    return d, samples, gold, base_own


def _reduce(case, model_dir: Path, **kw):
    _, samples, gold, base_own = case
    return torch_reduce.reduce_against_torch(model_dir, samples, base_own, gold, K, SLACK,
                                             lambda: torch_reduce.noopt_runner(model_dir), **kw)


def _repro(cell: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "repro.py", *args], cwd=cell, capture_output=True, text=True)


def plain_only(src: Path, dst: Path, target: str, value: float) -> None:
    """A copy of model dir `src` whose model.onnx (weights in weights.plain.bin) has `target`'s weight
    x value while layers.onnx stays as exported."""
    import shutil

    from parity.pipeline.layer_export import prune_outputs
    from parity.core.io import atomic_path
    from parity.models import onnx_weights

    shutil.copytree(src, dst)
    faulty, _ = inject(onnx_weights.load_with_data(src / "layers.onnx"), "weight_scale", target, value=value)
    outs = [o.name for o in onnx_weights.load_graph(src / "model.onnx").graph.output]
    plain = prune_outputs(faulty, outs)
    with atomic_path(dst / "weights.plain.bin") as w:
        onnx_weights.pack(plain, src, w, location="weights.plain.bin")
    onnx_weights.write_checked(plain, dst / "model.onnx")


def test_the_exported_graphs_of_an_unfaulted_model_agree_with_torch(case):
    res = _reduce(case, case[0])
    assert res.status == "AGREES" and res.model is None, res.reason
    assert set(res.checked) == {"layers.onnx", "model.onnx"}
    assert res.checked["layers.onnx"] == res.checked["model.onnx"] > 0  # the plain graph's leaves found again


def test_a_weight_fault_in_both_graphs_reduces_to_its_node_with_torch_as_expectation(case, tmp_path):
    clean, samples, gold, _ = case
    inject_dir(clean, tmp_path / "faulty", "weight_scale", "fc1", value=1.2)
    res = _reduce(case, tmp_path / "faulty", prefer="fc1")
    assert res.status == "REDUCED" and res.graph == "layers.onnx", res.reason
    assert res.origin == "fc1" and res.failing == ["fc1"]
    assert 1 <= len(res.nodes) <= 3 and res.inputs == ["pre:fc1"] and res.outputs == ["fc1"], res
    # the expectation and the input are torch's recorded values (sample 0), not ORT's
    np.testing.assert_array_equal(res.expected["fc1"], gold[0, "fc1"].array)
    np.testing.assert_array_equal(res.feeds["pre:fc1"], gold[0, "pre:fc1"].array.astype(np.float32))
    assert 0.15 < res.rel_l2 < 0.25 and res.limit < 1e-4  # the weight x1.2
    bad = tmp_path / "bundle"
    torch_reduce.write_bundle(bad, "tiny-fp32-ort_cpu", res, K)
    first = {f.name: f.read_bytes() for f in bad.iterdir()}
    r = _repro(bad)
    assert r.returncode == 1 and "MISMATCH fc1" in r.stdout, r.stdout + r.stderr
    # the same node cut from the unfaulted graph (forced with `at`): not reproduced, its repro exits 0
    good_res = _reduce(case, clean, at="fc1")
    assert good_res.status == "NOT_REPRODUCED" and good_res.rel_l2 < good_res.limit, good_res.reason
    good = tmp_path / "good"
    torch_reduce.write_bundle(good, "tiny", good_res, K)
    assert _repro(good).returncode == 0
    r = _repro(bad, str(good / "reduced.onnx"))  # the faulty bundle's check on the unfaulted node
    assert r.returncode == 0 and "all 1 outputs match torch" in r.stdout, r.stdout + r.stderr
    # same reduction, same bytes
    torch_reduce.write_bundle(bad, "tiny-fp32-ort_cpu", _reduce(case, tmp_path / "faulty", prefer="fc1"), K)
    assert {f.name: f.read_bytes() for f in bad.iterdir()} == first


def test_a_fault_only_in_the_plain_graph_is_located_in_it(case, tmp_path):
    plain_only(case[0], tmp_path / "plain", "fc2", 1.05)
    res = _reduce(case, tmp_path / "plain")
    assert res.status == "REDUCED" and res.graph == "model.onnx", res.reason
    assert res.origin == "fc2" and res.checked["layers.onnx"] == res.checked["model.onnx"]
    assert len(res.nodes) <= 3 and res.inputs == ["pre:fc2"]
    assert res.outputs == ["output"]  # the last leaf's value is the graph's output tensor
    torch_reduce.write_bundle(tmp_path / "b", "tiny", res, K)
    assert _repro(tmp_path / "b").returncode == 1


def test_at_names_the_valid_values_when_it_is_not_one(case):
    with pytest.raises(ValueError, match="no own value of that name.*fc1"):
        _reduce(case, case[0], at="fc9")


def bare_venv(path: Path) -> str:
    """A venv holding only numpy and onnxruntime, copied from this interpreter's (no registry here)."""
    import shutil
    import sysconfig

    import numpy
    import onnxruntime

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    site = Path(subprocess.run([str(path / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    ours = Path(sysconfig.get_paths()["purelib"])
    for mod in (numpy, onnxruntime):
        src = Path(mod.__file__).parent
        shutil.copytree(src, site / src.name)
        for extra in ours.glob(f"{src.name}.libs"):
            shutil.copytree(extra, site / extra.name)
    return str(path / "bin/python")


@pytest.mark.slow
def test_resnet18_weight_fault_in_both_graphs_reduces_against_torch_in_the_pipeline(tmp_path):
    """The reduce stage on resnet18 fp32 ort_cpu with layer3.1.conv2's weight x1.2 in both exported
    graphs: <= 3 nodes, torch's values as the expectation; repro.py in a venv with only numpy and
    onnxruntime exits 1, and 0 on the same node cut from the unfaulted graph."""
    import json
    import shutil

    from tests.conftest import make_repo

    r = make_repo(tmp_path / "repo", models=("resnet18",), dtypes=("fp32",), providers=("ort_cpu",))
    r.exp_run("analysis.reduce=true")
    art = r.path / "artifacts"
    clean = tmp_path / "clean"
    shutil.copytree(art / "models/resnet18", clean)
    inject_dir(clean, art / "models/resnet18", "weight_scale", "layer3.1.conv2", value=1.2)
    cell = "resnet18-fp32-ort_cpu"
    r.run(["dvc", "repro", "-s", f"capture@{cell}", f"diff@{cell}", f"reduce@{cell}"])
    assert json.loads((art / f"diff/{cell}/metrics.json").read_text())["drift_origin"] == "layer3.1.conv2"
    red = json.loads((art / f"reduce/{cell}/reduce.json").read_text())
    assert red["status"] == "REDUCED" and red["against"] == "torch" and red["graph"] == "layers.onnx", red
    assert red["origin"] == "layer3.1.conv2" and red["op_types"] == ["Conv"] and len(red["nodes"]) <= 3
    bundle = tmp_path / "bundle"
    shutil.copytree(art / f"reduce/{cell}", bundle)
    py = bare_venv(tmp_path / "venv")
    bad = subprocess.run([py, "repro.py"], cwd=bundle, capture_output=True, text=True)
    assert bad.returncode == 1 and "MISMATCH layer3.1.conv2" in bad.stdout, bad.stdout + bad.stderr
    good = tmp_path / "good"
    subprocess.run([sys.executable, "-m", "parity.analysis.torch_reduce", "--model-dir", str(clean),
                    "--inputs", str(art / "inputs/resnet18.parquet"), "--reference", str(art / "reference/resnet18"),
                    "--baseline", str(art / "baseline/resnet18/fp32"), "--slack", "1e-6", "--at", "layer3.1.conv2",
                    "--out", str(good)], check=True, cwd=r.path)
    assert subprocess.run([py, "repro.py"], cwd=good, capture_output=True).returncode == 0
    ok = subprocess.run([py, "repro.py", str(good / "reduced.onnx")], cwd=bundle, capture_output=True, text=True)
    assert ok.returncode == 0 and "all 1 outputs match torch" in ok.stdout, ok.stdout + ok.stderr
