"""The oracle for every graph ORT runs (issue 34, item 3), on ONNX files built with onnx.helper:

- a zero-element constant (Paddle2ONNX's `p2o.helper.constant.*`), a constant subgraph and a
  zero-element slice are never layers (so never a failing layer or a drift origin);
- an `If` whose branch reads a value of the main graph that the file computes after the If's own
  input gets an fp64 golden run (the evaluator's "Unable to find input ... in known results" before);
- a node the float64 evaluator cannot run (its GlobalMaxPool on a 3-D input drops an axis; a
  com.microsoft contrib op) falls back alone, and fp64.parquet and the diff's reason name it;
- the evaluator's BatchNormalization-9 with `momentum` (as Paddle2ONNX writes it) is inference;
- where no golden run can be made, the fp32 reference is the yardstick: reduced-precision cells
  are judged by the oracle against it, fp32 cells by tolerance (by the stage functions and through
  the pipeline); a node that runs in no way is named with every way tried;
- an all-zero output is refused at reference time, as a torch model's is;
- through the pipeline: an fp16 cell of such a model is judged by the oracle (verdict_mode 'oracle'),
  not by tolerance, and its fp32 cell passes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.conftest import BIN, Repo, composed, make_repo

GOLD = "fp64.parquet"


def _f(a, name):
    from onnx import numpy_helper as nh

    return nh.from_array(np.asarray(a, np.float32), name)


def mixed_graph():
    """x [2, 4, 6] -> scaled by a constant subgraph -> Sigmoid -> Tanh -> If (its branches read `t`,
    which the file computes after the If's condition) -> flatten, Concat with a zero-element constant
    -> GlobalMaxPool on 3-D -> Squeeze -> Gemm. Also a zero-element Slice nobody reads."""
    import onnx
    from onnx import TensorProto as T, helper as h, numpy_helper as nh

    rng = np.random.default_rng(1)
    then_g = h.make_graph([h.make_node("Mul", ["t", "two"], ["then_out"])], "then", [],
                          [h.make_tensor_value_info("then_out", T.FLOAT, None)], [_f(2.0, "two")])
    else_g = h.make_graph([h.make_node("Neg", ["t"], ["else_out"])], "else", [],
                          [h.make_tensor_value_info("else_out", T.FLOAT, None)])
    ints = {n: nh.from_array(np.array(v, np.int64), n) for n, v in
            (("zero", [0]), ("two_i", [2]), ("flat", [2, 24]), ("back", [2, 4, 6]))}
    nodes = [
        h.make_node("Constant", [], ["k1"], value=_f(np.full(6, 1.5), "k1v")),
        h.make_node("Mul", ["k1", "k1"], ["k2"], name="const_mul"),
        h.make_node("Constant", [], ["p2o.helper.constant.1"], value=_f(np.zeros((2, 0)), "e")),
        h.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        h.make_node("Greater", ["s", "lo"], ["cond"]),
        h.make_node("Mul", ["x", "k2"], ["a"], name="scale"),
        h.make_node("Slice", ["a", "zero", "zero", "two_i"], ["cut"], name="empty_slice"),
        h.make_node("Sigmoid", ["a"], ["sg"]),
        h.make_node("Tanh", ["sg"], ["t"]),
        h.make_node("If", ["cond"], ["iff"], name="branch", then_branch=then_g, else_branch=else_g),
        h.make_node("Reshape", ["iff", "flat"], ["f"]),
        h.make_node("Concat", ["f", "p2o.helper.constant.1"], ["cat"], axis=1),
        h.make_node("Reshape", ["cat", "back"], ["r"]),
        h.make_node("GlobalMaxPool", ["r"], ["gmp"], name="pool"),
        h.make_node("Squeeze", ["gmp", "two_i"], ["sq"]),
        h.make_node("Gemm", ["sq", "w", "b"], ["logits"], name="fc"),
    ]
    inits = [_f(-1e9, "lo"), *ints.values(), _f(rng.standard_normal((4, 3)), "w"), _f(rng.standard_normal(3), "b")]
    g = h.make_graph(nodes, "mixed", [h.make_tensor_value_info("x", T.FLOAT, [2, 4, 6])],
                     [h.make_tensor_value_info("logits", T.FLOAT, [2, 3])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(m, full_check=True)
    return m


def _params(path: Path, shape=(2, 4, 6)) -> dict:
    return {"models": {"m": {"arch": {"source": "onnx", "path": str(path)},
                             "input": [{"name": "x", "shape": list(shape)}]}}, "dtypes": {"fp32": {}}}


def _feeds(shape=(2, 4, 6)) -> list:
    return [{"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}]


def _saved(tmp_path: Path, m, name="m.onnx") -> Path:
    import onnx

    onnx.save(m, str(tmp_path / name))
    return tmp_path / name


def _numpy_forward(x: np.ndarray, m) -> np.ndarray:
    """mixed_graph in float64 numpy, by hand."""
    from onnx import numpy_helper as nh

    init = {t.name: nh.to_array(t).astype(np.float64) for t in m.graph.initializer}
    t = np.tanh(1 / (1 + np.exp(-(x.astype(np.float64) * 2.25))))
    t = 2 * t if x.sum() > -1e9 else -t
    return t.max(axis=2) @ init["w"] + init["b"]


def test_constants_and_zero_element_values_are_never_layers(tmp_path):
    import onnx

    from parity.pipeline import onnx_reference
    from parity.models.onnx_source import instrument

    m = mixed_graph()
    layers, _, names, _ = instrument(m)
    got = [n for n, _ in names]
    assert got == ["s", "a", "sg", "t", "iff", "f", "cat", "r", "gmp", "sq", "logits"], got
    outs = {o.name for o in layers.graph.output}
    for never in ("k1", "k2", "p2o.helper.constant.1", "cut"):  # constants; a [2, 4, 0] slice of the input
        assert never not in outs
    # the file's order was topological already (the If's branch reads `t` from the main graph): kept
    assert [n.output[0] for n in layers.graph.node][:len(m.graph.node)] == [n.output[0] for n in m.graph.node]
    rows = onnx_reference.reference_rows(_params(_saved(tmp_path, m)), "m", _feeds())
    assert all(t.array.size for t in rows) and "cut" not in {t.name for t in rows}
    assert onnx.load(str(tmp_path / "m.onnx")).graph.node[2].output[0] == "p2o.helper.constant.1"


def test_topological_repair_waits_for_what_a_branch_reads():
    """A file whose If precedes the producer of the value its branches read is repaired with the
    producer first (the If's own input, `cond`, is ready long before)."""
    from parity.models.onnx_source import topo_sorted

    m = mixed_graph()
    nodes = list(m.graph.node)
    tanh = next(n for n in nodes if n.op_type == "Tanh")
    nodes.remove(tanh)
    nodes.append(tanh)  # now after the If and everything: not a topological order
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    order = [n.op_type for n in topo_sorted(m).graph.node]
    assert order.index("Tanh") < order.index("If"), order


def test_if_reading_outer_scope_and_an_unrunnable_node_get_a_golden_run(tmp_path):
    from parity.pipeline import onnx_reference

    m = mixed_graph()
    p, feeds = _params(_saved(tmp_path, m)), _feeds()
    rows = onnx_reference.reference_rows(p, "m", feeds)
    gold, why, fell = onnx_reference.golden_rows(p, "m", feeds, rows)
    assert why == "" and gold, why
    g = {t.name: t.array for t in gold}
    assert g["output"].dtype == np.float64
    assert np.allclose(g["output"], _numpy_forward(feeds[0]["x"], m), rtol=1e-6, atol=1e-6)
    # the evaluator's GlobalMaxPool gives [2, 1] for a [2, 4, 6] input: that node alone ran in float32
    assert [(r["node"], r["op"], r["ran"]) for r in fell] == [("pool", "GlobalMaxPool", "onnxruntime float32")]
    assert "shape (2, 1)" in fell[0]["why"] and "(2, 4, 1)" in fell[0]["why"], fell
    assert np.abs(g["iff"] - 2 * g["t"]).max() == 0  # the branch read `t` from the main graph, in float64


def test_contrib_op_falls_back_node_by_node(tmp_path):
    """com.microsoft FusedMatMul runs on onnxruntime, not in the evaluator: that node runs alone on
    onnxruntime, the rest in float64, and the record says which node and why."""
    from onnx import TensorProto as T, helper as h, numpy_helper as nh

    from parity.pipeline import onnx_reference

    w = nh.from_array((np.eye(4) + 0.1).astype(np.float32), "w")
    g = h.make_graph([h.make_node("Sin", ["x"], ["s"]),
                      h.make_node("FusedMatMul", ["s", "w"], ["y"], domain="com.microsoft", alpha=2.0, name="fmm"),
                      h.make_node("Relu", ["y"], ["z"])], "contrib",
                     [h.make_tensor_value_info("x", T.FLOAT, [2, 4])], [h.make_tensor_value_info("z", T.FLOAT, [2, 4])], [w])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)], ir_version=8)
    p = _params(_saved(tmp_path, m, "c.onnx"), (2, 4))
    feeds = [{"x": np.arange(8, dtype=np.float32).reshape(2, 4) - 3}]
    rows = onnx_reference.reference_rows(p, "m", feeds)
    gold, why, fell = onnx_reference.golden_rows(p, "m", feeds, rows)
    assert why == "" and [t.name for t in gold] == [t.name for t in rows], why
    assert len(fell) == 1 and fell[0]["node"] == "fmm" and fell[0]["op"] == "FusedMatMul", fell
    assert "no implementation in the ONNX reference evaluator" in fell[0]["why"], fell
    assert fell[0]["ran"] == "onnxruntime float64", fell  # onnxruntime has its float64 kernel: still exact
    want = np.maximum(2 * np.sin(feeds[0]["x"].astype(np.float64)) @ (np.eye(4) + 0.1).astype(np.float32), 0)
    out = next(t.array for t in gold if t.name == "output")
    assert np.abs(out - want).max() < 1e-12


