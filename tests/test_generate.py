"""Generation drift (generate@model-dtype-provider, parity/pipeline/generate.py) through real DVC:
greedy decoding with a KV cache on ort_cpu (a decoder graph with past/present key-values) and torch_cpu
(the model's cache) against torch fp64, teacher-forced; a fault in one decoder layer of the provider's
graph is reported at the step where it shows, with that layer as the drift origin."""

from __future__ import annotations

import json

import pytest

from conftest import BIN, composed, config_error, make_repo

# tiny Hugging Face decoders (random init from the config, nothing downloaded); own names, so this
# test does not depend on which zoo conf files exist
GEN_LLAMA = """\
gen_llama:
  arch:
    source: hf
    name: llama
    kwargs: {hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4,
             num_key_value_heads: 2, vocab_size: 1000}
  input:
    - {name: input_ids, shape: [1, 8], dtype: int64, init: tokens}
  tolerances: []
"""
GEN_GPT2 = """\
gen_gpt2:
  arch:
    source: hf
    name: gpt2
    kwargs: {n_layer: 2, n_embd: 64, n_head: 4, vocab_size: 1000, n_positions: 256}
  input:
    - {name: input_ids, shape: [1, 8], dtype: int64, init: tokens}
  tolerances: []
"""
FAULT = "+providers.ort_cpu.options.fault={node: model.layers.1.mlp.down_proj, scale: 1.01}"


@pytest.fixture(scope="module")
def gen_repo(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("gen") / "repo", models=("gen_llama", "gen_gpt2"), dtypes=("fp32",),
                     compose=False)
    (repo.path / "conf/models/gen_llama.yaml").write_text(GEN_LLAMA)
    (repo.path / "conf/models/gen_gpt2.yaml").write_text(GEN_GPT2)
    repo.edit("conf/config.yaml", "  models: []               # dvc exp run -S 'generate.models=[gpt2_small]'",
              "  models: [gen_llama, gen_gpt2]")
    repo.run([f"{BIN}/parity", "compose"])
    repo.commit("generate")
    return repo


def _cell(repo, key: str) -> tuple[dict, dict]:
    d = repo.path / "artifacts/generate" / key
    return json.loads((d / "steps.json").read_text()), json.loads((d / "metrics.json").read_text())


# each ~50 s alone (a dynamo export of the decoder, two cells); the GPT-2 one runs with the slow tests
@pytest.mark.parametrize("model", ["gen_llama", pytest.param("gen_gpt2", marks=pytest.mark.slow)])
def test_ort_cpu_and_torch_cpu_agree_on_every_token(gen_repo, model):
    cells = [f"generate@{model}-fp32-{p}" for p in ("torch_cpu", "ort_cpu")]
    ran = gen_repo.repro(*cells)
    assert f"generate_export@{model}" in ran and set(cells) <= set(ran), ran
    ort, ort_m = _cell(gen_repo, f"{model}-fp32-ort_cpu")
    torch_, _ = _cell(gen_repo, f"{model}-fp32-torch_cpu")
    assert ort_m["verdict"] == "PASS" and ort_m["agreement"] == 32 == ort["steps"], ort_m
    assert ort_m["first_divergence"] is None and ort_m["first_fail"] is None and ort_m["drift_origin"] is None
    assert [r["token"] for r in ort["steps_detail"]] == [r["token"] for r in torch_["steps_detail"]] \
        == ort["tokens_ref"] == torch_["tokens_ref"]
    assert len(ort["steps_detail"]) == 32 and all(r["passed"] for r in ort["steps_detail"])
    assert 0 < max(r["rel_l2"] for r in ort["steps_detail"]) < 1e-5  # fp32 rounding, and not a copy of torch
    export = json.loads((gen_repo.path / f"artifacts/generate_export/{model}/decoder.json").read_text())
    assert export["inputs"][:3] == ["input_ids", "attention_mask", "position_ids"] and export["n_layers"] == 2
    import onnx

    ed = gen_repo.path / f"artifacts/generate_export/{model}"  # the weights once, beside both graphs
    for g in ("decoder.onnx", "decoder_layers.onnx"):
        m = onnx.load(str(ed / g), load_external_data=False)
        ext = {e.value for t in m.graph.initializer for e in t.external_data if e.key == "location"}
        assert ext == {"decoder.weights"} and all(len(t.raw_data) < 1024 for t in m.graph.initializer), g
    # same inputs, same bytes: a forced re-run rewrites nothing
    before = (gen_repo.path / f"artifacts/generate/{model}-fp32-ort_cpu/steps.json").read_bytes()
    gen_repo.repro("-f", "-s", cells[1])
    assert (gen_repo.path / f"artifacts/generate/{model}-fp32-ort_cpu/steps.json").read_bytes() == before


