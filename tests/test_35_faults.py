"""Issue 35's faults injected into a real exported decoder graph (the project's dynamo export of a tiny
Llama-shaped block: RMSNorm written out as the exporter decomposes it, attention with a constant causal
mask added before its Softmax, a SiLU MLP), run on onnxruntime, and labelled by causes.classify as the
diff labels its drift origin: an RMSNorm epsilon is `row_scale` (with the epsilon change), weights stored
in fp16 are `narrow_weights`, a causal-mask leak at token 10 is `mask_leak` at "token 10" (not a channel),
SiLU -> Sigmoid is `op_substitution`; a fault in model.onnx only leaves layers.onnx as exported and
parity.analysis.plaindiff names its node and module. The whole pipeline on tiny_llama: test_35_faults_slow."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

ort = pytest.importorskip("onnxruntime")

from parity.analysis import plaindiff  # noqa: E402
from parity.analysis.causes import classify  # noqa: E402
from parity.analysis.faults import FaultError, inject_dir  # noqa: E402

T, H = 16, 32


def tiny_decoder():
    import torch
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self, eps=1e-5):
            super().__init__()
            self.weight, self.eps = nn.Parameter(torch.ones(H)), eps

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(H, H, bias=False) for _ in range(4))
            mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)
            self.register_buffer("mask", mask[None, None], persistent=False)

        def forward(self, x):
            q, k, v = (p(x).view(1, T, 2, H // 2).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
            s = q @ k.transpose(-1, -2) / (H // 2) ** 0.5 + self.mask
            return self.o_proj((s.softmax(-1) @ v).transpose(1, 2).reshape(1, T, H))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj = nn.Linear(H, 48, bias=False), nn.Linear(H, 48, bias=False)
            self.down_proj, self.act_fn = nn.Linear(48, H, bias=False), nn.SiLU()

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.post_attention_layernorm = RMSNorm(), RMSNorm()
            self.self_attn, self.mlp = Attention(), MLP()

        def forward(self, x):
            x = x + self.self_attn(self.input_layernorm(x))
            return x + self.mlp(self.post_attention_layernorm(x))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Block()])
            self.lm_head = nn.Linear(H, 8, bias=False)

        def forward(self, x):
            return self.lm_head(self.layers[0](x))

    torch.manual_seed(0)
    return Decoder().eval()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """An export directory as the export stage writes it (layers.onnx, model.onnx, layers.json)."""
    import torch

    from parity.core.store import is_output
    from parity.pipeline.layer_export import export_layers, prune_outputs, strip_paths

    d = tmp_path_factory.mktemp("decoder")
    names = export_layers(tiny_decoder(), (torch.zeros(1, T, H),), ["input"], d / "layers.onnx", "dynamo", 18)
    full = strip_paths(onnx.load(str(d / "layers.onnx")))
    onnx.save(full, str(d / "layers.onnx"))
    outputs = [n for n in names if is_output(n)]
    onnx.save(prune_outputs(full, outputs), str(d / "model.onnx"))
    (d / "layers.json").write_text(json.dumps(
        {"outputs": outputs, "layers": [{"name": n} for n in names if n not in outputs]}))
    return d


# activations of a decoder's size: rows of different sizes, small enough that an epsilon matters
X = (np.random.default_rng(0).normal(size=(1, T, H)) * np.random.default_rng(1).uniform(0.02, 0.2, (1, T, 1))
     ).astype(np.float32)


def run(path) -> dict:
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, {"input": X})))


def faulty(model_dir, tmp_path, fault, target, **options):
    change = inject_dir(model_dir, tmp_path / fault, fault, target, **options)
    return change, run(model_dir / "layers.onnx"), run(tmp_path / fault / "layers.onnx")


def test_rmsnorm_epsilon_is_row_scale_with_its_change(model_dir, tmp_path):
    leaf = "layers.0.post_attention_layernorm"
    change, clean, bad = faulty(model_dir, tmp_path, "norm_epsilon", leaf, value=1e-3)
    assert "epsilon 1e-05 -> 0.001" in change["change"] and change["op"] == "Add"
    assert np.array_equal(clean["layers.0.input_layernorm"], bad["layers.0.input_layernorm"])  # shared eps copied
    c = classify(bad[leaf], clean[leaf], "fp32", name=leaf, failed=True)
    assert c.label == "row_scale" and "token" in c.summary, c.summary
    assert c.evidence["scale_max"] < 1.0


def test_weights_stored_in_fp16_are_narrow_weights(model_dir, tmp_path):
    leaf = "layers.0.mlp.down_proj"
    change, clean, bad = faulty(model_dir, tmp_path, "fp16_weights", leaf)
    assert "rounded to fp16" in change["change"]
    assert not np.array_equal(clean[leaf], bad[leaf])
    c = classify(bad[leaf], clean[leaf], "fp32", name=leaf, failed=True)
    assert c.label == "narrow_weights" and c.evidence["format"] == "fp16", c.summary
    # at fp16 a weight rounded to fp16 is what the format does: no fault to name
    assert classify(bad[leaf], clean[leaf], "fp16", name=leaf).label == "precision"


def test_mask_leak_at_token_10_is_a_token_not_a_channel(model_dir, tmp_path):
    leaf = "layers.0.self_attn.o_proj"
    change, clean, bad = faulty(model_dir, tmp_path, "mask_leak", "Softmax", token=10)
    assert change["token"] == 10 and change["unmasked"] == T - 11
    d = np.abs(bad[leaf] - clean[leaf]).max(axis=-1)[0]
    assert not d[:10].any() and d[10] > 0 and not d[11:].any()  # only token 10 sees the future
    c = classify(bad[leaf], clean[leaf], "fp32", name=leaf, failed=True)
    assert c.label == "mask_leak" and "token 10" in c.summary and "channel" not in c.summary, c.summary
    assert c.evidence["first"] == 10 and c.evidence["axis_name"] == "token"


def test_silu_to_sigmoid_is_an_op_substitution(model_dir, tmp_path):
    leaf = "layers.0.mlp.act_fn"
    _, clean, bad = faulty(model_dir, tmp_path, "silu_sigmoid", leaf)
    gate = clean["layers.0.mlp.gate_proj"]
    np.testing.assert_allclose(bad[leaf], 1 / (1 + np.exp(-gate)), rtol=1e-6)
    c = classify(bad[leaf], clean[leaf], "fp32", inputs=gate, name=leaf, failed=True)
    assert c.label == "op_substitution" and "Sigmoid" in c.summary, c.summary


def test_a_fault_in_model_onnx_only_is_named_by_node_and_module(model_dir, tmp_path):
    leaf = "layers.0.mlp.down_proj"
    change = inject_dir(model_dir, tmp_path / "p", "weight_scale", leaf, plain_only=True, value=1.05)
    assert change["plain_only"] and change["change"].endswith("(model.onnx only)")
    clean, layers, plain = run(model_dir / "layers.onnx"), run(tmp_path / "p/layers.onnx"), run(tmp_path / "p/model.onnx")
    assert all(np.array_equal(clean[k], layers[k]) for k in clean)  # layers.onnx computes as exported
    assert not np.allclose(plain["output"], clean["output"], rtol=1e-4, atol=0)
    assert [f.name for f in (tmp_path / "p").iterdir() if f.suffix == ".bin"] == ["weights.bin"]  # one shared file
    changes = plaindiff.graph_changes(tmp_path / "p")
    assert [(c["op_type"], c["module"]) for c in changes] == [("MatMul", leaf)]
    assert change["node"] == changes[0]["node"] and "x1.05" in changes[0]["changes"][0]
    assert plaindiff.graph_changes(model_dir) == []  # the export's own pair: nothing differs


def test_bad_targets_name_what_is_there(model_dir, tmp_path):
    with pytest.raises(FaultError, match="no normalisation epsilon"):
        inject_dir(model_dir, tmp_path / "a", "norm_epsilon", "layers.0.mlp.down_proj")
    with pytest.raises(FaultError, match="not a SiLU"):
        inject_dir(model_dir, tmp_path / "b", "silu_sigmoid", "layers.0.input_layernorm")
    with pytest.raises(FaultError, match="rows"):
        inject_dir(model_dir, tmp_path / "c", "mask_leak", "Softmax", token=T)
    assert not any(p.exists() for p in (tmp_path / "a", tmp_path / "b", tmp_path / "c"))
