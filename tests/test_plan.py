"""The mixed-precision plan (analysis.plan, plan@model-dtype-provider) in the real pipeline: real DVC
in a temporary git repo, the tiny MLP, real onnxruntime (fp16 conversion, static INT8 quantization)
and real torch. A plan names the leaf modules to keep in float32 so the output passes the target, and
a confirming run of the mixed model on that backend passes; no plan stage exists unless asked for."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from conftest import BIN, ENV, composed, config_error, make_repo

DTYPES = ("fp16", "int8_static")
PROVIDERS = ("torch_cpu", "ort_cpu", "ort_int8")
RUNS = {("fp16", "torch_cpu"), ("fp16", "ort_cpu"), ("int8_static", "ort_int8")}  # the supported pairs
LEAVES = {"fc1", "act", "fc2"}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_repo(tmp_path_factory.mktemp("plan") / "repo", dtypes=DTYPES, providers=PROVIDERS)


def plan(repo, d, p) -> dict:
    return json.loads((repo.path / "artifacts/plan" / f"tiny_mlp-{d}-{p}" / "plan.json").read_text())


def keep_yaml(repo, d, p) -> dict:
    return yaml.safe_load((repo.path / "artifacts/plan" / f"tiny_mlp-{d}-{p}" / "keep.yaml").read_text())


def test_no_plan_stage_exists_unless_analysis_plan_is_true(repo):
    stages = repo.run("dvc stage list").stdout
    assert "capture@tiny_mlp-fp16-ort_cpu" in stages and "plan@" not in stages
    repo.run([f"{BIN}/parity", "compose", "-S", "analysis.plan=true"])
    try:
        stages = repo.run("dvc stage list").stdout
        listed = {line.split()[0] for line in stages.splitlines() if line.startswith("plan@")}
        assert listed == {f"plan@tiny_mlp-{d}-{p}" for d in DTYPES for p in PROVIDERS}
    finally:
        repo.run("git checkout -- params.yaml")


def test_full_model_within_target_keeps_nothing_and_int8_gets_a_confirmed_plan(repo):
    ran = repo.exp_run("analysis.plan=true", "analysis.plan_target={atol:0.05,rtol:0.05}")
    assert {f"plan@tiny_mlp-{d}-{p}" for d in DTYPES for p in PROVIDERS} <= set(ran)
    for d in DTYPES:
        for p in PROVIDERS:
            pl = plan(repo, d, p)
            if (d, p) not in RUNS:
                assert pl["status"] == "UNSUPPORTED" and f"not {d}" in pl["reason"], pl
                assert keep_yaml(repo, d, p)["keep_fp32"] == []
                continue
            assert pl["status"] == "OK" and pl["target"]["source"] == "analysis.plan_target", pl
            assert pl["outputs"]["fp32"]["passes"]
    for p in ("torch_cpu", "ort_cpu"):  # fp16 is well within 5%: nothing to keep
        pl = plan(repo, "fp16", p)
        assert pl["outcome"] == "full_passes" and pl["keep"] == [] and pl["passes"], pl["summary"]
    # static INT8 of the tiny MLP misses 5% (calibrated on 4 samples): some linear layers stay float32
    pl = plan(repo, "int8_static", "ort_int8")
    assert pl["outcome"] == "planned" and pl["passes"], pl["summary"]
    assert not pl["outputs"]["full"]["passes"] and pl["outputs"]["mixed"]["passes"]
    assert 1 <= len(pl["keep"]) < len(LEAVES) and set(pl["keep"]) <= LEAVES
    assert {r["layer"] for r in pl["sensitivity"]} == LEAVES
    k = keep_yaml(repo, "int8_static", "ort_int8")
    assert k["keep_fp32"] == pl["keep"] and k["passes"] is True
    assert k["nodes_to_exclude"] == sorted(n for layer in pl["keep"] for n in pl["keep_items"][layer])
    timing = json.loads((repo.path / "artifacts/plan/tiny_mlp-int8_static-ort_int8/timing.json").read_text())
    assert timing["latency"]["mixed"]["median_ms"] > 0 and timing["stage_s"] > 0


def test_fp16_plan_names_layers_to_keep_and_the_mixed_model_passes(repo):
    ran = set(repo.exp_run("analysis.plan=true", "analysis.plan_target={atol:1.0e-5,rtol:1.0e-2}")) - {ENV}
    # the plans re-run, and the report that shows them; no capture or diff
    assert ran == {f"plan@tiny_mlp-{d}-{p}" for d in DTYPES for p in PROVIDERS} | {"report"}
    for p in ("torch_cpu", "ort_cpu"):
        pl = plan(repo, "fp16", p)
        assert pl["outcome"] == "planned" and pl["passes"], pl["summary"]
        assert not pl["outputs"]["full"]["passes"] and pl["outputs"]["mixed"]["passes"]
        assert pl["outputs"]["mixed"]["tol_ratio"] <= 1 < pl["outputs"]["full"]["tol_ratio"]
        assert 1 <= len(pl["keep"]) < len(LEAVES), pl["summary"]
        assert pl["search"][0]["layer"] == pl["sensitivity"][0]["layer"]  # greedy starts at the most sensitive


def test_ort_keep_list_applies_as_keep_yaml_says(repo):
    """What a user does with keep.yaml: convert model.onnx with its node_block_list, run it, compare."""
    import onnx
    import onnxruntime as ort

    from parity.core import store
    from parity.backends.ort_cpu import mixed_fp16

    k = keep_yaml(repo, "fp16", "ort_cpu")
    assert k["node_block_list"] and k["keep_fp32"]
    from parity.models.onnx_weights import load_with_data  # weights.bin is hard-linked by DVC: onnx.load refuses it

    m = mixed_fp16(load_with_data(repo.path / "artifacts/models/tiny_mlp/model.onnx"), k["node_block_list"])
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = store.read_dict(repo.path / "artifacts/reference/tiny_mlp/fp32.parquet")
    atol, rtol = k["target"]["atol"], k["target"]["rtol"]
    for t in store.read(repo.path / "artifacts/inputs/tiny_mlp.parquet"):
        got = sess.run(None, {t.name: t.array})[0].astype(np.float64)
        want = ref[(t.sample, "output")].array.astype(np.float64)
        assert np.all(np.abs(got - want) <= atol + rtol * np.abs(want))


def test_forced_plan_rerun_is_byte_identical(repo):
    cell = repo.path / "artifacts/plan/tiny_mlp-fp16-ort_cpu"
    before = {f: (cell / f).read_bytes() for f in ("plan.json", "keep.yaml")}
    repo.run("dvc repro -f -s plan@tiny_mlp-fp16-ort_cpu")
    assert {f: (cell / f).read_bytes() for f in before} == before


@pytest.mark.parametrize("mutate, must_say", [
    (lambda p: p["analysis"].update(plan="yes"), "analysis.plan: expected true or false"),
    (lambda p: p["analysis"].update(plan_target={"atol": 1e-3}), "analysis.plan_target: missing key 'rtol'"),
    (lambda p: p["analysis"].update(max_keep=0), "analysis.max_keep: 0 is out of range"),
    (lambda p: p["analysis"].update(plan_group="layer"), "analysis.plan_group: unknown 'layer' (valid: auto, leaf, block)"),
    (lambda p: p["analysis"].update(bogus=1), "analysis: unknown key 'bogus'"),
    (lambda p: p.update(plan_dtypes=["fp16"]), "plan_dtypes: ['fp16'] does not match"),
])
def test_bad_analysis_config_names_the_key(mutate, must_say):
    assert must_say in config_error(composed(), mutate)


def test_candidates_group_per_block_for_large_models():
    """analysis.plan_group: a block is the path up to the first index; leaves under none, and ops
    between leaves, go with their module; auto groups only above AUTO_BLOCKS_ABOVE leaves."""
    from parity.analysis import plan as planner

    assert planner.block_of("model.layers.3.self_attn.q_proj") == "model.layers.3"
    assert planner.block_of("layer2.1.conv1") == "layer2.1"
    assert planner.block_of("add_3 in layer2.1") == "layer2.1"
    assert planner.block_of("lm_head") == "lm_head" and planner.block_of("view in model") == "view in model"
    leaves = {f"model.layers.{i}.{p}": [f"n{i}{p}"] for i in range(22)
              for p in ("self_attn.q_proj", "self_attn.o_proj", "mlp.down_proj")}
    leaves["lm_head"] = ["n_lm"]
    items, members = planner.grouped(leaves, "auto")  # 67 leaves > 32: blocks
    assert list(items) == [f"model.layers.{i}" for i in range(22)] + ["lm_head"]
    assert items["model.layers.3"] == ["n3self_attn.q_proj", "n3self_attn.o_proj", "n3mlp.down_proj"]
    assert members["lm_head"] == ["lm_head"] and len(members["model.layers.0"]) == 3
    few = dict(list(leaves.items())[:6])
    assert planner.grouped(few, "auto")[0] == few and planner.grouped(leaves, "leaf")[0] == leaves
    assert list(planner.grouped(few, "block")[0]) == ["model.layers.0", "model.layers.1"]
    with pytest.raises(ValueError, match="analysis.plan_group: unknown 'x' \\(valid: auto, leaf, block\\)"):
        planner.grouped(few, "x")