def test_a_fault_in_one_decoder_layer_is_reported_at_its_step_with_that_layer(gen_repo):
    gen_repo.repro("generate_export@gen_llama")
    gen_repo.run([f"{BIN}/parity", "compose", "-S", FAULT])
    try:
        ran = gen_repo.repro("generate@gen_llama-fp32-ort_cpu")
        assert "generate_export@gen_llama" not in ran  # the fault is the provider's: the graph is reused
        steps, m = _cell(gen_repo, "gen_llama-fp32-ort_cpu")
    finally:
        gen_repo.run([f"{BIN}/parity", "compose"])
    assert m["verdict"] == "FAIL" and m["first_fail"] == 0 and m["origin_step"] == 0, m
    assert m["drift_origin"] == "model.layers.1.mlp.down_proj", m
    first = steps["steps_detail"][0]
    assert first["excess"] > first["limit"] and not first["passed"]
    layers = {r["name"]: r for r in steps["origin"]["layers"]}
    assert all(r["passed"] for n, r in layers.items() if n.startswith("model.layers.0."))
    assert not layers["model.layers.1.mlp.down_proj"]["passed"]


def test_generate_config_is_validated_at_compose():
    p = composed("models=[mlp]")
    assert "generate" in p and p["generate"]["models"] == []
    msg = config_error(p, lambda q: q["generate"].update(models=["zzz"]))
    assert msg == "generate.models: 'zzz' is not selected in `models`. Selected: mlp", msg
    msg = config_error(p, lambda q: q["generate"].update(models=["mlp"]))
    assert msg.startswith("generate.models: 'mlp' is not a Hugging Face causal LM"), msg
    msg = config_error(p, lambda q: q["generate"].update(steps=0))
    assert msg == "generate.steps: 0 is out of range (valid: [1, 4096])", msg
    msg = config_error(p, lambda q: q["generate"].update(bogus=1))
    assert "generate" in msg and "bogus" in msg, msg


def test_report_draws_each_generate_cell(gen_repo, tmp_path):
    """The report's generation section: a line and a chart per cell (excess/rel_l2 per step, the
    agreement strip), summary.json's `generate` entries; a cell not run says so."""
    from parity.config import params as config
    from parity.pipeline.report import write_report

    gen_repo.repro("generate@gen_llama-fp32-ort_cpu")
    p = config.load(gen_repo.path / "params.yaml")
    p["generate"]["providers"] = ["ort_cpu", "torch_cpu"]
    p["generate"]["models"] = ["gen_llama"]
    (gen_repo.path / "artifacts/generate/gen_llama-fp32-torch_cpu").mkdir(parents=True, exist_ok=True)
    summary, _ = write_report(p, gen_repo.path / "artifacts", tmp_path)
    page = (tmp_path / "report.html").read_text()
    md = (tmp_path / "report.md").read_text()
    assert "<h2>Generation drift</h2>" in page and page.count('<svg xmlns="http://www.w3.org/2000/svg" width="900" '
                                                              'height="260" class="gen"') >= 1
    ran = [k for k, e in summary["generate"].items() if e["verdict"] != "NOT_RUN"]
    assert page.count('class="agree"') == 32 * len(ran) and "<script" not in page
    assert "gen_llama-fp32-ort_cpu: PASS, top-1 agreement 32/32 with fp64" in md
    ort = summary["generate"]["gen_llama-fp32-ort_cpu"]
    assert ort == {"verdict": "PASS", "agreement": 32, "steps": 32}, ort
    assert summary["generate"]["gen_llama-fp32-torch_cpu"] in ({"verdict": "NOT_RUN"},
                                                               {"verdict": "PASS", "agreement": 32, "steps": 32})


def test_report_is_unchanged_without_generate_cells(tmp_path):
    from parity.analysis import generate_report

    assert generate_report.load({"generate": {"models": []}}, tmp_path) == {}
    assert generate_report.html_sections({}) == "" and generate_report.markdown({}) == []


def test_chart_marks_first_divergence_and_failure():
    from parity.analysis import generate_report

    rows = [{"step": i, "excess": 0.01 if i < 3 else 50.0, "rel_l2": 1e-7 if i < 3 else 1e-3, "limit": 4.0,
             "passed": i < 3, "agree": i != 5, "token": 1, "token_ref": 1 if i != 5 else 2, "margin_ref": 0.1}
            for i in range(8)]
    c = {"status": "OK", "verdict": "FAIL", "steps": 8, "agreement": 7, "first_divergence": 5, "first_fail": 3,
         "worst_excess": 50.0, "steps_detail": rows,
         "origin": {"step": 3, "origin": "model.layers.1.mlp.down_proj", "prefix_len": 11, "layers": []}}
    svg = generate_report.steps_svg(c)
    assert "first divergence: step 5" in svg and "first failing step: step 3" in svg
    assert svg.count('fill="#cf222e"><title>step 5: token 1 vs fp64 2') == 1
    assert "drift origin model.layers.1.mlp.down_proj at step 3" in generate_report.line("k", c)


def test_other_providers_are_unsupported_with_the_reason(tmp_path):
    """A provider generate@ does not drive gets UNSUPPORTED naming the runners it does (before any model
    is built)."""
    from parity.pipeline.generate import run_cell

    p = composed("models=[gpt2_small]", "providers=[torch_cpu,torch_compile]", "generate.models=[gpt2_small]",
                 "generate.providers=[torch_compile]")
    res = run_cell(p, "gpt2_small", "fp32", "torch_compile", tmp_path)
    assert res["status"] == res["verdict"] == "UNSUPPORTED", res
    assert "torch_cpu and ort_cpu runners" in res["reason"] and "TorchCompileRunner" in res["reason"], res
