"""The KV cache as layers in generation's origin search (issue 35, item 1): one layer's `present` value
rounded to fp16 on its way out of the provider's decoder graphs (the step's own attention reads the
unrounded value; the next step reads the rounded cache) fails from step 1, and the origin search, which
finds nothing on the prefix re-run without the cache, finds it with the cache: that layer's cache, with
a cause that says "cache". A key cache rounded the same way moves the logits less than the limit; the
cache test at step 1 (steps 0 and 1 with the cache, every value judged) fails it there. Real export (tiny_llama's decoder graphs), real onnxruntime, no DVC."""

from __future__ import annotations

import shutil

import onnx
import pytest

from conftest import composed

STEPS = 4


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from parity.pipeline.generate import export_model

    p = composed("models=[tiny_llama]", "generate.models=[tiny_llama]", f"generate.steps={STEPS}",
                 "generate.providers=[ort_cpu]")
    out = tmp_path_factory.mktemp("decoder")
    info = export_model(p, "tiny_llama", out)
    return p, out, info


def _faulty(exported, tmp_path, name: str):
    from parity.pipeline import decoder

    _, src, _ = exported
    d = tmp_path / "export"
    shutil.copytree(src, d)
    for g in ("decoder.onnx", "decoder_layers.onnx"):
        m = onnx.load(str(d / g), load_external_data=False)
        onnx.save(decoder.cache_fault(m, name), str(d / g))
    return d


@pytest.mark.parametrize("name, module", [("present.1.value", "model.layers.1"), ("present.0.value", "model.layers.0")])
def test_a_cache_rounded_to_fp16_fails_from_step_1_at_that_layers_cache(exported, tmp_path, name, module):
    from parity.analysis import generate_report
    from parity.pipeline.generate import run_cell
    from stages.generate import summary

    p, _, info = exported
    res = run_cell(p, "tiny_llama", "fp32", "ort_cpu", _faulty(exported, tmp_path, name))
    rows = res["steps_detail"]
    assert res["verdict"] == "FAIL" and res["first_fail"] == 1, res["verdict"]
    assert rows[0]["passed"] and rows[0]["excess"] <= rows[0]["limit"]  # the step that writes it reads it unrounded
    assert all(not r["passed"] for r in rows[1:])  # every step that reads the cache
    o = res["origin"]
    assert o["step"] == 1 and o["kind"] == "cache" and o["origin"] == f"{module} cache ({name})", o["origin"]
    assert o["cause"].startswith("cache: ") and name in o["cause"] and "without the cache passes" in o["cause"]
    # found where the prefix re-run without the cache found nothing: at step 0, only that value fails
    assert o["cache_step"] == 0 and o["cache_steps"][0]["failed"] == [name] and o["cache_steps"][0]["past_len"] == 0
    assert o["prefix_worst_excess"] <= rows[0]["limit"]
    by = {r["name"]: r for r in o["layers"]}
    assert set(info["layers"]) <= set(by) and {f"present.{i}.{kv}" for i in (0, 1) for kv in ("key", "value")} <= set(by)
    assert by[name]["excess"] > 10 * rows[0]["limit"] and 1e-5 < by[name]["rel_l2"] < 1e-3  # fp16's rounding
    s = summary(res)
    assert s["drift_origin"] == o["origin"] and s["origin_step"] == 1 and s["drift_cause"] == o["cause"]
    line = generate_report.line("k", res)
    assert f"drift origin {module} cache ({name}) at step 1 (cache: " in line, line
    assert "with the KV cache at step 0 (0 cached tokens" in generate_report.html_sections({"k": res})


def test_a_key_cache_the_logits_hide_fails_step_1_through_the_cache_test(exported, tmp_path):
    from parity.pipeline.generate import run_cell

    p, _, _ = exported
    res = run_cell(p, "tiny_llama", "fp32", "ort_cpu", _faulty(exported, tmp_path, "present.0.key"))
    rows = res["steps_detail"]
    assert all(r["excess"] <= r["limit"] for r in rows), [r["excess"] for r in rows]  # the logits pass every step
    assert res["verdict"] == "FAIL" and res["first_fail"] == 1 and not rows[1]["passed"]
    assert rows[1]["cache_failed"][0] == "present.0.key" and rows[1]["cache_worst_excess"] > 10 * rows[1]["limit"]
    o = res["origin"]
    assert o["kind"] == "cache" and o["origin"] == "model.layers.0 cache (present.0.key)" and o["cache_step"] == 0
    assert o["cause"].startswith("cache: the key cache model.layers.0 writes (present.0.key)"), o["cause"]


def test_the_cache_test_passes_an_unfaulted_decoder(exported):
    from parity.pipeline.generate import run_cell

    p, d, _ = exported
    res = run_cell(p, "tiny_llama", "fp32", "ort_cpu", d)
    one = res["steps_detail"][1]
    assert res["verdict"] == "PASS" and one["cache_failed"] == [] and 0 < one["cache_worst_excess"] <= one["limit"]


def test_present_values_sit_after_their_layers_leaves():
    from parity.pipeline import decoder
    from parity.pipeline.generate import build_lm

    p = composed("models=[tiny_llama]")
    blocks = decoder.block_names(build_lm(p["models"]["tiny_llama"], 0))
    assert blocks == ["model.layers.0", "model.layers.1"]
    leaves = ["model.embed_tokens", "model.layers.0.mlp", "model.layers.1.self_attn", "model.layers.1.mlp", "lm_head"]
    assert decoder.cache_order(leaves, blocks) == [
        "model.embed_tokens", "model.layers.0.mlp", "present.0.key", "present.0.value",
        "model.layers.1.self_attn", "model.layers.1.mlp", "present.1.key", "present.1.value", "lm_head"]


def test_cache_fault_names_the_outputs_it_takes(exported):
    from parity.pipeline import decoder

    _, d, _ = exported
    m = onnx.load(str(d / "decoder.onnx"), load_external_data=False)
    with pytest.raises(ValueError) as e:
        decoder.cache_fault(m, "present.7.value")
    assert str(e.value) == ("cache_fault: 'present.7.value' is not an output of the graph (outputs: present.0.key, "
                            "present.0.value, present.1.key, present.1.value)"), str(e.value)
