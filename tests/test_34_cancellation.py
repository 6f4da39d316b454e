"""A cancelling sum at fp16 (issue 34: basic-pitch's constant-Q transform): a Conv whose outputs are
hundreds of times smaller than the products it sums computes wrong values in every fp16 backend alike
(the operands' rounding, amplified), so the oracle passes it (the trusted backend shares the error) and
the cell fails only downstream, where a Log and a Min amplify it further. The drift origin is that Conv,
the first layer that computes wrong values, with the cause `cancellation`; the fp32 cell passes."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import BIN, make_repo
from parity.analysis import cancellation
from parity.core import dtypes

L, K, C, STRIDE = 4096, 256, 8, 64


def _graph():
    """x (quiet noise) + a loud low-frequency tone -> a band-pass Conv far above the tone's band (its
    outputs ~400x below the products it sums) -> power -> Log -> its Min -> log-power minus the Min."""
    import onnx
    from onnx import TensorProto as T, helper as h, numpy_helper as nh

    t, n = np.arange(K), np.arange(L)
    w = np.stack([np.cos(2 * np.pi * (0.2 + 0.03 * c) * t) * np.hanning(K + 2)[1:-1] for c in range(C)])[:, None, :]
    w = np.where(np.abs(w) < 1e-3, np.copysign(1e-3, w), w)  # no weight fp16 cannot hold (that is `range`)
    tone = (0.5 * np.sin(2 * np.pi * 0.002 * n) + 0.3 * np.sin(2 * np.pi * 0.0051 * n + 1))[None, None]
    nodes = [h.make_node("Add", ["x", "tone"], ["audio"], name="mix"),
             h.make_node("Conv", ["audio", "w"], ["cqt"], name="cqt", strides=[STRIDE]),
             h.make_node("Mul", ["cqt", "cqt"], ["power"], name="power"),
             h.make_node("Log", ["power"], ["logp"], name="log"),
             h.make_node("ReduceMin", ["logp"], ["lowest"], name="lowest", keepdims=1),
             h.make_node("Sub", ["logp", "lowest"], ["y"], name="norm")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 1, L])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, C, (L - K) // STRIDE + 1])],
                     [nh.from_array(w.astype(np.float32), "w"), nh.from_array(tone.astype(np.float32), "tone")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(m, full_check=True)
    return m


def test_the_golden_run_measures_each_sums_condition_number():
    """kappa = rms(sum |w x|) / rms(sum w x), per Conv/MatMul/Gemm output, over the samples."""
    from numpy.lib.stride_tricks import sliding_window_view

    from parity.pipeline.onnx_fp64 import Golden
    from parity.models.onnx_source import to_float64

    m = _graph()
    golden = Golden(m, to_float64(m), conditions=True)
    x = np.random.default_rng(0).standard_normal((1, 1, L)) * 0.01
    got = golden.run({"x": x})
    kappa = golden.conditions()
    assert set(kappa) == {"cqt"}, kappa  # the Add, Mul, Log, ReduceMin and Sub sum no products
    audio = got["audio"][0, 0]
    win = sliding_window_view(audio, K)[::STRIDE]
    w = np.asarray(got["w"], np.float64)[:, 0, :]  # the run's values include the initializers
    want = np.sqrt(np.mean((np.abs(win) @ np.abs(w).T) ** 2) / np.mean((win @ w.T) ** 2))
    assert kappa["cqt"] == pytest.approx(want, rel=1e-9) and kappa["cqt"] > 100
    assert Golden(m, to_float64(m)).conditions() == {}  # off unless asked: quant_reference's runs


def test_a_backend_fault_at_a_cancelling_sum_is_not_blamed_on_the_format():
    """The origin moves only where the trusted backend computes the same wrong values: a layer wrong in
    the backend under test alone (a fault) stays where the oracle found it."""
    u, k = dtypes.FP16.u, 4.0

    def layer(name, order, rel, frel):
        return SimpleNamespace(name=name, order=order, oracle={"ref_rms": 1.0, "err_rmse": rel, "floor_rmse": frel})

    shared = [layer("conv", 0, 30 * u, 30 * u), layer("log", 1, 0.2, 0.2)]
    assert cancellation.find(shared, "log", {"conv": 200.0}, u, k)[0].name == "conv"
    fault = [layer("conv", 0, 30 * u, 0.5 * u), layer("log", 1, 0.2, 0.2)]
    assert cancellation.find(fault, "log", {"conv": 200.0}, u, k) is None
    rounding = [layer("conv", 0, 3 * u, 3 * u), layer("log", 1, 0.2, 0.2)]  # within k u: not wrong
    assert cancellation.find(rounding, "log", {"conv": 200.0}, u, k) is None
    unexplained = [layer("conv", 0, 0.2, 0.2), layer("log", 1, 0.3, 0.3)]  # beyond 2 u kappa = 0.098
    assert cancellation.find(unexplained, "log", {"conv": 100.0}, u, k) is None
    mild = [layer("conv", 0, 5 * u, 5 * u), layer("log", 1, 0.2, 0.2)]  # PP-OCR's detector: kappa <= 16
    assert cancellation.find(mild, "log", {"conv": 16.0}, u, k) is None


@pytest.fixture(scope="module")
def cancel_repo(tmp_path_factory):
    import onnx

    r = make_repo(tmp_path_factory.mktemp("cancel") / "repo", models=("cqt",), dtypes=("fp32", "fp16"),
                  providers=("ort_cpu",), compose=False)
    (r.path / "models").mkdir()
    onnx.save(_graph(), str(r.path / "models/cqt.onnx"))
    (r.path / "data/inputs").mkdir(parents=True, exist_ok=True)
    np.save(r.path / "data/inputs/quiet.npy", (np.random.default_rng(0).standard_normal((2, 1, 1, L)) * 0.01)
            .astype(np.float32))
    (r.path / "conf/models/cqt.yaml").write_text(
        "cqt:\n  arch: {source: onnx, path: models/cqt.onnx}\n  input:\n"
        f"    - {{name: x, shape: [1, 1, {L}], dtype: float32, init: file, path: data/inputs/quiet.npy}}\n"
        "  tolerances: []\n")
    r.run([f"{BIN}/parity", "compose"])
    r.commit("a cancelling Conv before a Log and a Min")
    r.repro()
    return r


def _cell(r, dtype):
    d = r.path / f"artifacts/diff/cqt-{dtype}-ort_cpu"
    return json.loads((d / "metrics.json").read_text()), json.loads((d / "layers.json").read_text())


def test_a_cancelling_conv_is_the_fp16_drift_origin_with_cause_cancellation(cancel_repo):
    m, lj = _cell(cancel_repo, "fp16")
    assert m["verdict"] == "FAIL" and m["verdict_mode"] == "oracle", m
    assert m["drift_origin"] == "cqt", m
    layers = {d["name"]: d for d in lj["layers"]}
    conv = layers["cqt"]["oracle"]
    assert conv["passed"] and conv["err_rmse"] > 4 * dtypes.FP16.u * conv["ref_rms"], conv  # wrong, in both runs
    cause = lj["drift_origin_cause"]
    assert cause["label"] == "cancellation" and cause["evidence"]["kind"] == "sum", cause
    assert cause["summary"].startswith("cancellation: output ~") and "below the magnitude of the products it sums: " \
        "fp16's relative error is amplified" in cause["summary"], cause["summary"]
    ev = cause["evidence"]
    assert ev["kappa"] > 100 and ev["rel_l2"] <= ev["explained_rel_l2"], ev
    first = ev["first_failing"]
    assert first != "cqt" and not layers[first]["passed"], ev  # the layer the oracle failed, downstream


def test_the_fp32_cell_passes_and_the_reference_records_kappa(cancel_repo):
    from parity.core import store

    m, _ = _cell(cancel_repo, "fp32")
    assert m["verdict"] == "PASS", m
    md = store.read_metadata(cancel_repo.path / "artifacts/reference/cqt/fp64.parquet")
    assert set(json.loads(md["sum_conditions"])) == {"cqt"}, md
