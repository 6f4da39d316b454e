"""The quantised oracle (issue 35 item 3): parity's own int4 / int8 quantisation (parity.models.quant_sim)
against onnxruntime's, on small synthetic graphs with real onnxruntime. Parity's packing is byte for
byte onnxruntime's MatMulNBits initializers; the simulated graph (dequantised weights, activations
quantised per the scheme) run in float64 is what the provider computes, to fp32 rounding, while the
fp32 weights are 5-10% away; and a provider whose weights or kernel differ is told apart."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from parity.models import onnx_int4, quant_sim
from parity.pipeline import onnx_fp64
from parity.models.onnx_source import to_float64


def _mlp(k: int = 96, h: int = 80, n: int = 48, seed: int = 0) -> onnx.ModelProto:
    """x (2, 8, k) -> MatMul w1 -> Relu -> MatMul w2: two weight MatMuls, both graph outputs."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((k, h)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((h, n)) * 0.1).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["fc1"], name="fc1"), helper.make_node("Relu", ["fc1"], ["act"], name="act"),
         helper.make_node("MatMul", ["act", "w2"], ["fc2"], name="fc2")], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, k])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("fc1", "act", "fc2")],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def _x(k: int = 96, seed: int = 1) -> dict:
    return {"x": np.random.default_rng(seed).standard_normal((2, 8, k)).astype(np.float32)}


def _run(m, feeds, opt=True) -> dict:
    so = ort.SessionOptions()
    if not opt:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(None, feeds)))


def _fp64(sim, feeds) -> dict:
    out = onnx_fp64.Golden(sim, to_float64(sim)).run({k: v.astype(np.float64) for k, v in feeds.items()})
    return {o.name: out[o.name] for o in sim.graph.output}


def _rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def _int4(sym: bool, bs: int, acc: int) -> dict:
    return {"block_size": bs, "is_symmetric": sym, "accuracy_level": acc, "gemm_to_matmul": True}


@pytest.mark.parametrize("sym, bs", [(True, 32), (False, 32), (True, 64), (False, 16)])
def test_parity_packs_int4_weights_as_onnxruntime_does(sym, bs):
    """K = 96 or 80 with blocks of 64: the last block padded, as the quantizer pads it."""
    m = _mlp()
    q, _ = onnx_int4.quantize(onnx.ModelProto.FromString(m.SerializeToString()), ".", None, _int4(sym, bs, 4))
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    for w in ("w1", "w2"):
        mine = quant_sim.int4_packed(numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == w)), bs, sym)
        assert mine["packed"].tobytes() == inits[f"{w}_Q4"].tobytes()
        assert mine["scales"].tobytes() == inits[f"{w}_scales"].tobytes()
        if not sym:
            assert mine["zero_points"].tobytes() == inits[f"{w}_zero_points"].tobytes()
        assert sym == ("zero_points" not in mine)


@pytest.mark.parametrize("sym", [True, False])
def test_a_value_on_a_rounding_tie_packs_as_onnxruntime_packs_it(sym):
    """A weight whose scaled value is exactly x.5 (8.5 in a block whose scale is 1): onnxruntime rounds
    ties away from zero (9); numpy's round gave 8, and the report then said an unfaulted model's packed
    weights differ from parity's (seen on transformer_block's fc1)."""
    m = _mlp()
    w1 = numpy_helper.to_array(m.graph.initializer[0]).copy()
    w1[:32, 0] = np.linspace(-0.5, 0.5, 32, dtype=np.float32)
    w1[0, 0], w1[1, 0], w1[2, 0], w1[3, 0] = -8.0, 0.5, 1.5, 7.0  # scale 1 (sym) / 1 (asym: 15 / 15)
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(w1, "w1"))
    q, _ = onnx_int4.quantize(onnx.ModelProto.FromString(m.SerializeToString()), ".", None, _int4(sym, 32, 4))
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    mine = quant_sim.int4_packed(w1, 32, sym)
    assert mine["packed"].tobytes() == inits["w1_Q4"].tobytes()
    assert mine["scales"].tobytes() == inits["w1_scales"].tobytes()


