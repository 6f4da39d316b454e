"""Verdicts on what trained weights do (issue 34, items 3 and 4): the scale floor (an approximated kernel
on saturated values passes at fp32, with a note, while a fault beyond it fails), and causes for values
beyond the format's range, with their counts: a BatchNorm whose running variances overflow fp16 (drift
origin that BatchNorm), a weight that underflows fp16, an activation above 65504."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import BIN, make_repo
from parity.analysis import causes
from parity.core import oracle
from parity.core import dtypes

U32 = dtypes.FP32.u
K, SLACK = 4.0, 3e-6  # conf/dtypes/fp32.yaml oracle


# ---------------------------------------------------------------- the scale floor, real kernels

def _sigmoid_head(seed: int = 0) -> np.ndarray:
    """Trained-looking logits of a sigmoid head (a pitch tracker's 360 bins over 128 frames): nearly
    every one strongly negative (outputs ~3e-4), one bin per sample near the top (the detected pitch)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-10.0, -6.0, (2, 128, 360)).astype(np.float32)
    x[:, 17, 200] = 3.0
    return x


def _ort_sigmoid(x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort
    from onnx import TensorProto as T, helper as h

    g = h.make_graph([h.make_node("Sigmoid", ["x"], ["y"])], "g", [h.make_tensor_value_info("x", T.FLOAT, None)],
                     [h.make_tensor_value_info("y", T.FLOAT, None)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _sigmoid_cell():
    """(fp64 values, ORT's fp32 Sigmoid, torch's fp32 sigmoid) of the saturated head."""
    import torch

    x = _sigmoid_head()
    gold = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    return gold, _ort_sigmoid(x), torch.sigmoid(torch.from_numpy(x)).numpy()


def test_an_approximated_sigmoid_on_saturated_values_passes_at_fp32_with_a_note():
    gold, ort_y, torch_y = _sigmoid_cell()
    err, floor = oracle.Sq().add(ort_y, gold), oracle.Sq().add(torch_y, gold)
    j = oracle.judge(err, floor, U32, K, SLACK)
    assert err.rmse > 20 * floor.rmse  # ORT's ~1e-7-accurate Sigmoid vs torch's far more exact one
    assert j["passed"] and j["excess"] <= K, j
    assert "1 unit of roundoff of the layer's largest value" in j["note"] and "approximated kernel" in j["note"]
    assert j["ref_max"] == pytest.approx(gold.max()) and j["scale_floor"] == pytest.approx(0.25 * U32 * gold.max())
    without = oracle.Sq(err.err, err.ref, err.n, err.nonfinite, None)  # the same sums, no largest value
    assert not oracle.judge(without, floor, U32, K, SLACK)["passed"]  # what it was before the scale floor


def test_a_fault_beyond_the_scale_floor_still_fails():
    gold, ort_y, torch_y = _sigmoid_cell()
    floor = oracle.Sq().add(torch_y, gold)
    # the same sigmoid layer, its values x(1 + 1e-4): an error of ~4x the scale floor
    j = oracle.judge(oracle.Sq().add((ort_y * np.float32(1 + 1e-4)), gold), floor, U32, K, SLACK)
    assert not j["passed"] and "note" not in j, j
    # ORT's Sigmoid error (an absolute ~3e-8 RMSE) as a fault on a layer whose largest value is small
    small = np.random.default_rng(1).standard_normal(2 * 128 * 360) * 1e-3
    err = oracle.Sq().add(small + 3e-8, small)
    j = oracle.judge(err, oracle.Sq().add(small.astype(np.float32), small), U32, K, SLACK)
    assert not j["passed"] and j["excess"] > 5 * K, j
    # a large-valued layer (|x| up to 1e3, rms 577): its scale floor (u max|x| / 4 = 1.5e-5) is under u rms
    # (3.4e-5), so it is judged as it was: a 1e-2 offset fails with the excess it had
    big = np.random.default_rng(2).uniform(-1e3, 1e3, 4096)
    base = oracle.Sq().add(big.astype(np.float32), big)
    faulty = oracle.Sq().add(big + 1e-2, big)
    j = oracle.judge(faulty, base, U32, K, SLACK)
    old = oracle.judge(oracle.Sq(faulty.err, faulty.ref, faulty.n, 0, None), base, U32, K, SLACK)
    assert not j["passed"] and j["excess"] == old["excess"], (j, old)


def test_a_trusted_backend_broken_by_range_is_no_yardstick():
    gold = np.random.default_rng(3).standard_normal(1000)
    broken = gold * 12.0  # both sides as wrong (a variance clamped in both conversions)
    j = oracle.judge(oracle.Sq().add(broken, gold), oracle.Sq().add(broken, gold), U32, K, SLACK)
    assert not j["passed"] and "is no rounding" in j["note"], j


# ---------------------------------------------------------------- numeric range causes

def test_activation_above_fp16_max_is_counted():
    b = np.linspace(-1e5, 1e5, 4000)
    a = np.where(np.abs(b) > 65504, np.inf * np.sign(b), b)
    c = causes.classify(a, b, "fp16")
    assert c.label == "overflow" and c.evidence["beyond_max"] == int((np.abs(b) > 65504).sum())
    assert f"{c.evidence['beyond_max']:,} values above 65504 (fp16's largest) at this layer" in c.summary, c.summary


def test_values_flushed_to_zero_are_underflow():
    b = np.concatenate([np.full(100, 3e-5), np.full(10, 1e-8)])  # below fp16's smallest normal 6.1e-5
    a = np.where(b < 2.9e-8, 0.0, b)
    a[:100] = 0.0
    c = causes.classify(a, b, "fp16")
    assert c.label == "underflow" and c.evidence["flushed"] == 110 and c.evidence["below_subnormal"] == 10, c.summary


def test_cancellation_names_the_input_scale():
    x = 1000.0 + np.random.default_rng(4).standard_normal(4096)  # a large mean subtracted
    b = x - 1000.0
    a = b + np.random.default_rng(5).standard_normal(4096) * 1000.0 * dtypes.FP16.u
    c = causes.classify(a, b, "fp16", inputs=x)
    assert c.label == "cancellation" and c.evidence["ratio"] > 100, c.summary


# ---------------------------------------------------------------- through the pipeline, ort_cpu fp16

def _graphs():
    """Three ONNX files, each breaking fp16 in one way: a BatchNorm with 24 running variances of 1e7,
    a MatMul weight of 2e-8 (below fp16's smallest subnormal), a MatMul whose outputs pass 65504."""
    import onnx
    from onnx import TensorProto as T, helper as h, numpy_helper as nh

    rng = np.random.default_rng(0)

    def model(nodes, inits, x_shape, y_shape):
        g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, x_shape)],
                         [h.make_tensor_value_info("y", T.FLOAT, y_shape)],
                         [nh.from_array(np.asarray(v, dtype=np.float32), n) for n, v in inits.items()])
        m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
        onnx.checker.check_model(m, full_check=True)
        return m

    c = 24
    bn = model([h.make_node("Conv", ["x", "w0"], ["conv0"], name="conv0"),
                h.make_node("BatchNormalization", ["conv0", "gamma", "beta", "mean", "var"], ["bn"], name="batch_norm_0"),
                h.make_node("Relu", ["bn"], ["relu"], name="relu"),
                h.make_node("Conv", ["relu", "w1"], ["conv1"], name="conv1"),
                h.make_node("Sigmoid", ["conv1"], ["y"], name="sigmoid")],
               {"w0": rng.standard_normal((c, 4, 1, 1)) * 1500.0, "gamma": np.ones(c), "beta": np.full(c, 0.1),
                "mean": np.zeros(c), "var": rng.uniform(1e7, 1e8, c), "w1": rng.standard_normal((2, c, 1, 1)) * 0.3},
               [2, 4, 8, 8], [2, 2, 8, 8])
    under = model([h.make_node("MatMul", ["x", "w"], ["mm"], name="mm"), h.make_node("Relu", ["mm"], ["y"], name="relu")],
                  {"w": np.full((16, 8), 2e-8)}, [4, 16], [4, 8])
    over = model([h.make_node("MatMul", ["x", "w"], ["mm"], name="mm"), h.make_node("Tanh", ["mm"], ["y"], name="tanh")],
                 {"w": rng.standard_normal((16, 8)) * 1e3}, [4, 16], [4, 8])
    return {"bn_var": (bn, [2, 4, 8, 8], 1.0), "weight_under": (under, [4, 16], 1e4), "act_over": (over, [4, 16], 30.0)}


