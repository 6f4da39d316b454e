"""Per-layer capture on resnet18: every leaf call is named, and BatchNorm outputs that an in-place
ReLU overwrites right after are captured as they were (torch and the exported ONNX graph agree)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from parity.models import build
from parity.models.layers import LayerRecorder

ARCH = {"source": "torchvision", "name": "resnet18", "kwargs": {}}


@pytest.fixture(scope="module")
def resnet18():
    return build(ARCH, 0)


@pytest.fixture(scope="module")
def x():
    return torch.from_numpy(np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32))


def test_resnet18_has_60_named_leaf_calls(resnet18, x):
    rec = LayerRecorder(resnet18)
    with torch.no_grad():
        outs = rec(x)
    names = rec.names
    assert names[0] == "output" and len(names) == len(outs) == 61
    # a BasicBlock's ReLU module is called twice: the second call is named relu#1
    assert "layer1.0.relu" in names and "layer1.0.relu#1" in names
    assert len(set(names)) == len(names)


def test_inplace_relu_does_not_corrupt_captured_batchnorm_outputs(resnet18, x):
    rec = LayerRecorder(resnet18)
    with torch.no_grad():
        outs = rec(x)
        got = dict(zip(rec.names, outs))
        m = resnet18
        bn1 = m.bn1(m.conv1(x))
        block_bn1 = m.layer1[0].bn1(m.layer1[0].conv1(m.maxpool(torch.relu(bn1))))
    for name, expected in (("bn1", bn1), ("layer1.0.bn1", block_bn1)):
        assert (got[name] < 0).any(), f"{name} lost its negative values: captured after the in-place ReLU"
        torch.testing.assert_close(got[name], expected)

    # Without the clone in the hook, the in-place ReLU overwrites what was captured:
    seen = {}
    h = m.bn1.register_forward_hook(lambda mod, a, out: seen.setdefault("bn1", out))
    try:
        with torch.no_grad():
            m(x)
    finally:
        h.remove()
    assert not (seen["bn1"] < 0).any()


def test_exported_graph_exposes_the_same_pre_relu_values(resnet18, x, tmp_path):
    import onnxruntime as ort

    from parity.pipeline.layer_export import export_layers

    names = export_layers(resnet18, (x,), ["input"], tmp_path / "layers.onnx", "dynamo", 18)
    sess = ort.InferenceSession(str(tmp_path / "layers.onnx"), providers=["CPUExecutionProvider"])
    assert [o.name for o in sess.get_outputs()] == names
    got = dict(zip(names, sess.run(None, {"input": x.numpy()})))
    rec = LayerRecorder(resnet18)
    with torch.no_grad():
        outs = rec(x)
        ref = dict(zip(rec.names, outs))
    for name in ("bn1", "layer1.0.bn1", "layer2.1.bn2"):
        assert (got[name] < 0).any()
        np.testing.assert_allclose(got[name], ref[name].numpy(), rtol=1e-4, atol=1e-4)


class _Attn(torch.nn.Module):
    """nn.MultiheadAttention reads its child out_proj's weight without calling out_proj."""

    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(32)
        self.mha = torch.nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x):
        y = self.ln(x)
        return self.mha(y, y, y, need_weights=False)[0]


@pytest.mark.parametrize("arch", [
    {"source": "parity", "name": "transformer_block", "kwargs": {}},
    {"source": "hf", "name": "gpt2", "kwargs": {"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 100, "n_positions": 64}},
    "mha",
])
def test_the_fp64_reference_run_leaf_by_leaf_gives_the_whole_model_double_values(arch, tmp_path):
    """The fp64 golden run converts one leaf at a time (a 1.1B model has no room for an fp64 copy):
    its values, leaf outputs and recorded inputs, are the bytes a whole-model .double() gives, and the
    model is float32 again afterwards."""
    from parity.core import store
    from parity.pipeline import reference

    tokens = arch != "mha" and arch["source"] == "hf"
    x = (np.arange(12, dtype=np.int64).reshape(1, 12) if tokens
         else np.random.default_rng(0).standard_normal((2, 8, 256 if arch != "mha" else 32)).astype(np.float32))
    p = {"seed": 0, "models": {"m": {"arch": arch, "input": [{"name": "x"}]}}}

    def make():
        torch.manual_seed(0)
        return _Attn().eval() if arch == "mha" else build(arch, 0)

    net = make()
    with store.writer(tmp_path / "leaf.parquet") as w:
        reference.stream(p, "m", net, [{"x": x}], "float64", w, inputs=True)
    assert all(t.dtype == torch.float32 for t in net.parameters())
    with store.writer(tmp_path / "whole.parquet") as w:
        reference.stream(p, "m", make().double(), [{"x": x}], "float64", w, inputs=True)
    assert (tmp_path / "leaf.parquet").read_bytes() == (tmp_path / "whole.parquet").read_bytes()
