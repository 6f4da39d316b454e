"""Issue 23 item 1: decoders in the zoo. Llama- and Qwen2-shaped causal LMs from transformers configs
(`arch.source: hf`, `arch.head: causal_lm`), random-initialised, nothing downloaded: layers named as
users know them (`model.layers.1.mlp.down_proj`, `lm_head`), the logits as the model output, run
through the real pipeline (real DVC in a temp git repo, real onnxruntime, real Parquet)."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from conftest import ROOT, composed, config_error, make_repo, run
from parity.config import params as config
from parity.core import store

# one decoder layer's leaf modules, in call order (layers.json and the captured Parquet)
DECODER_LAYER = ["input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                 "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj", "mlp.act_fn",
                 "mlp.up_proj", "mlp.down_proj"]


def _json(repo, rel):
    return json.loads((repo.path / rel).read_text())


def _layers(n_layers: int) -> list[str]:
    """Every captured name of a 2-output-rotary decoder: embedding, RoPE's cos and sin, each layer's
    leaves, the final norm, lm_head."""
    return (["model.embed_tokens", "model.rotary_emb", "model.rotary_emb:1"]
            + [f"model.layers.{i}.{leaf}" for i in range(n_layers) for leaf in DECODER_LAYER]
            + ["model.norm", "lm_head"])


def _check_cells(r, model: str, dtypes, providers=("torch_cpu", "ort_cpu")) -> None:
    lj = _json(r, f"artifacts/models/{model}/layers.json")
    assert lj["exporter"] == "dynamo" and lj["opset"] == 18
    assert lj["outputs"] == ["output"]  # the logits, the only tensor of CausalLMOutputWithPast (no cache)
    assert lj["uncalled"] == []  # every leaf module is called, so captured: nothing silently left out
    assert [d["name"] for d in lj["layers"]] == _layers(2)
    for dtype in dtypes:
        for prov in providers:
            cell = f"{model}-{dtype}-{prov}"
            met = _json(r, f"artifacts/diff/{cell}/metrics.json")
            # torch_cpu is the oracle's own baseline backend: BASELINE, not a PASS that cannot fail
            want = "BASELINE" if prov == "torch_cpu" else "PASS"
            assert met["status"] == "OK" and met["verdict"] == want, (cell, met)
            assert met["layers"] == len(_layers(2)) and met["layers_failed"] == 0, (cell, met)
            names = {t.name for t in store.read(r.path / f"artifacts/capture/{cell}/layers.parquet")}
            assert {"model.layers.1.mlp.down_proj", "model.layers.0.self_attn.o_proj", "lm_head",
                    "output"} <= names, (cell, sorted(names))


def test_tiny_llama_fp32_on_torch_and_ort_passes_with_layers_named_as_users_know_them(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # built from the config alone: no hub
    r = make_repo(tmp_path / "repo", models=("tiny_llama",), dtypes=("fp32",))
    r.exp_run()
    _check_cells(r, "tiny_llama", ("fp32",))
    logits = [t.array for t in store.read(r.path / "artifacts/reference/tiny_llama/fp32.parquet") if t.name == "output"]
    assert logits and all(a.shape == (1, 32, 1000) for a in logits)  # the reference's output: the logits


@pytest.mark.slow
def test_tiny_decoders_fp32_and_fp16_on_torch_and_ort_pass(tmp_path, monkeypatch):
    """Both tiny decoders at fp32 and fp16: the oracle passes every cell of an unfaulted model (at
    fp16 too: RMSNorm, RoPE and the attention between the captured projections stay within it)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = make_repo(tmp_path / "repo", models=("tiny_llama", "tiny_qwen2"), dtypes=("fp32", "fp16"))
    r.exp_run()
    for model in ("tiny_llama", "tiny_qwen2"):
        _check_cells(r, model, ("fp32", "fp16"))


def test_head_is_validated_at_compose():
    p = composed("models=[tiny_llama]")
    assert p["models"]["tiny_llama"]["arch"]["head"] == "causal_lm"

    def bad_head(q):
        q["models"]["tiny_llama"]["arch"]["head"] = "seq2seq"

    msg = config_error(p, bad_head)
    assert msg == "models.tiny_llama.arch.head: unknown head 'seq2seq'. Valid: base, causal_lm"

    def head_on_parity_model(q):
        q["models"]["tiny_llama"]["arch"] = {"source": "parity", "name": "mlp", "head": "causal_lm"}

    assert "models.tiny_llama.arch.head: only an hf model has a head" in config_error(p, head_on_parity_model)


def test_compose_refuses_an_unknown_head_in_one_line(tmp_path):
    import shutil

    for name in ("conf", "hydra_plugins"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    p = run(["parity", "compose", "-S", "models=[tiny_qwen2]", "-S", "models.tiny_qwen2.arch.head=lm"],
            tmp_path, check=False)
    assert p.returncode != 0 and p.stderr.strip().splitlines() == [
        "parity: config error: models.tiny_qwen2.arch.head: unknown head 'lm'. Valid: base, causal_lm"], p.stderr
    assert not (tmp_path / "params.yaml").exists()


def test_config_heads_are_the_builders_heads():
    from parity.models import hf

    assert set(config.HF_HEADS) == set(hf.HEADS)


def _conf_params(model: str) -> int:
    """The parameter count a model's conf file states in its comment (`1,100,048,384 parameters`)."""
    text = (ROOT / f"conf/models/{model}.yaml").read_text()
    return int(re.search(r"([\d,]+)\s+parameters", text).group(1).replace(",", ""))


@pytest.mark.parametrize("model, cls", [("llama_1b", "LlamaForCausalLM"), ("qwen2_0_5b", "Qwen2ForCausalLM"),
                                        ("tiny_llama", "LlamaForCausalLM"), ("tiny_qwen2", "Qwen2ForCausalLM")])
def test_parameter_counts_on_the_meta_device_match_the_conf_comments(model, cls):
    """Counted without materialising a weight (the 1.1B model would take 4.4 GB): tied weights once."""
    import torch

    from parity.models import hf

    arch = yaml.safe_load((ROOT / f"conf/models/{model}.yaml").read_text())[model]["arch"]
    with torch.device("meta"):
        m = hf.build(arch["name"], arch["kwargs"], arch["head"])
    assert type(m).__name__ == cls
    assert sum(p.numel() for p in m.parameters()) == _conf_params(model)  # parameters() dedups tied ones
    names = {n for n, _ in m.named_modules()}
    assert {"model.layers.1.mlp.down_proj", "model.layers.1.self_attn.o_proj", "lm_head"} <= names
