"""ort_int4 (INT4 weight-only, onnxruntime's MatMulNBits quantizer) in the real pipeline: real DVC in a
temporary git repo, a tiny pre-norm transformer block (4 weight MatMuls: qkv, out, fc1, fc2; the two
attention MatMuls of activations stay float32), real onnxruntime. The cell is judged against the fp32
reference by the int4_weight tolerance: it passes at the default, fails when the tolerance is tight
with a quantized layer as drift origin and worst layer, and a plan names the layers to keep in
float32, confirmed by a run. A bad option is refused at compose."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import yaml

from conftest import BIN, ROOT, make_repo, run

CELL = "tiny_tb-int4_weight-ort_int4"
TINY_TB = """\
tiny_tb:
  arch: {source: parity, name: transformer_block, kwargs: {d_model: 64, n_heads: 4, d_ff: 128}}
  input:
    - {name: input, shape: [2, 16, 64], dtype: float32, init: normal, mean: 0.0, std: 1.0}
  tolerances: []
"""
QUANTIZED = {"qkv", "out", "fc1", "fc2"}  # the block's Linear layers: its weight MatMuls
TIGHT = ("dtypes.int4_weight.tol.atol=0.05", "dtypes.int4_weight.tol.rtol=0.05")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    r = make_repo(tmp_path_factory.mktemp("int4") / "repo", compose=False)
    (r.path / "conf/models/tiny_tb.yaml").write_text(TINY_TB)
    r.set_defaults(models=["tiny_tb"], dtypes=["int4_weight"], providers=["ort_int4"])
    r.run([f"{BIN}/parity", "compose"])
    r.commit("tiny_tb on ort_int4")
    return r


def read(repo, rel: str) -> dict:
    return json.loads((repo.path / "artifacts" / rel).read_text())


def test_int4_cell_passes_at_the_default_and_fails_tight_naming_a_quantized_layer(repo):
    ran = repo.exp_run()
    assert f"capture@{CELL}" in ran and f"diff@{CELL}" in ran
    st = read(repo, f"capture/{CELL}/status.json")
    assert st["status"] == "OK", st
    s = st["settings"]
    assert s["quantized_matmuls"] == 4 and len(s["quantized_nodes"]) == 4, s
    assert (s["block_size"], s["accuracy_level"], s["is_symmetric"]) == (32, 4, True)
    assert "int4 weight-only" in st["own"]["reason"] and not st["own"]["measured"]
    m = read(repo, f"diff/{CELL}/metrics.json")
    assert m["verdict"] == "PASS" and m["verdict_mode"] == "tolerance", m
    assert "no trusted baseline" in m["verdict_mode_reason"]
    layers = {r["name"]: r for r in read(repo, f"diff/{CELL}/layers.json")["layers"]}
    # the quantized layers really moved (4-bit weights: several % of each output), the norm before
    # any of them did not
    assert all(layers[n]["rel_l2"] > 0.01 for n in QUANTIZED), {n: layers[n]["rel_l2"] for n in QUANTIZED}
    assert layers["ln1"]["rel_l2"] < 1e-5
    repo.exp_run(*TIGHT)
    m = read(repo, f"diff/{CELL}/metrics.json")
    assert m["verdict"] == "FAIL", m
    assert m["drift_origin"] == "qkv" and m["worst_layer"] in QUANTIZED, m


def test_plan_names_the_weight_matmuls_to_keep_and_applying_it_passes(repo):
    import onnx
    import onnxruntime as ort

    from parity.core import store
    from parity.backends import ort_int4

    repo.exp_run("analysis.plan=true", "analysis.plan_target={atol:0.05,rtol:0.05}")
    pl = read(repo, f"plan/{CELL}/plan.json")
    assert pl["status"] == "OK" and pl["outcome"] == "planned" and pl["passes"], pl.get("summary")
    assert {r["layer"] for r in pl["sensitivity"]} == QUANTIZED  # only leaves holding weight MatMuls
    assert not pl["outputs"]["full"]["passes"] and pl["outputs"]["mixed"]["passes"]
    assert 1 <= len(pl["keep"]) < len(QUANTIZED) and set(pl["keep"]) <= QUANTIZED
    keep = yaml.safe_load((repo.path / f"artifacts/plan/{CELL}/keep.yaml").read_text())
    settings = read(repo, f"capture/{CELL}/status.json")["settings"]
    assert keep["nodes_to_exclude"] and set(keep["nodes_to_exclude"]) <= set(settings["quantized_nodes"])
    # what a user does with keep.yaml: quantize model.onnx with nodes_to_exclude, run it, compare
    model = repo.path / "artifacts/models/tiny_tb/model.onnx"
    from parity.models.onnx_weights import load_with_data  # weights.bin is hard-linked by DVC: onnx.load refuses it

    q, done = ort_int4.quantize(load_with_data(model), ort_int4.DEFAULTS, keep["nodes_to_exclude"])
    assert len(done) == 4 - len(keep["nodes_to_exclude"])
    sess = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {}
    for t in store.read(repo.path / "artifacts/inputs/tiny_tb.parquet"):
        feeds.setdefault(t.sample, {})[t.name] = t.array
    refs = {t.sample: t.array for t in store.read(repo.path / "artifacts/reference/tiny_tb/fp32.parquet")
            if store.is_output(t.name)}
    for k, f in feeds.items():
        got = sess.run(None, f)[0]
        assert np.all(np.abs(got - refs[k]) <= 0.05 + 0.05 * np.abs(refs[k]))


def test_gemm_weights_are_rewritten_as_matmuls_and_quantized():
    """nn.Linear on 2-D inputs exports as Gemm, which the quantizer alone leaves float32."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from parity.backends import ort_int4

    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((8, 64)).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc", transB=1)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    assert ort_int4.weight_matmuls(m, gemm=False) == [] and ort_int4.weight_matmuls(m, gemm=True) == ["fc"]
    x = rng.standard_normal((4, 64)).astype(np.float32)
    q, done = ort_int4.quantize(onnx.ModelProto.FromString(m.SerializeToString()), ort_int4.DEFAULTS)
    assert done == ["fc"] and [n.op_type for n in q.graph.node] == ["MatMulNBits", "Add"]
    got = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    want = x @ w.T + b
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert 1e-4 < rel < 0.2, rel  # quantized (not the fp32 Gemm), and int4-close
    q, done = ort_int4.quantize(onnx.ModelProto.FromString(m.SerializeToString()), ort_int4.DEFAULTS, ["fc"])
    assert done == [] and [n.op_type for n in q.graph.node] == ["Gemm"]  # excluded: left as exported