def test_batchnorm9_with_momentum_is_inference():
    from onnx import TensorProto as T, helper as h

    from parity.pipeline.onnx_fp64 import Golden
    from parity.models.onnx_source import to_float64

    rng = np.random.default_rng(2)
    c = 3
    sc, b, mean, var = (rng.random(c) + 0.5, rng.standard_normal(c), rng.standard_normal(c), rng.random(c) + 1)
    g = h.make_graph([h.make_node("BatchNormalization", ["x", "sc", "b", "mean", "var"], ["y"], epsilon=1e-5,
                                  momentum=0.9)], "bn", [h.make_tensor_value_info("x", T.FLOAT, [2, c, 5, 5])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2, c, 5, 5])],
                     [_f(sc, "sc"), _f(b, "b"), _f(mean, "mean"), _f(var, "var")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 12)], ir_version=8)
    x = rng.standard_normal((2, c, 5, 5)) * 3 + 1
    y = Golden(m, to_float64(m)).run({"x": x})["y"]
    p32 = [np.float32(v).astype(np.float64)[None, :, None, None] for v in (sc, b, mean, var)]
    want = (x - p32[2]) / np.sqrt(p32[3] + 1e-5) * p32[0] + p32[1]
    assert np.abs(y - want).max() < 1e-12