@pytest.mark.parametrize("acc", [0, 4])
def test_the_int4_oracle_is_what_matmulnbits_computes_and_the_fp32_model_is_not(acc):
    """accuracy_level 4 quantises the activations per block to int8: the simulation does too; at 0 it
    does not. The provider is within fp32 rounding of the float64 oracle, the fp32 model 5-10% away."""
    m, feeds = _mlp(), _x()
    opts = _int4(True, 32, acc)
    q, _ = onnx_int4.quantize(onnx.ModelProto.FromString(m.SerializeToString()), ".", None, opts)
    got = _run(q, feeds)
    gold = _fp64(quant_sim.simulated(m, "int4", opts, ".", ["fc1", "fc2"]), feeds)
    fp32 = _run(m, feeds, opt=False)
    for n in ("fc1", "fc2"):
        assert _rel(got[n], gold[n]) < 2e-6, (n, _rel(got[n], gold[n]))
        assert 0.02 < _rel(fp32[n], gold[n]) < 0.3
    if acc == 4:  # without the activations' quantisation the oracle would be 5e-3 off: modelled, not a floor
        exact = _fp64(quant_sim.simulated(m, "int4", _int4(True, 32, 0), ".", ["fc1", "fc2"]), feeds)
        assert _rel(got["fc1"], exact["fc1"]) > 1e-3


def test_a_scaled_weight_a_wrong_scale_and_a_swapped_nibble_are_told_apart_from_the_oracle():
    """What a faulty provider does, against the oracle of the unfaulted weights: x1.02 on fc1's weight
    moves fc1 by 2% (~1e4 x the fp32 rounding the provider shows otherwise); one block's scale x1.5 and
    one byte's nibbles swapped in the packed weight move fc2 far beyond fp32 rounding too."""
    m, feeds = _mlp(), _x()
    opts = _int4(True, 32, 4)
    gold = _fp64(quant_sim.simulated(m, "int4", opts, ".", ["fc1", "fc2"]), feeds)
    faulty = onnx.ModelProto.FromString(m.SerializeToString())
    w1 = next(t for t in faulty.graph.initializer if t.name == "w1")
    w1.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w1) * np.float32(1.02), "w1"))
    q, _ = onnx_int4.quantize(faulty, ".", None, opts)
    assert _rel(_run(q, feeds)["fc1"], gold["fc1"]) > 5e-3
    for change in ("scale", "nibble"):
        q, _ = onnx_int4.quantize(onnx.ModelProto.FromString(m.SerializeToString()), ".", None, opts)
        t = next(t for t in q.graph.initializer if t.name == ("w2_scales" if change == "scale" else "w2_Q4"))
        a = numpy_helper.to_array(t).copy()
        if change == "scale":
            a[0, 0] *= np.float32(1.5)
        else:
            a.reshape(-1)[0] = ((a.reshape(-1)[0] & 0xF) << 4) | (a.reshape(-1)[0] >> 4)
        t.CopyFrom(numpy_helper.from_array(a, t.name))
        got = _run(q, feeds)
        assert _rel(got["fc1"], gold["fc1"]) < 2e-6  # fc1 untouched
        assert _rel(got["fc2"], gold["fc2"]) > 1e-4, change


