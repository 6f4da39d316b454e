"""Causes that read the numbers right (issue 35, item 4): a normalisation's epsilon is a per-token scale,
weights stored in fp16 inside an fp32 layer, an attention mask leak at a token, a 1.002 scale under fp16
noise, axes named by what they are (token vs hidden), and a cause that never contradicts its verdict."""

from __future__ import annotations

import json

import numpy as np
import pytest

from parity.analysis import causes
from parity.analysis.causes import classify
from parity.pipeline.diff import CellDiff
from parity.core import compare, dtypes, oracle, store

U16 = 2.0 ** -11


def check(cause, label):
    assert cause.label == label, cause.summary
    json.dumps(cause.as_dict(), allow_nan=False)
    assert cause.summary.startswith(label + ":")
    return cause.evidence


def rmsnorm(x, eps, g):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * g


@pytest.fixture
def hidden():
    """(batch, token, hidden) = (1, 32, 64) activations whose rows have very different sizes (as a
    decoder's tokens have), small enough that an epsilon of 1e-2 matters."""
    rng = np.random.default_rng(0)
    return rng.normal(size=(1, 32, 64)) * rng.uniform(0.02, 0.3, size=(1, 32, 1))


def test_rmsnorm_epsilon_is_a_per_token_scale(hidden):
    g = np.random.default_rng(1).uniform(0.5, 1.5, size=64)
    b, a = rmsnorm(hidden, 1e-5, g), rmsnorm(hidden, 1e-2, g).astype(np.float32)
    ev = check(classify(a, b, "fp32", inputs=hidden, name="model.layers.0.input_layernorm"), "row_scale")
    assert ev["rows_scaled"] == 32 and ev["scale_max"] < 1.0
    assert ev["epsilon_change"] == pytest.approx(1e-2 - 1e-5, rel=0.05)  # the change, read off the scales
    assert "token" in classify(a, b, "fp32", name="model.layers.0.input_layernorm").summary


def test_epsilon_on_rows_of_similar_size_is_still_per_token():
    """Rows of about one size: one scale fits the epsilon change roughly, the per-token scales 10x better."""
    x = np.random.default_rng(9).normal(size=(1, 32, 128)) * 0.06
    b, a = rmsnorm(x, 1e-5, 1.0), rmsnorm(x, 1e-2, 1.0)
    ev = check(classify(a, b, "fp32", inputs=x, name="model.layers.0.post_attention_layernorm"), "row_scale")
    assert ev["epsilon_change"] == pytest.approx(1e-2 - 1e-5, rel=0.05)


def test_one_global_scale_stays_scale(hidden):
    assert classify(hidden * 1.01, hidden, "fp32", name="model.norm").label == "scale"


def test_weights_rounded_to_fp16_in_an_fp32_layer():
    rng = np.random.default_rng(2)
    x, w = rng.normal(size=(1, 32, 128)), rng.normal(size=(96, 128)) / np.sqrt(128)
    b = x @ w.T
    a = x.astype(np.float32) @ w.astype(np.float16).astype(np.float32).T  # fp32 graph, fp16-stored weights
    ev = check(classify(a, b, "fp32", name="model.layers.1.mlp.down_proj"), "narrow_weights")
    assert 0.3 < ev["rel_l2_u"] < 1.0 and ev["format"] == "fp16"
    assert classify(a, b, "fp32", name="model.layers.1.act_fn").label == "unknown"  # holds no weights
    assert classify(a, b, "fp16").label == "precision"  # at fp16 it is what the format explains


def causal_attention(q, k, v, leak_from=None):
    """softmax(q k^T / sqrt(d)) v with a causal mask; `leak_from`: that token sees every token."""
    t = q.shape[1]
    s = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    mask = np.tril(np.ones((t, t), bool))
    if leak_from is not None:
        mask[leak_from] = True
    s = np.where(mask, s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def test_mask_leak_at_token_10_names_the_token_axis():
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=(1, 16, 32)) for _ in range(3))
    b, a = causal_attention(q, k, v), causal_attention(q, k, v, leak_from=10).astype(np.float32)
    ev = check(classify(a, b, "fp32", name="model.layers.0.self_attn"), "mask_leak")
    assert ev["first"] == 10 and ev["tokens"] == [10] and ev["axis"] == 1 and ev["axis_name"] == "token"
    c = classify(a, b, "fp32", name="between:model.layers.0.self_attn.o_proj")
    assert c.label == "mask_leak" and "token 10" in c.summary and "channel" not in c.summary


def test_error_at_a_position_outside_attention_is_position_not_channel():
    b = np.random.default_rng(4).normal(size=(1, 32, 64))
    a = b.copy()
    a[0, 20] += 0.3  # a position-embedding row
    ev = check(classify(a, b, "fp32", name="transformer.wpe"), "position")
    assert ev["first"] == 20 and ev["axis_name"] == "token"
    a = b.copy()
    a[0, :, 5] *= 1.2  # one hidden channel: a channel, named by its axis
    c = classify(a, b, "fp32", name="model.layers.0.mlp.down_proj")
    assert c.label == "channel" and "axis 2 (hidden)" in c.summary
    assert c.evidence["axis_name"] == "hidden" and c.evidence["channels"] == [5]