@pytest.fixture(scope="module")
def fp16_repo(tmp_path_factory):
    import onnx

    r = make_repo(tmp_path_factory.mktemp("range") / "repo", dtypes=("fp16",), providers=("ort_cpu",), compose=False)
    (r.path / "models").mkdir()
    for name, (m, shape, std) in _graphs().items():
        onnx.save(m, str(r.path / "models" / f"{name}.onnx"))
        (r.path / f"conf/models/{name}.yaml").write_text(
            f"{name}:\n  arch: {{source: onnx, path: models/{name}.onnx}}\n  input:\n"
            f"    - {{name: x, shape: {shape}, dtype: float32, init: normal, mean: 0.0, std: {std}}}\n  tolerances: []\n")
    r.set_defaults(models=tuple(_graphs()))
    r.run([f"{BIN}/parity", "compose"])
    r.commit("three fp16 range breakages")
    r.repro()
    return r


def _cell(r, model, provider="ort_cpu"):
    d = r.path / f"artifacts/diff/{model}-fp16-{provider}"
    return json.loads((d / "metrics.json").read_text()), json.loads((d / "layers.json").read_text())


def test_batchnorm_variances_beyond_fp16_are_the_drift_origin_and_the_cause(fp16_repo):
    m, lj = _cell(fp16_repo, "bn_var")
    st = json.loads((fp16_repo.path / "artifacts/capture/bn_var-fp16-ort_cpu/status.json").read_text())
    rng = st["settings"]["range"]  # found before anything ran: from the graph's values
    assert [(e["param"], e["over"], e["numel"]) for e in rng] == [("var", 24, 24)], rng
    assert m["verdict"] == "FAIL" and m["drift_origin"] == "bn", m
    cause = lj["drift_origin_cause"]
    assert cause["label"] == "range" and "24 of 24 values above 65504" in cause["summary"], cause
    assert "var (read by BatchNormalization)" in cause["summary"]


