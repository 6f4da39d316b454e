"""The quantised oracle of int8_static (issue 35 item 3): parity's own static QDQ quantisation
(parity.models.quant_static: its own placement, MinMax calibration, scales and zero points) against
onnxruntime's quantize_static, on small synthetic graphs with real onnxruntime. Parity places Q/DQ on
the same tensors with byte-equal parameters and integers; the simulated graph in float64 is what
onnxruntime's QDQ graph computes, to fp32 rounding, while the fp32 model is percents away; a provider
whose weight or calibration differs is told apart; what parity cannot reproduce is said, not judged."""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.calibrate import CalibrationDataReader

from parity.models import quant_static
from parity.pipeline import onnx_fp64, quant_reference
from parity.models.onnx_source import to_float64

K, H, N = 32, 48, 16


def _graph(extra: list | None = None) -> onnx.ModelProto:
    """x (2, 8, K) and ids (2, 8): a weight MatMul + bias Add, Relu, a Gemm with bias (transB) on the
    flattened activations, Reshape back, Softmax, Sigmoid x the MatMul's output, a Transpose, an
    embedding Gather added, a LayerNormalization and a Concat, a second LayerNormalization sharing the
    first one's scale and bias (onnxruntime copies the int32 bias: its scale is per node); every named
    value a graph output."""
    rng = np.random.default_rng(0)
    w = {"w1": rng.standard_normal((K, H)) * 0.2, "b1": rng.standard_normal(H) * 0.1,
         "w2": rng.standard_normal((H, H)) * 0.2, "b2": rng.standard_normal(H) * 0.1,
         "emb": rng.standard_normal((50, H)), "g": 1 + rng.standard_normal(H) * 0.1, "beta": rng.standard_normal(H) * 0.1}
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["mm"], name="fc1"), helper.make_node("Add", ["mm", "b1"], ["fc1"], name="fc1_bias"),
        helper.make_node("Relu", ["fc1"], ["act"], name="act"),
        helper.make_node("Reshape", ["act", "shape2d"], ["flat"], name="flat"),
        helper.make_node("Gemm", ["flat", "w2", "b2"], ["fc2_2d"], name="fc2", transB=1),
        helper.make_node("Reshape", ["fc2_2d", "shape3d"], ["fc2"], name="unflat"),
        helper.make_node("Softmax", ["fc2"], ["soft"], name="soft", axis=-1),
        helper.make_node("Sigmoid", ["fc1"], ["sig"], name="sig"),
        helper.make_node("Mul", ["sig", "soft"], ["gate"], name="gate"),
        helper.make_node("Gather", ["emb", "ids"], ["tok"], name="tok"),
        helper.make_node("Add", ["gate", "tok"], ["mix"], name="mix"),
        helper.make_node("LayerNormalization", ["mix", "g", "beta"], ["norm"], name="norm", axis=-1),
        helper.make_node("Transpose", ["norm"], ["tr"], name="tr", perm=[0, 2, 1]),
        helper.make_node("Transpose", ["tr"], ["back"], name="back", perm=[0, 2, 1]),
        helper.make_node("Concat", ["back", "fc1"], ["cat"], name="cat", axis=-1),
        helper.make_node("LayerNormalization", ["fc2", "g", "beta"], ["norm2"], name="norm2", axis=-1),
    ] + (extra or [])
    outs = ["fc1", "act", "fc2", "soft", "sig", "gate", "tok", "mix", "norm", "cat", "norm2"] + [n.output[0] for n in extra or []]
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in w.items()]
    inits[2] = numpy_helper.from_array(np.asarray(w["w2"].T, np.float32), "w2")  # transB: (N_out, K_in)
    inits += [numpy_helper.from_array(np.array([-1, H], np.int64), "shape2d"),
              numpy_helper.from_array(np.array([2, 8, H], np.int64), "shape3d")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, K]),
                                      helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 8])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def _feeds(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((2, 8, K)).astype(np.float32),
             "ids": rng.integers(0, 50, (2, 8)).astype(np.int64)} for _ in range(n)]


def _ort_static(m, feeds, opts) -> onnx.ModelProto:
    """onnxruntime's quantize_static of `m` (the provider's quantiser) with the cell's settings."""
    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    with tempfile.TemporaryDirectory() as d:
        onnx.save(m, f"{d}/in.onnx")
        quantize_static(f"{d}/in.onnx", f"{d}/q.onnx", Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=getattr(QuantType, opts["activation_type"]),
                        weight_type=getattr(QuantType, opts["weight_type"]), calibrate_method=CalibrationMethod.MinMax,
                        per_channel=opts["per_channel"], reduce_range=opts["reduce_range"])
        return onnx.load(f"{d}/q.onnx")


def _read(t):
    return numpy_helper.to_array(t)


def _opts(per_channel=False, reduce_range=False, act="QInt8", weight="QInt8") -> dict:
    return {"per_channel": per_channel, "reduce_range": reduce_range, "activation_type": act, "weight_type": weight,
            "calibrate_method": "MinMax"}


@pytest.mark.parametrize("opts", [_opts(), _opts(per_channel=True), _opts(reduce_range=True),
                                  _opts(act="QUInt8"), _opts(act="QUInt8", weight="QUInt8")],
                         ids=["s8s8", "per_channel", "reduce_range", "u8s8", "u8u8"])
