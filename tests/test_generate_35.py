"""Generation's own-error test (issue 35, item 2): at the prompt's step and at the first failing step every
decoder leaf is re-run on the fp64 reference's input to it, on the provider and on the trusted baseline,
and judged as the per-layer cells judge it. A 1% weight error at fp16 that the logits' excess hides (the
accumulated error of the layers after it is larger) fails there, at that layer; an unfaulted fp16 cell
passes."""

from __future__ import annotations

import json

import pytest

from conftest import BIN, make_repo
from test_generate import GEN_LLAMA

FAULT = "+providers.ort_cpu.options.fault={node: model.layers.1.mlp.down_proj, scale: 1.01}"
CELL = "generate@gen_llama-fp16-ort_cpu"


@pytest.fixture(scope="module")
def fp16_repo(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("gen16") / "repo", models=("gen_llama",), dtypes=("fp16",),
                     providers=("ort_cpu",), compose=False)
    (repo.path / "conf/models/gen_llama.yaml").write_text(GEN_LLAMA)
    repo.edit("conf/config.yaml", "  models: []               # dvc exp run -S 'generate.models=[gpt2_small]'",
              "  models: [gen_llama]")
    repo.edit("conf/config.yaml", "  dtypes: [fp32]\n  providers: [torch_cpu, ort_cpu]\n  steps: 32",
              "  dtypes: [fp16]\n  providers: [ort_cpu]\n  steps: 8")
    repo.run([f"{BIN}/parity", "compose"])
    repo.commit("generate fp16")
    return repo


def _cell(repo) -> tuple[dict, dict]:
    d = repo.path / "artifacts/generate/gen_llama-fp16-ort_cpu"
    return json.loads((d / "steps.json").read_text()), json.loads((d / "metrics.json").read_text())


def test_unfaulted_fp16_passes_its_own_error_test(fp16_repo):
    fp16_repo.repro(CELL)
    steps, m = _cell(fp16_repo)
    assert m["verdict"] == "PASS", m
    own = steps["steps_detail"][0]
    assert own["own_failed"] == [] and 0 < own["own_worst_excess"] <= own["limit"]
    assert steps["own"]["0"]["origin"] is None and steps["own"]["0"]["prefix_len"] == 8


def test_one_percent_weight_error_at_fp16_fails_at_its_layer(fp16_repo):
    fp16_repo.run([f"{BIN}/parity", "compose", "-S", FAULT])
    try:
        fp16_repo.repro(CELL)
        steps, m = _cell(fp16_repo)
    finally:
        fp16_repo.run([f"{BIN}/parity", "compose"])
    first = steps["steps_detail"][0]
    assert m["verdict"] == "FAIL" and m["first_fail"] == 0 and m["drift_origin"] == "model.layers.1.mlp.down_proj", m
    assert steps["origin"]["kind"] == "own" and "model.layers.1.mlp.down_proj" in first["own_failed"]
    layers = {r["name"]: r for r in steps["origin"]["layers"]}
    assert all(r["passed"] for n, r in layers.items() if n.startswith("model.layers.0."))
    assert layers["model.layers.1.mlp.down_proj"]["excess"] > 2 * first["limit"]
