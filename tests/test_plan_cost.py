"""The plan's quantisation cost (issue 35 item 3: the plan ranks blocks by quantisation cost): parity's
own quantisation of each candidate (parity.analysis.plan_cost, through parity.models.quant_sim) run
on real onnxruntime in float32, beside the provider's sensitivity. On a tiny transformer block at
int4 (real DVC, real onnxruntime): every candidate has its expected cost, the provider matches it
(nothing flagged), the ranking is by that cost, the output's expected cost is most of the provider's
error, and plan.json's bytes are the same on a forced re-run. A provider whose quantised weight is
10% off deviates from parity's quantised model by more than the limit and is flagged."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import BIN, TINY_TB, make_repo

CELL = "tiny_tb-int4_weight-ort_int4"
QUANTIZED = {"qkv", "out", "fc1", "fc2"}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    r = make_repo(tmp_path_factory.mktemp("plancost") / "repo", compose=False)
    (r.path / "conf/models/tiny_tb.yaml").write_text(TINY_TB)
    r.set_defaults(models=["tiny_tb"], dtypes=["int4_weight"], providers=["ort_int4"])
    r.run([f"{BIN}/parity", "compose", "-S", "analysis.plan=true", "-S", "analysis.plan_target={atol:0.05,rtol:0.05}"])
    r.commit("tiny_tb on ort_int4, planned")
    return r


def test_plan_ranks_candidates_by_parity_quantisation_cost_and_flags_none_on_a_correct_provider(repo):
    repo.repro(f"plan@{CELL}")
    pl = json.loads((repo.path / f"artifacts/plan/{CELL}/plan.json").read_text())
    assert pl["status"] == "OK" and pl["outcome"] == "planned", pl.get("summary")
    rows = pl["sensitivity"]
    assert {r["layer"] for r in rows} == QUANTIZED
    assert [r["quant_cost"] for r in rows] == sorted((r["quant_cost"] for r in rows), reverse=True)
    for r in rows:  # the provider's int4 is parity's: its deviation is rounding, well under the cost
        assert r["quant_cost"] > 1e-3 and not r["exceeds_cost"] and r["deviation"] < 0.1 * r["quant_cost"], r
        assert abs(r["rel_l2"] - r["quant_cost"]) < 0.1 * r["quant_cost"], r
    q = pl["quant_cost"]
    assert q["scheme"] == "int4" and q["ranked_by"] == "quant_cost" and q["exceeding"] == []
    assert not q["provider_exceeds_cost"] and 0.9 < q["expected_share"] < 1.1, q
    assert "expected int4 cost at the output rel_l2" in pl["summary"] and "EXCEEDS" not in pl["summary"]


def test_plan_json_is_byte_identical_on_a_forced_rerun(repo):
    cell = repo.path / f"artifacts/plan/{CELL}"
    repo.repro(f"plan@{CELL}")
    before = (cell / "plan.json").read_bytes()
    repo.repro("-f", "-s", f"plan@{CELL}")
    assert (cell / "plan.json").read_bytes() == before


def _mlp(path: Path) -> onnx.ModelProto:
    """x (1, 8, 64) -> fc1 -> Relu -> fc2, weights as external data in path/weights.bin (as exports write them)."""
    rng = np.random.default_rng(0)
    w1, w2 = (rng.standard_normal((64, 96)) * 0.1).astype(np.float32), (rng.standard_normal((96, 32)) * 0.1).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"), helper.make_node("Relu", ["h"], ["a"], name="act"),
         helper.make_node("MatMul", ["a", "w2"], ["y"], name="fc2")], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    saved = onnx.ModelProto()
    saved.CopyFrom(m)
    onnx.save(saved, str(path / "model.onnx"), save_as_external_data=True, location="weights.bin", size_threshold=0)
    return m


def test_a_provider_whose_quantised_weight_is_off_exceeds_the_expected_cost():
    from parity.analysis import plan_cost
    from parity.backends import fault, ort_int4

    opts = {**ort_int4.DEFAULTS}
    with tempfile.TemporaryDirectory() as d:
        m = _mlp(Path(d))
        x = {"x": np.random.default_rng(1).standard_normal((1, 8, 64)).astype(np.float32)}
        ref = [dict(y=ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)[0])]
        qm = plan_cost.QuantModel(Path(d), ("int4", opts))
        try:
            mine = qm.run(["fc1"], [x])
        finally:
            qm.close()
        cost = plan_cost.rel_l2(mine, ref)
        for scale, flag in ((1.0, False), (1.1, True)):  # the provider's fc1 weight as it should be, then 10% off
            src = fault.inject(m, {"node": "fc1", "scale": scale})  # a copy of m
            q, _ = ort_int4.quantize(src, opts, ["fc2"])
            got = [dict(y=ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)[0])]
            dev = plan_cost.rel_l2(got, mine)
            assert cost > 0.01 and plan_cost.flagged(cost, dev) is flag, (scale, cost, dev)