def test_rank4_conv_keeps_channel_axis_1():
    b = np.random.default_rng(5).normal(size=(2, 8, 6, 6))
    a = b.copy()
    a[:, 3] *= 1.1
    c = classify(a, b, "fp32", name="layer1.0.conv1")
    assert c.label == "channel" and "axis 1 (channel)" in c.summary


def test_scale_1_002_under_fp16_noise():
    rng = np.random.default_rng(6)
    b = rng.normal(size=(1, 32, 128))
    noise = 1 + 2 * U16 * rng.uniform(-1, 1, size=b.shape)  # a few fp16 roundings, accumulated
    a = (b * 1.002 * noise).astype(np.float16)
    limit = 4 * 2 * U16 / np.sqrt(3)  # the oracle's: k x the trusted backend's error
    ev = check(classify(a, b, "fp16", limit=limit, failed=True, name="model.layers.1.mlp.down_proj"), "scale")
    assert ev["s"] == pytest.approx(1.002, abs=2e-4)
    assert classify(a, b, "fp16", limit=1e-3, name="model.layers.1.mlp.down_proj").label == "scale"


def test_a_failed_layer_is_never_precision():
    b = np.random.default_rng(7).normal(size=(1, 16, 32))
    a = b.copy()
    a[0, 3, 4] += 3e-5  # one element: a tolerance verdict fails it, rel_l2 stays tiny
    assert classify(a, b, "fp16").label == "precision"
    c = classify(a, b, "fp16", failed=True)
    assert c.label != "precision" and "within" not in c.summary.split(";")[0]
    if c.label == "unknown":
        assert c.evidence["within_limit"] is not None and "verdict fails it" in c.summary
        assert "0.1953% of the elements differ" in c.summary  # one element of 512: "a few elements"


def test_a_tolerance_below_one_rounding_is_named_not_called_a_few_elements():
    """fp16 at atol = rtol = 0 (README's history flow) fails every rounded element: the cause says the limit
    is tighter than one rounding and how many elements differ (99.9%), not only "a few elements"."""
    rng = np.random.default_rng(11)
    b = rng.normal(size=(1, 64, 64))
    a = b.astype(np.float16).astype(np.float64)
    c = classify(a, b, "fp16", failed=True)
    assert c.label == "unknown" and "tighter than one rounding" in c.summary
    share = float(c.summary.split("; ")[-1].split("%")[0])
    assert share > 99.0, c.summary


def test_origin_cause_passes_the_verdict_to_the_cause():
    """The diff's origin cause of a layer that failed its tolerance: not `precision`, whatever rel_l2."""
    b = np.random.default_rng(8).normal(size=(1, 16, 32)).astype(np.float32)
    a = b.copy()
    a[0, 3, 4] += np.float32(3e-3)
    name = "model.layers.0.mlp.down_proj"
    d = compare.compare_layer(name, 0, [(0, a, b)], 1e-5, 1e-5, "test", 0.0)
    assert not d.passed
    cd = CellDiff({"status": "OK"}, layers=[d], summary={"drift_origin": name}, mode="tolerance")
    act = {(0, name): store.Tensor(0, name, 0, a)}
    ref = {(0, store.reference_name(name)): store.Tensor(0, store.reference_name(name), 0, b)}
    cause = causes.origin_cause(cd, act, ref, None, None, lambda rec: oracle.limit_rel(rec, U16, 4.0, 0.0),
                                dtypes.facts("fp16"))
    assert cause["label"] != "precision", cause["summary"]
    assert "<= limit" not in cause["summary"]