@pytest.mark.parametrize("per_channel", [False, True])
def test_the_int8_dynamic_oracle_is_what_quantize_dynamic_computes(per_channel):
    """quantize_dynamic (MatMulInteger, activations uint8 per tensor; 7-bit weights, reduce_range, so
    no CPU's u8 x s8 kernel saturates) against the float64 simulation: fp32 rounding apart."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    m, feeds = _mlp(), _x()
    with tempfile.TemporaryDirectory() as d:
        onnx.save(m, str(Path(d) / "in.onnx"))
        quantize_dynamic(str(Path(d) / "in.onnx"), str(Path(d) / "q.onnx"), per_channel=per_channel,
                         reduce_range=True, weight_type=QuantType.QInt8)
        q = onnx.load(str(Path(d) / "q.onnx"))
    assert sum(n.op_type == "MatMulInteger" for n in q.graph.node) == 2
    got = _run(q, feeds)
    opts = {"per_channel": per_channel, "reduce_range": True, "weight_type": "QInt8"}
    gold = _fp64(quant_sim.simulated(m, "int8_dynamic", opts, ".", ["fc1", "fc2"]), feeds)
    fp32 = _run(m, feeds, opt=False)
    for n in ("fc1", "fc2"):
        assert _rel(got[n], gold[n]) < 1e-5, (n, _rel(got[n], gold[n]))
        assert _rel(fp32[n], gold[n]) > 1e-3


def test_an_oracle_that_cannot_be_computed_writes_nothing_and_says_why(tmp_path):
    """A model directory without layers.onnx: the capture's line says why, no oracle file is left, so
    the diff judges the cell by tolerance."""
    from parity.backends.runner import CaptureJob
    from parity.pipeline import quant_reference

    (tmp_path / "model").mkdir()
    out = tmp_path / "capture"
    out.mkdir()
    (out / quant_reference.GOLD).write_bytes(b"stale")
    job = CaptureJob(model="m", model_cfg={}, dtype="int4_weight", dtype_cfg={"mode": "int4_weight", "torch": "float32"},
                     provider="ort_int4", provider_cfg={"options": {}}, model_dir=tmp_path / "model", seed=0, threads=1)
    lines = quant_reference.write(job, [], out, None, {})
    assert len(lines) == 1 and "no quantised oracle" in lines[0] and "layers.onnx" in lines[0], lines
    assert not any((out / f).exists() for f in (quant_reference.GOLD, quant_reference.FLOOR, quant_reference.INFO))
    assert quant_reference.write(CaptureJob(model="m", model_cfg={}, dtype="fp16", dtype_cfg={"torch": "float16"},
                                            provider="ort_cpu", provider_cfg={}, model_dir=tmp_path, seed=0, threads=1),
                                 [], out, None, {}) == []  # not a quantised cell: nothing to say


def test_the_int8_dynamic_oracle_quantises_a_gemm_as_quantize_dynamic_does():
    """nn.Linear on 2-D inputs exports as Gemm (transB, a bias); quantize_dynamic makes it MatMulInteger +
    Add: the oracle takes the same weights (quant_reference.quantised_nodes) and matches it."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from parity.pipeline import quant_reference

    rng = np.random.default_rng(0)
    w, b = (rng.standard_normal((48, 64)) * 0.1).astype(np.float32), rng.standard_normal(48).astype(np.float32)
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["fc"], name="fc", transB=1)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 64])],
                          [helper.make_tensor_value_info("fc", TensorProto.FLOAT, [16, 48])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    feeds = {"x": rng.standard_normal((16, 64)).astype(np.float32)}
    with tempfile.TemporaryDirectory() as d:
        onnx.save(m, str(Path(d) / "in.onnx"))
        quantize_dynamic(str(Path(d) / "in.onnx"), str(Path(d) / "q.onnx"), reduce_range=True, weight_type=QuantType.QInt8)
        got = _run(onnx.load(str(Path(d) / "q.onnx")), feeds)["fc"]
    opts = {"per_channel": False, "reduce_range": True, "weight_type": "QInt8"}
    nodes = quant_reference.quantised_nodes(m, "int8_dynamic", opts)
    assert nodes == ["fc"]
    gold = _fp64(quant_sim.simulated(m, "int8_dynamic", opts, ".", nodes), feeds)["fc"]
    assert _rel(got, gold) < 1e-5 and _rel(feeds["x"] @ w.T + b, gold) > 1e-3


def test_a_weight_scaled_in_the_checkpoint_keeps_its_scale_label():
    """fc1's weight x1.1 written into the exported graph (a checkpoint whose weight was edited): the
    reference (the unedited model's fp64 run) is then a pure scale of the graph at fc1 and after it,
    and the oracle scales the quantised run back (quant_reference._correction: c = 1/1.1), so the int4
    provider's fc1 is 1.1 x the oracle up to its kernel's rounding: cause `scale`. The additive
    correction alone (oracle = quantised - graph + reference) leaves the quantisation's own error
    scaled by 0.1 in the difference: `unknown` at the verdict's limit (what tiny_llama's up_proj x1.1
    under int4 was labelled)."""
    from types import SimpleNamespace

    from parity.analysis import causes
    from parity.pipeline import quant_reference as qr

    m, feeds = _mlp(), [_x(seed=1), _x(seed=2)]
    ref = onnx_fp64.Golden(m, to_float64(m))
    ref64 = {(k, o.name): SimpleNamespace(array=np.asarray(v[o.name])) for k, f in enumerate(feeds)
             for v in [ref.run({n: a.astype(np.float64) for n, a in f.items()})] for o in m.graph.output}
    bad = onnx.ModelProto.FromString(m.SerializeToString())
    w1 = next(t for t in bad.graph.initializer if t.name == "w1")
    w1.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w1) * np.float32(1.1), "w1"))
    opts = _int4(True, 128, 4)
    sim = quant_sim.simulated(bad, "int4", opts, ".", qr.quantised_nodes(bad, "int4", opts))
    gold, _, graph = qr._runs(bad, sim, feeds, ref64)
    shift, dev = qr._correction(graph, ref64)
    assert abs(shift[0]["fc1"][0] - 1 / 1.1) < 1e-6 and dev["rel_l2"] > 0.09
    q, _ = onnx_int4.quantize(onnx.ModelProto.FromString(bad.SerializeToString()), ".", None, opts)
    act = _run(q, feeds[0])["fc1"]
    fixed = causes.classify(act, qr._corrected(gold[0]["fc1"], shift[0]["fc1"]), "int4_weight", name="fc1",
                            failed=True, limit=1e-3)
    assert fixed.label == "scale" and abs(fixed.evidence["s"] - 1.1) < 1e-4, fixed.summary
    additive = gold[0]["fc1"] - graph[0]["fc1"] + ref64[(0, "fc1")].array
    assert causes.classify(act, additive, "int4_weight", name="fc1", failed=True, limit=1e-3).label == "unknown"