def test_a_weight_below_fp16s_smallest_subnormal_is_named_underflow(fp16_repo):
    m, lj = _cell(fp16_repo, "weight_under")
    assert m["verdict"] == "FAIL" and m["drift_origin"] == "mm", m
    cause = lj["drift_origin_cause"]
    assert cause["label"] == "range" and cause["evidence"]["kind"] == "underflow", cause
    assert "128 nonzero values below 5.96e-08" in cause["summary"], cause["summary"]


def test_an_activation_above_65504_is_named_with_its_count(fp16_repo, tmp_path):
    """The MatMul's outputs reach ~1e5. ORT's CPU provider computes MatMul in float32 inside an fp16 graph
    (measured: no inf), so the values an fp16 kernel writes, inf above 65504, are put into the capture
    (as tests/test_drift_origin.py perturbs a capture) and the diff stage judges them."""
    import shutil

    from parity.core import store

    r = fp16_repo
    src, cap = r.path / "artifacts/capture/act_over-fp16-ort_cpu", tmp_path / "capture"
    shutil.copytree(src, cap)
    (cap / "oracle_sums.json").unlink()  # the sums were of the values as captured
    rows = []
    for t in store.read(src / "layers.parquet"):
        a = np.array(t.array)
        if t.name == "mm":
            a = np.where(np.abs(a) > 65504, np.inf * np.sign(a), a).astype(a.dtype)
        rows.append(store.Tensor(t.sample, t.name, t.order, a))
    store.write(cap / "layers.parquet", rows)
    out = tmp_path / "diff"
    r.run(["python", "-m", "stages.diff", "--model", "act_over", "--dtype", "fp16", "--provider", "ort_cpu",
           "--capture", str(cap), "--reference", "artifacts/reference/act_over", "--baseline",
           "artifacts/baseline/act_over/fp16", "--model-dir", "artifacts/models/act_over", "--out", str(out)])
    m, lj = json.loads((out / "metrics.json").read_text()), json.loads((out / "layers.json").read_text())
    assert m["verdict"] == "FAIL" and m["verdict_mode"] == "oracle" and m["drift_origin"] == "mm", m
    cause = lj["drift_origin_cause"]
    n = cause["evidence"]["beyond_max"]
    assert cause["label"] == "overflow" and n == cause["evidence"]["inf_actual"] > 0, cause
    assert f"{n:,} values above 65504 (fp16's largest) at this layer" in cause["summary"], cause["summary"]