def test_parity_quantises_as_quantize_static_does(opts):
    """Same tensors quantised, every scale, zero point and integer (weights, the Gemm's int32 bias,
    the embedding table, the LayerNorm's scale and bias) equal, calibrated on the same feeds."""
    m, cal = _graph(), _feeds(3, 1)
    par = quant_static.params(m, cal, opts, _read)
    res = quant_static.compare(par, quant_static.provider_params(_ort_static(m, cal, opts)))
    assert res["placement"] == {"parity_only": [], "provider_only": []}, res["placement"]
    assert {"w1", "w2", "b2", "emb", "g", "beta", "beta0"} <= set(res["initializers"]), sorted(res["initializers"])
    assert all(not any(r.values()) for r in res["initializers"].values()), res["initializers"]
    assert res["activations"]["compared"] >= 15 and res["activations"]["differ"] == [], res["activations"]


def _run(m, feeds, opt=True) -> dict:
    so = ort.SessionOptions()
    if not opt:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(None, feeds)))


def _rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def test_the_simulated_graph_in_float64_is_what_onnxruntime_computes():
    """onnxruntime's QDQ graph (optimised: its QLinear kernels) matches parity's simulated graph in
    float64 to float32 rounding at every layer; the float32 model is >= 0.1% away (the quantisation's
    cost, which the oracle keeps out of the verdict)."""
    m, cal, x = _graph(), _feeds(3, 1), _feeds(1, 7)[0]
    opts = _opts()
    par, q = quant_static.params(m, cal, opts, _read), _ort_static(m, cal, opts)
    got, fp32 = _run(q, x), _run(m, x, opt=False)

    def gold(fused):
        sim = quant_static.simulated(m, {**par, "fused_softmax": fused}, _read)
        return onnx_fp64.Golden(sim, to_float64(sim)).run({k: (v.astype(np.float64) if v.dtype.kind == "f" else v)
                                                           for k, v in x.items()})
    assert quant_static.fused_softmax(q) == {"soft"} and quant_static.fused_softmax(q, "disabled") == set()
    exact = gold({"soft"})
    for name in ("fc1", "fc2", "soft", "gate", "tok", "norm", "cat", "norm2"):
        assert _rel(got[name], exact[name]) < 1e-6, (name, _rel(got[name], exact[name]))
        assert _rel(fp32[name], exact[name]) > 1e-3, (name, _rel(fp32[name], exact[name]))
    # QLinearSoftmax's integer scale floor(1 / y_scale) = 254, not 255: unsimulated, its outputs are ~1% off
    assert _rel(got["soft"], gold(set())["soft"]) > 5e-3


def test_a_provider_whose_weight_or_calibration_differs_is_told_apart():
    """fc1's weight x1.1 before quantize_static: its weight's scale differs from parity's, and so do
    the calibrated activations from fc1 on (the first named is fc1's output); fc1's output is 10% off
    the oracle, far above the slack of 0.5%."""
    m, cal, x = _graph(), _feeds(3, 1), _feeds(1, 7)[0]
    opts = _opts()
    bad = onnx.ModelProto()
    bad.CopyFrom(m)
    w1 = next(t for t in bad.graph.initializer if t.name == "w1")
    w1.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w1) * np.float32(1.1), "w1"))
    par = quant_static.params(m, cal, opts, _read)
    q = _ort_static(bad, cal, opts)
    res = quant_static.compare(par, quant_static.provider_params(q))
    assert res["initializers"]["w1"]["scales"] == 1.0 and res["initializers"]["w1"]["packed"] == 0.0
    assert res["initializers"]["emb"] == {"scales": 0.0, "zero_points": 0.0, "packed": 0.0}
    assert res["activations"]["differ"][0] in ("mm", "fc1"), res["activations"]["differ"]
    sim = quant_static.simulated(m, par, _read)
    gold = onnx_fp64.Golden(sim, to_float64(sim)).run({k: (v.astype(np.float64) if v.dtype.kind == "f" else v)
                                                       for k, v in x.items()})
    assert _rel(_run(q, x)["fc1"], gold["fc1"]) > 0.05


def test_what_parity_cannot_reproduce_is_named_and_judged_by_tolerance():
    """A Pad (onnxruntime's placement depends on its mode and constant) is named as unsupported; a
    calibration other than MinMax is refused before any work, naming the option."""
    pad = helper.make_node("Pad", ["cat", "pads"], ["padded"], name="pad_node")
    m = _graph([pad])
    m.graph.initializer.append(numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 1], np.int64), "pads"))
    assert quant_static.params(m, _feeds(2, 1), _opts(), _read)["unsupported"] == ["pad_node"]
    job = SimpleNamespace(calibration=None, model_dir=Path("."))
    with pytest.raises(ValueError, match="calibrate_method Entropy: parity calibrates MinMax only"):
        quant_reference.static_params(job, m, {**_opts(), "calibrate_method": "Entropy"})
    with pytest.raises(ValueError, match="no calibration samples"):
        quant_reference.static_params(job, m, _opts())