def test_an_unedited_export_keeps_the_additive_correction():
    """The graph as exported (fp64 export noise, no scale): c = 1 at every layer, the oracle is the
    quantised run corrected by the difference only."""
    from types import SimpleNamespace

    from parity.pipeline import quant_reference as qr

    m, feeds = _mlp(), [_x(seed=1)]
    ref = onnx_fp64.Golden(m, to_float64(m)).run({n: a.astype(np.float64) for n, a in feeds[0].items()})
    ref64 = {(0, o.name): SimpleNamespace(array=np.asarray(ref[o.name]) * (1 + 1e-9)) for o in m.graph.output}
    sim = quant_sim.simulated(m, "int4", _int4(True, 32, 4), ".", qr.quantised_nodes(m, "int4", _int4(True, 32, 4)))
    _, _, graph = qr._runs(m, sim, feeds, ref64)
    shift, _ = qr._correction(graph, ref64)
    assert all(c == 1.0 for c, _ in shift[0].values()), {n: c for n, (c, _) in shift[0].items()}


def test_a_quantised_head_is_named_by_its_module_not_only_output():
    """The packed-weight list named a decoder's lm_head `output` (the MatMul writes the model's output):
    a model output is now followed by the module whose weight it is (the node's name_scopes)."""
    from parity.pipeline.quant_reference import _layer_of

    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="up"),
             helper.make_node("MatMul", ["h", "w"], ["output"], name="head")]
    onnx.helper.set_metadata_props(nodes[1], {"pkg.torch.onnx.name_scopes": "['', 'model', 'model.lm_head']"})
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in ("x", "h", "output")]
    m = helper.make_model(helper.make_graph(nodes, "g", [vi[0]], vi[1:], [w]))
    assert _layer_of(m, ["up", "head"]) == {"up": "h", "head": "output (lm_head)"}