@pytest.mark.parametrize("override, expected", [
    ("providers.ort_int4.options.block_size=48", ["providers.ort_int4.options.block_size", "48",
                                                  "16, 32, 64, 128, 256"]),
    ("providers.ort_int4.options.accuracy_level=5", ["providers.ort_int4.options.accuracy_level", "0, 1, 2, 3, 4"]),
    ("+providers.ort_int4.options.bits=3", ["unknown option 'bits'", "block_size", "accuracy_level"]),
])
def test_a_bad_int4_option_is_refused_at_compose_in_one_line(tmp_path, override, expected):
    for name in ("conf", "hydra_plugins"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "params.yaml", tmp_path / "params.yaml")
    before = (tmp_path / "params.yaml").read_bytes()
    p = run(["parity", "compose", "-S", "providers=[ort_int4]", "-S", "dtypes=[int4_weight]", "-S", override],
            tmp_path, check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode != 0 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert all(e in lines[0] for e in expected), lines[0]
    assert (tmp_path / "params.yaml").read_bytes() == before


TINY_LLAMA = """\
tiny_llama_int4:
  arch: {source: hf, name: llama, kwargs: {hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2,
         num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 1000}}
  input:
    - {name: input_ids, shape: [1, 16], dtype: int64, init: tokens}
  tolerances: []
"""


@pytest.mark.slow
def test_tiny_llama_int4_gets_a_verdict_and_a_confirmed_plan(tmp_path):
    """The Llama shape (q/k/v/o/gate/up/down per layer, 2 layers): 14 weight MatMuls quantized; PASS
    at the default tolerance; a plan at a tighter target keeps some projections in float32."""
    cell = "tiny_llama_int4-int4_weight-ort_int4"
    r = make_repo(tmp_path / "repo", compose=False)
    (r.path / "conf/models/tiny_llama_int4.yaml").write_text(TINY_LLAMA)
    r.set_defaults(models=["tiny_llama_int4"], dtypes=["int4_weight"], providers=["ort_int4"])
    r.run([f"{BIN}/parity", "compose"])
    r.commit("tiny llama on ort_int4")
    r.exp_run("analysis.plan=true", "analysis.plan_target={atol:0.2,rtol:0.2}")
    st = read(r, f"capture/{cell}/status.json")
    assert st["status"] == "OK" and st["settings"]["quantized_matmuls"] == 14, st
    assert read(r, f"diff/{cell}/metrics.json")["verdict"] == "PASS"
    pl = read(r, f"plan/{cell}/plan.json")
    assert pl["candidates"] == 14 and pl["outcome"] == "planned" and pl["passes"], pl.get("summary")
    assert all(k.endswith(("_proj",)) for k in pl["keep"]), pl["keep"]


def test_a_mixed_model_assembled_from_one_quantization_equals_quantizing_with_exclusions():
    """The plan's mixed models reuse one full quantization (ort_int4.assemble): same graph numbers as
    the quantizer run with nodes_to_exclude, for every exclusion set."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from parity.backends import ort_int4

    rng = np.random.default_rng(1)
    w1, b1 = rng.standard_normal((32, 64)).astype(np.float32), rng.standard_normal(32).astype(np.float32)
    w2 = rng.standard_normal((32, 16)).astype(np.float32)
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", transB=1),
                           helper.make_node("Relu", ["h"], ["r"], name="act"),
                           helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
                          [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)

    def copy():
        return onnx.ModelProto.FromString(m.SerializeToString())

    def run(model):
        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]

    x = rng.standard_normal((4, 64)).astype(np.float32)
    full, _ = ort_int4.quantize(copy(), ort_int4.DEFAULTS)
    for exclude in ([], ["fc1"], ["fc2"], ["fc1", "fc2"]):
        want, _ = ort_int4.quantize(copy(), ort_int4.DEFAULTS, exclude)
        got = ort_int4.assemble(copy(), full, ort_int4.DEFAULTS, exclude)
        assert sorted(n.op_type for n in got.graph.node) == sorted(n.op_type for n in want.graph.node), exclude
        assert sorted(t.name for t in got.graph.initializer) == sorted(t.name for t in want.graph.initializer)
        np.testing.assert_array_equal(run(got), run(want))