def _graph(w, path, outputs=("y", "h")):
    """x -> MatMul(w) -> h (leaf `fc`) -> Relu -> y, with the exporter's name_scopes on the MatMul."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    mm = helper.make_node("MatMul", ["x", "w"], ["h"], name="node_MatMul_0")
    mm.metadata_props.add(key="pkg.torch.onnx.name_scopes", value="['', 'model', 'model.fc', 'linear']")
    relu = helper.make_node("Relu", ["h"], ["y"], name="node_Relu_1")
    g = helper.make_graph([mm, relu], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, [1, 3]) for o in outputs],
                          [numpy_helper.from_array(w.astype(np.float32), "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(path))


def _plain_failed_cell():
    b = np.ones((1, 3), np.float32)
    layers = [compare.compare_layer(n, i, [(0, a, b)], 1e-5, 1e-5, "test") for i, (n, a) in
              enumerate([("fc", b), ("output", b), ("plain:output", 1.05 * b)])]
    return CellDiff({"status": "OK"}, layers=layers, summary={"drift_origin": "plain:output"})


def test_fault_only_in_the_plain_graph_names_its_node_and_module(tmp_path):
    """model.onnx with one weight x1.05, layers.onnx as exported: the diff names the MatMul and its module."""
    from parity.analysis import plaindiff

    w = np.random.default_rng(10).normal(size=(4, 3))
    _graph(w, tmp_path / "layers.onnx")
    _graph(w * 1.05, tmp_path / "model.onnx", outputs=("y",))
    changes = plaindiff.graph_changes(tmp_path)
    assert [(c["node"], c["module"]) for c in changes] == [("node_MatMul_0", "fc")]
    assert "x1.05" in changes[0]["changes"][0]
    cd = _plain_failed_cell()
    assert plaindiff.plain_only(cd)
    plaindiff.locate(cd, tmp_path)
    assert cd.summary["drift_origin"] == "fc"
    cause = cd.summary["drift_origin_cause"]
    assert cause["label"] == "plain_graph" and "node_MatMul_0" in cause["summary"]


def test_plain_graph_equal_to_layers_sends_to_reduce(tmp_path):
    from parity.analysis import plaindiff

    w = np.random.default_rng(11).normal(size=(4, 3))
    _graph(w, tmp_path / "layers.onnx")
    _graph(w, tmp_path / "model.onnx", outputs=("y",))
    assert plaindiff.graph_changes(tmp_path) == []
    cd = _plain_failed_cell()
    plaindiff.locate(cd, tmp_path)
    assert cd.summary["drift_origin"] == "plain:output" and "reduce@" in cd.summary["drift_origin_cause"]["summary"]


def test_a_failed_bit_identical_layer_is_unknown_not_a_fit():
    b = np.random.default_rng(12).normal(size=(1, 8, 16))
    c = classify(b.copy(), b, "fp32", failed=True)
    assert c.label == "unknown" and c.evidence["within_limit"] is not None


def test_a_fault_only_in_the_plain_graph_is_not_read_as_0_failing():
    """A fault only in model.onnx fails plain:output while every layer passes: the cell's line said
    "3 layers compared, 0 failing" beside FAIL. It now names the output that fails."""
    from parity.core.status import layer_counts
    from parity.pipeline import report_render as r

    m = {"verdict": "FAIL", "verdict_mode": "oracle", "layers": 3, "layers_failed": 0, "drift_origin": "plain:output",
         "output": {"passed": True}, "plain_output": {"passed": False, "excess": 603.0}}
    assert layer_counts(m) == "3 layers compared, 0 failing; the shipped graph's output (model.onnx) fails"
    cell = {"key": "mlp-fp32-ort_cpu", "model": "mlp", "dtype": "fp32", "provider": "ort_cpu", "metrics": m,
            "layers": [], "k": 4.0, "timing": {}}
    assert "0 failing; the shipped graph&#x27;s output (model.onnx) fails" in r.verdict_prose(cell)
    m["output"]["passed"] = False
    assert layer_counts(m).endswith("; the output and the shipped graph's output (model.onnx) fail")
    passing = dict(m, verdict="PASS", output={"passed": True}, plain_output={"passed": True})
    assert layer_counts(passing) == "3 layers compared, 0 failing"


@pytest.mark.parametrize("numeric_label", ["offset", "unknown"])
def test_a_few_underflowing_weights_do_not_replace_a_pattern_the_values_name(numeric_label):
    """A failing fp16 layer that reads 2 weights below fp16's smallest subnormal: when its values name a
    pattern (an offset of +0.02 on its output: issue 35's fault table, row 17), that stays the drift
    origin's cause, the underflow in its evidence; when they name none, the underflow is the cause."""
    from parity.pipeline.diff import settings_causes

    b = np.random.default_rng(3).normal(size=(1, 8, 4, 4)).astype(np.float32)
    name = "layer4.1.conv2"
    d = compare.compare_layer(name, 0, [(0, b + np.float32(0.02), b)], 1e-5, 1e-5, "test", 0.0)
    rng = {"param": f"{name}.weight", "format": "fp16", "numel": 2359296, "over": 0, "under": 2, "max_abs": 0.3,
           "min_abs": 1e-9, "ops": ["Conv"], "modules": [name]}
    numeric = {"label": numeric_label, "summary": f"{numeric_label}: +0.02", "evidence": {}}
    cd = CellDiff({"status": "OK", "settings": {"range": [rng]}}, layers=[d],
                  summary={"drift_origin": name, "drift_origin_cause": numeric}, mode="oracle")
    settings_causes(cd)
    cause = cd.summary["drift_origin_cause"]
    if numeric_label == "offset":
        assert cause["label"] == "offset" and "2 nonzero values below" in cause["evidence"]["range"], cause
        assert "reads parameters below fp16's smallest subnormal" in cause["summary"], cause
        many = {**rng, "under": 128, "numel": 128, "max_abs": 2e-8}  # every weight flushed: it is the cause
        cd2 = CellDiff({"status": "OK", "settings": {"range": [many]}}, layers=[d],
                       summary={"drift_origin": name, "drift_origin_cause": numeric}, mode="oracle")
        settings_causes(cd2)
        assert cd2.summary["drift_origin_cause"]["label"] == "range", cd2.summary["drift_origin_cause"]
    else:
        assert cause["label"] == "range" and cause["evidence"]["kind"] == "underflow", cause
    assert cd.layer_causes[name]["label"] == "range"  # the layer's own record still says what the graph holds