def test_all_zero_output_is_refused_as_the_torch_path_refuses_it(tmp_path, capsys):
    from onnx import TensorProto as T, helper as h

    from parity.pipeline import onnx_reference, reference
    from parity.pipeline.tiny_output import MIN_OUTPUT_ABS

    assert reference.MIN_OUTPUT_ABS is MIN_OUTPUT_ABS  # one rule for both sources
    g = h.make_graph([h.make_node("Mul", ["x", "zero"], ["y"]), h.make_node("Relu", ["y"], ["z"])], "zeros",
                     [h.make_tensor_value_info("x", T.FLOAT, [2, 4])], [h.make_tensor_value_info("z", T.FLOAT, [2, 4])],
                     [_f(np.zeros(4), "zero")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    p = _params(_saved(tmp_path, m, "z.onnx"), (2, 4))
    out = tmp_path / "ref"
    out.mkdir()
    assert onnx_reference.reference(p, "m", _feeds((2, 4)), out) == 1
    err = capsys.readouterr().err
    assert "reference@m: model output max |value| {'output': 0.0} <= 0.001: a diff against it proves nothing" in err
    assert "z.onnx" in err and "models.m.input" in err, err
    assert not any(out.iterdir())  # nothing written


def _rule_and_dirs(tmp_path: Path, dtype: str):
    from parity.config import schema

    p = composed()
    model = next(iter(p["models"]))
    base = tmp_path / f"base-{dtype}"
    base.mkdir(exist_ok=True)
    (base / "status.json").write_text(json.dumps({"status": "OK", "provider": "ort_cpu_noopt"}))
    return schema.rule(p, model, dtype, []), base


def test_no_golden_run_at_all_makes_the_fp32_run_the_yardstick(tmp_path):
    """When no node-by-node run works, fp64.parquet holds the fp32 reference (metadata `yardstick`):
    a reduced-precision cell is judged by the oracle against it, an fp32 cell by tolerance, and both
    reasons say so."""
    from parity.pipeline.diff import verdict_mode
    from parity.core import store
    from parity.pipeline import onnx_reference

    m = mixed_graph()
    p, feeds = _params(_saved(tmp_path, m)), _feeds()
    rows = onnx_reference.reference_rows(p, "m", feeds)
    out = tmp_path / "ref"
    out.mkdir()
    why = "GoldenError: node 'pool' (GlobalMaxPool) runs in no way tried"
    line = onnx_reference.write(out, "m", rows, [], why, [])
    assert "yardstick" in line
    md = store.read_metadata(out / GOLD)
    assert md["yardstick"] == "fp32" and why in md["note"]
    gold = store.read_dict(out / GOLD)
    assert all(gold[k, n].array.dtype == np.float64 and np.array_equal(gold[k, n].array, t)
               for (k, n), t in ((k, v.array) for k, v in store.read_dict(out / "fp32.parquet").items()))
    rule16, base16 = _rule_and_dirs(tmp_path, "fp16")
    mode, reason = verdict_mode(rule16, out, base16)
    assert mode == "oracle" and "yardstick" in reason and why in reason, reason
    rule32, base32 = _rule_and_dirs(tmp_path, "fp32")
    mode, reason = verdict_mode(rule32, out, base32)
    assert mode == "tolerance" and "yardstick" in reason and "fp32 cell is judged by tolerance" in reason, reason


def unrunnable_graph():
    """tanh(x @ w + squeeze(GlobalMaxPool(c))), c a [1, 4, 6] constant: the evaluator's GlobalMaxPool
    gives [1, 1], and as a constant it is no layer, so no reference shape catches it; the Squeeze then
    runs in no way (every way gets the wrong-shaped input): no fp64 golden run can be made."""
    import onnx
    from onnx import TensorProto as T, helper as h, numpy_helper as nh

    rng = np.random.default_rng(3)
    nodes = [h.make_node("GlobalMaxPool", ["c"], ["cm"], name="const_pool"),
             h.make_node("Squeeze", ["cm", "two_i"], ["cs"], name="const_squeeze"),
             h.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
             h.make_node("Add", ["y", "cs"], ["z"], name="add"),
             h.make_node("Tanh", ["z"], ["logits"], name="tanh")]
    g = h.make_graph(nodes, "unrunnable", [h.make_tensor_value_info("x", T.FLOAT, [2, 4, 6])],
                     [h.make_tensor_value_info("logits", T.FLOAT, [2, 4, 4])],
                     [_f(rng.standard_normal((1, 4, 6)), "c"), nh.from_array(np.array([2], np.int64), "two_i"),
                      _f(rng.standard_normal((6, 4)), "w")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(m, full_check=True)
    return m


def onnx_repo(path: Path, m, dtypes=("fp32", "fp16")) -> Repo:
    import onnx

    r = make_repo(path, dtypes=dtypes, providers=("ort_cpu",), compose=False)
    (r.path / "models").mkdir()
    onnx.save(m, str(r.path / "models" / "mixed.onnx"))
    (r.path / "conf" / "models" / "mixed.yaml").write_text(
        "mixed:\n  arch: {source: onnx, path: models/mixed.onnx}\n"
        "  input:\n    - {name: x, shape: [2, 4, 6], dtype: float32, init: normal, mean: 0.0, std: 1.0}\n"
        "  tolerances: []\n")
    r.set_defaults(models=("mixed",))
    r.run([f"{BIN}/parity", "compose"])
    r.commit("onnx model")
    return r


def test_pipeline_judges_fp16_by_the_oracle_with_a_node_that_fell_back(tmp_path):
    from parity.core import store

    r = onnx_repo(tmp_path / "repo", mixed_graph())
    out = r.run(["dvc", "repro"])
    assert "'pool' (GlobalMaxPool) ran on onnxruntime float32" in out.stdout, out.stdout[-3000:]
    a = r.path / "artifacts"
    lj = json.loads((a / "models/mixed/layers.json").read_text())
    names = [x["name"] for x in lj["layers"]]
    assert not {"k1", "k2", "p2o.helper.constant.1", "cut"} & set(names), names
    md = store.read_metadata(a / "reference/mixed" / GOLD)
    assert [x["node"] for x in json.loads(md["fallback_nodes"])] == ["pool"]
    for dtype in ("fp32", "fp16"):
        d = json.loads((a / f"diff/mixed-{dtype}-ort_cpu/layers.json").read_text())
        assert d["verdict_mode"] == "oracle", d["verdict_mode_reason"]
        assert "'pool' (GlobalMaxPool) ran on onnxruntime float32" in d["verdict_mode_reason"], d["verdict_mode_reason"]
        m = json.loads((a / f"diff/mixed-{dtype}-ort_cpu/metrics.json").read_text())
        assert m["verdict"] == "PASS" and m["drift_origin"] is None, m


def test_a_plain_golden_run_keeps_the_plain_reason(tmp_path):
    """The diff reads the fp64 file's metadata by key (`yardstick`, `note`): a golden run without
    them keeps the plain reason 'diff.verdict: oracle'."""
    from parity.pipeline.diff import verdict_mode
    from parity.core import store

    ref = tmp_path / "ref"
    ref.mkdir()
    store.write(ref / GOLD, [store.Tensor(0, "output", 0, np.ones(3))], {"dtype": "float64"})
    rule, base = _rule_and_dirs(tmp_path, "fp16")
    assert verdict_mode(rule, ref, base) == ("oracle", "diff.verdict: oracle")


def test_a_node_no_way_runs_is_named(tmp_path):
    """Without the reference to check shapes against, the evaluator's wrong GlobalMaxPool output
    reaches the Squeeze, which then runs in no way: the golden run is refused naming that node and
    every way tried (the reference stage then writes the fp32 yardstick)."""
    from parity.pipeline import onnx_reference

    p, feeds = _params(_saved(tmp_path, mixed_graph())), _feeds()
    gold, why, fell = onnx_reference.golden_rows(p, "m", feeds)
    assert gold == [] and fell == []
    assert why.startswith("GoldenError: node 'sq' (Squeeze) runs in no way tried: float64 evaluator: AxisError"), why
    for how in ("onnxruntime float64", "onnxruntime float32", "evaluator float32"):
        assert how in why, why


def test_pipeline_without_a_golden_run_judges_fp16_against_the_fp32_yardstick(tmp_path):
    """No fp64 run can be made (unrunnable_graph): the fp16 cell is judged by the oracle against the
    unfused fp32 run, never by fp32's fixed tolerance; the fp32 cell by tolerance; both reasons say why."""
    from parity.core import store

    r = onnx_repo(tmp_path / "repo", unrunnable_graph())
    out = r.run(["dvc", "repro"])
    assert "as the yardstick" in out.stdout and "'const_squeeze' (Squeeze)" in out.stdout, out.stdout[-3000:]
    a = r.path / "artifacts"
    assert store.read_metadata(a / "reference/mixed" / GOLD)["yardstick"] == "fp32"
    want = {"fp16": "oracle", "fp32": "tolerance"}
    for dtype, mode in want.items():
        d = json.loads((a / f"diff/mixed-{dtype}-ort_cpu/layers.json").read_text())
        assert d["verdict_mode"] == mode and "yardstick" in d["verdict_mode_reason"], d["verdict_mode_reason"]
        assert "'const_squeeze' (Squeeze)" in d["verdict_mode_reason"], d["verdict_mode_reason"]
        m = json.loads((a / f"diff/mixed-{dtype}-ort_cpu/metrics.json").read_text())
        assert m["verdict"] == "PASS", m