# ---------------------------------------------------------------- a torch model, torch_cpu + ort_cpu fp16

BN_NET = '''\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.fc1, self.bn, self.act, self.fc2 = nn.Linear(4, 24), nn.BatchNorm1d(24), nn.ReLU(), nn.Linear(24, 2)
        with torch.no_grad():  # trained-looking: activations ~3e3, their running variances 1e7-1e8
            self.fc1.weight.copy_(torch.randn(24, 4, generator=g) * 1500.0)
            self.bn.running_var.copy_(torch.rand(24, generator=g) * 9e7 + 1e7)

    def forward(self, x):
        return torch.sigmoid(self.fc2(self.act(self.bn(self.fc1(x)))))
'''


def test_a_torch_batchnorm_beyond_fp16_fails_both_cells_at_that_batchnorm(tmp_path):
    """torch's .half() makes the variances inf (the layer outputs its bias, 0), onnxruntime's conversion
    clamps them to 65504: both fp16 cells are wrong from `bn` on. The trusted backend judged against
    itself is no BASELINE there (its error is capped: it fails), and the ORT cell's cause names the
    parameter from the exported graph (the exporter keeps a BatchNorm1d after a Linear)."""
    r = make_repo(tmp_path / "repo", models=("bn_net",), dtypes=("fp16",), compose=False)
    (r.path / "usermodels").mkdir()
    (r.path / "usermodels/__init__.py").write_text("")
    (r.path / "usermodels/net.py").write_text(BN_NET)
    (r.path / "conf/models/bn_net.yaml").write_text(
        "bn_net:\n  arch: {source: import, name: 'usermodels.net:Net'}\n  input:\n"
        "    - {name: x, shape: [8, 4], dtype: float32, init: normal, mean: 0.0, std: 1.0}\n  tolerances: []\n")
    r.run([f"{BIN}/parity", "compose"])
    r.commit("a BatchNorm1d with running variances beyond fp16")
    r.repro()
    m, lj = _cell(r, "bn_net", "torch_cpu")
    assert m["verdict"] == "FAIL" and m["drift_origin"] == "bn", m
    assert [d["name"] for d in lj["layers"] if d["passed"]] == ["fc1"]
    m, lj = _cell(r, "bn_net", "ort_cpu")
    assert m["verdict"] == "FAIL" and m["drift_origin"] == "bn", m
    cause = lj["drift_origin_cause"]
    assert cause["label"] == "range" and "bn.running_var (read by BatchNormalization): 24 of 24 values above 65504" \
        in cause["summary"], cause
