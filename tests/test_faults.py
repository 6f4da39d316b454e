"""Fault injection into an exported model: each fault changes its target's output and nothing upstream,
on onnxruntime, in both layers.onnx and model.onnx. The model is a tiny net holding every op the
faults act on, exported with the project's own dynamo export path (parity.pipeline.layer_export)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest

ort = pytest.importorskip("onnxruntime")

from parity.analysis.faults import FaultError, inject, inject_dir  # noqa: E402
from tests.conftest import ROOT  # noqa: E402


def tiny_net():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Tiny(nn.Module):
        """conv (no bias) -> BN -> Hardswish -> conv (bias) -> ReLU -> attention (SDPA) -> GELU -> fc -> x a
        HardSigmoid gate."""

        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(8)
            self.act1 = nn.Hardswish()
            self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
            self.relu = nn.ReLU()
            self.gate = nn.Hardsigmoid()
            self.qkv = nn.Linear(8, 24)
            self.out = nn.Linear(8, 8)
            self.gelu = nn.GELU()
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            y = self.relu(self.conv2(self.act1(self.bn1(self.conv1(x)))))
            t = y.flatten(2).transpose(1, 2)                              # (1, 36, 8)
            q, k, v = (z.reshape(1, 36, 2, 4).transpose(1, 2) for z in self.qkv(t).split(8, dim=-1))
            a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(1, 36, 8)
            z = self.fc(self.gelu(self.out(a)).mean(1))
            return z * self.gate(z)

    torch.manual_seed(0)
    net = Tiny().eval()
    with torch.no_grad():  # non-trivial BN statistics, so an epsilon change is not a plain scale
        net.bn1.running_mean.normal_(0, 0.5)
        net.bn1.running_var.uniform_(0.01, 2.0)
    return net


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """An export directory as the export stage writes it (layers.onnx, model.onnx, layers.json)."""
    import torch

    from parity.pipeline.layer_export import export_layers, prune_outputs, strip_paths
    from parity.core.store import is_output

    d = tmp_path_factory.mktemp("tiny")
    names = export_layers(tiny_net(), (torch.randn(1, 3, 6, 6),), ["input"], d / "layers.onnx", "dynamo", 18)
    full = strip_paths(onnx.load(str(d / "layers.onnx")))
    onnx.save(full, str(d / "layers.onnx"))
    outputs = [n for n in names if is_output(n)]
    onnx.save(prune_outputs(full, outputs), str(d / "model.onnx"))
    (d / "layers.json").write_text(json.dumps(
        {"outputs": outputs, "layers": [{"name": n} for n in names if n not in outputs]}))
    return d


def run(path, x) -> dict:
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, {"input": x})))


X = np.random.default_rng(0).normal(size=(1, 3, 6, 6)).astype(np.float32)

CASES = [  # fault, target, options, the first leaf whose output changes
    ("weight_scale", "conv2", {}, "conv2"),
    ("weight_scale", "qkv", {}, "qkv"),
    ("bn_epsilon", "bn1", {"value": 1e-2}, "bn1"),
    ("channel_scale", "conv2", {"channel": 3}, "conv2"),
    ("gelu_tanh", "gelu", {}, "gelu"),
    ("bias_shift", "conv1", {}, "conv1"),         # Conv without bias: gets one
    ("bias_shift", "out", {}, "out"),             # Linear as MatMul + Add
    ("bias_shift", "fc", {}, "fc"),               # Gemm, the model output
    ("hardswish_relu", "act1", {}, "act1"),
    ("softmax_axis", "Softmax", {}, "out"),       # between leaves: qkv is upstream, out the first changed
    ("transpose", "conv2", {}, "conv2"),
    ("output_offset", "relu", {"value": 5e-5}, "relu"),
    ("fp16_round", "conv2", {}, "conv2"),
    ("channel_swap", "conv2", {"channels": [3, 7]}, "conv2"),
    ("hardsigmoid_sigmoid", "gate", {}, "gate"),
    ("relu_leaky", "relu", {}, "relu"),
]


@pytest.mark.parametrize("fault,target,options,first", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_fault_changes_its_target_and_nothing_upstream(model_dir, tmp_path, fault, target, options, first):
    change = inject_dir(model_dir, tmp_path, fault, target, **options)
    assert change["fault"] == fault and change["change"]
    assert json.loads((tmp_path / "fault.json").read_text())["fault"] == fault
    order = [entry["name"] for entry in json.loads((model_dir / "layers.json").read_text())["layers"]]
    clean, faulty = run(model_dir / "layers.onnx", X), run(tmp_path / "layers.onnx", X)
    k = order.index(first)
    for name in order[:k]:
        assert np.array_equal(clean[name], faulty[name]), f"{name} is upstream of {first} and changed"
    assert not np.array_equal(clean[first], faulty[first])
    assert not np.array_equal(clean["output"], faulty["output"])
    # model.onnx carries the same fault (only fusions may differ in the last bits)
    plain = run(tmp_path / "model.onnx", X)
    np.testing.assert_allclose(plain["output"], faulty["output"], rtol=1e-5, atol=1e-6)
    assert [o.name for o in onnx.load(str(tmp_path / "model.onnx")).graph.output] == ["output"]


def test_fault_values_are_what_was_asked(model_dir):
    layers = onnx.load(str(model_dir / "layers.onnx"))
    clean = run(model_dir / "layers.onnx", X)

    def faulty(fault, target, **options):
        m, _ = inject(layers, fault, target, **options)
        s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return dict(zip([o.name for o in s.get_outputs()], s.run(None, {"input": X})))

    a, b = faulty("channel_scale", "conv2", value=1.1, channel=3)["conv2"], clean["conv2"]
    np.testing.assert_allclose(a[:, 3], b[:, 3] * 1.1, rtol=1e-4, atol=1e-6)  # ORT may fold the Mul into the conv
    np.testing.assert_array_equal(np.delete(a, 3, axis=1), np.delete(b, 3, axis=1))
    np.testing.assert_array_equal(faulty("transpose", "conv2")["conv2"], b.transpose(0, 1, 3, 2))
    np.testing.assert_allclose(faulty("output_offset", "conv2", value=5e-5)["conv2"] - b, 5e-5, atol=1e-6)
    np.testing.assert_allclose(faulty("weight_scale", "conv1", value=1.05)["conv1"], clean["conv1"] * 1.05,
                               rtol=1e-5, atol=1e-6)  # weights rounded to fp32 after scaling
    relu = faulty("hardswish_relu", "act1")["act1"]
    np.testing.assert_array_equal(relu, np.maximum(clean["bn1"], 0))
    np.testing.assert_array_equal(faulty("fp16_round", "conv2")["conv2"], b.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(faulty("channel_swap", "conv2", channels=[3, 7])["conv2"],
                                  b[:, [0, 1, 2, 7, 4, 5, 6, 3]])
    np.testing.assert_allclose(faulty("hardsigmoid_sigmoid", "gate")["gate"], 1 / (1 + np.exp(-clean["fc"])),
                               rtol=1e-6)
    leaky = faulty("relu_leaky", "relu", value=0.01)["relu"]
    np.testing.assert_allclose(leaky, np.where(clean["conv2"] < 0, np.float32(0.01) * clean["conv2"], clean["conv2"]),
                               rtol=1e-6)


def test_shared_initializers_are_copied_not_edited(model_dir):
    """The exporter shares equal initializers between nodes: a fault on one leaf leaves the others."""
    layers = onnx.load(str(model_dir / "layers.onnx"))
    before = {t.name: onnx.numpy_helper.to_array(t) for t in layers.graph.initializer}
    m, change = inject(layers, "weight_scale", "conv2")
    after = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    assert change["new_initializer"] in after and change["initializer"] not in after  # replaced, unused
    assert all(np.array_equal(after[k], v) for k, v in before.items() if k in after)


def test_bad_target_names_the_choices(model_dir, tmp_path):
    with pytest.raises(FaultError, match="conv2"):
        inject_dir(model_dir, tmp_path, "weight_scale", "nope")
    with pytest.raises(FaultError, match="no HardSwish"):
        inject_dir(model_dir, tmp_path, "hardswish_relu", "conv2")
    assert not (tmp_path / "layers.onnx").exists()  # nothing written


def test_cli_writes_a_model_dir(model_dir, tmp_path):
    out = tmp_path / "faulty"
    r = subprocess.run([sys.executable, "-m", "parity.analysis.faults", "--model-dir", str(model_dir),
                        "--fault", "transpose", "--target", "conv2", "--perm", "0,1,3,2", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["perm"] == [0, 1, 3, 2]
    assert {p.name for p in out.iterdir()} >= {"layers.onnx", "model.onnx", "layers.json", "ops.json", "fault.json"}
    r = subprocess.run([sys.executable, "-m", "parity.analysis.faults", "--model-dir", str(model_dir),
                        "--fault", "weight_scale", "--target", "nope", "--out", str(tmp_path / "x")],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "nope" in r.stderr and "conv1" in r.stderr
    assert not (tmp_path / "x").exists()
