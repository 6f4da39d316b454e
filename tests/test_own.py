"""Each layer's own error: every leaf run on the fp64 reference's input to it (torch: pre-hooks; ONNX: one
cut graph fed from the reference), and the ops between leaves run on the reference's leaf outputs.

The point: a fault is charged to the layer (or the between-leaf ops) that introduces it, not to every
layer downstream of it, which accumulated error blames too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper
from torch import nn

from parity.core import store
from parity.backends.capture_driver import run_capture
from parity.backends.runner import CaptureJob
from parity.backends.ort_cpu import OrtCpuRunner
from parity.backends.torch_compile import TorchCompileRunner
from parity.backends.torch_cpu import TorchCpuRunner
from parity.pipeline.layer_export import export_layers, layer_regions, prune_outputs, strip_paths
from parity.models import build, onnx_cut
from parity.models.layers import LayerRecorder
from conftest import BIN, make_repo

NOISE = 1e-5  # fp32 own error vs fp64: measured 1e-7 .. 7e-7 on these models and resnet18


class TinyRes(nn.Module):
    """conv -> bn -> relu -> conv -> bn, + residual, relu (the same ReLU module twice: relu#1), pool, fc."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 4)
        for bn in (self.bn1, self.bn2):  # non-trivial running stats (seeded by build)
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(x)) + x)
        return self.fc(torch.flatten(self.pool(y), 1))


MODELS = {
    "mlp": ({"source": "parity", "name": "mlp", "kwargs": {"in_features": 16, "hidden": 32, "out_features": 8}},
            (4, 16)),
    "block": ({"source": "parity", "name": "transformer_block", "kwargs": {"d_model": 32, "n_heads": 4, "d_ff": 64}},
              (2, 8, 32)),
    "res": ({"source": "import", "name": "test_own:TinyRes"}, (1, 3, 12, 12)),
}


def rel_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


class Case:
    """One model: its input, fp64 reference (leaf outputs + pre: inputs) and exported graphs."""

    def __init__(self, key: str, tmp: Path):
        self.arch, shape = MODELS[key]
        self.x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        rec = LayerRecorder(build(self.arch, 0).double(), inputs=True)
        with torch.no_grad():
            outs = rec(torch.from_numpy(self.x).double())
        self.ref = {n: v.numpy() for n, v in zip(rec.names, outs)}
        self.dir = tmp / key
        self.dir.mkdir()
        export_layers(build(self.arch, 0), (torch.from_numpy(self.x),), ["input"], self.dir / "layers.onnx",
                      "dynamo", 18)
        full = strip_paths(onnx.load(str(self.dir / "layers.onnx")))
        onnx.save(full, str(self.dir / "layers.onnx"))
        onnx.save(prune_outputs(full, [o.name for o in full.graph.output if store.is_output(o.name)]),
                  str(self.dir / "model.onnx"))

    def graph(self) -> onnx.ModelProto:
        return onnx.load(str(self.dir / "layers.onnx"))

    def job(self, provider: str = "ort_cpu", model_dir: Path | None = None) -> CaptureJob:
        return CaptureJob(model="m", model_cfg={"arch": self.arch, "input": [{"name": "input"}]}, dtype="fp32",
                          dtype_cfg={"torch": "float32"}, provider=provider, provider_cfg={},
                          model_dir=model_dir or self.dir)

    def run(self, cls, model_dir: Path | None = None):
        """(accumulated per-layer values, own values) of one runner on this case."""
        r = cls(self.job(model_dir=model_dir))
        r.activate()
        try:
            return dict(r.infer({"input": self.x})), r.infer_own({"input": self.x}, self.ref), r.own_skipped()
        finally:
            r.deactivate()

    def own_errors(self, own) -> dict[str, float]:
        return {n: rel_l2(v, self.ref[store.own_reference_name(n)]) for n, v in own}


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("own")
    return {k: Case(k, tmp) for k in MODELS}


def leaf_calls(case) -> list[str]:
    return [n for n in case.ref if not store.is_output(n) and not store.is_pre(n)]


@pytest.mark.parametrize("key", list(MODELS))
@pytest.mark.parametrize("runner", [TorchCpuRunner, OrtCpuRunner], ids=["torch_cpu", "ort_cpu"])
def test_every_leaf_and_between_value_is_at_fp32_noise(cases, key, runner):
    case = cases[key]
    acc, own, skipped = case.run(runner)
    assert skipped == []
    names = [n for n, _ in own]
    calls = leaf_calls(case)
    # one own value per leaf call and one between-leaf value per leaf input, named as LayerRecorder names them
    assert [n for n in names if not n.startswith(store.BETWEEN)] == calls
    assert {n.removeprefix(store.BETWEEN) for n in names if n.startswith(store.BETWEEN)} == \
        {n.removeprefix(store.PRE) for n in case.ref if store.is_pre(n)} | {"output"}
    errs = case.own_errors(own)
    assert max(errs.values()) < NOISE, {n: e for n, e in errs.items() if e >= NOISE}
    # the own values are the leaves' outputs computed from the reference input: not the accumulated ones
    assert any(not np.array_equal(dict(own)[n], acc[n]) for n in calls)


@pytest.mark.parametrize("runner", [TorchCpuRunner, OrtCpuRunner], ids=["torch_cpu", "ort_cpu"])
def test_fp16_own_values_are_within_fp16_rounding(cases, runner):
    """fp16 (torch cast; ORT's float16 conversion of the cut graph, fp32 I/O kept): each layer's own
    error stays within a few fp16 unit roundoffs (2**-11) of fp64."""
    case = cases["res"]
    job = case.job()
    job.dtype, job.dtype_cfg = "fp16", {"torch": "float16"}
    r = runner(job)
    r.activate()
    try:
        own = r.infer_own({"input": case.x}, case.ref)
    finally:
        r.deactivate()
    errs = case.own_errors(own)
    assert max(errs.values()) < 4 * 2.0 ** -11, errs


def test_inplace_relu_input_is_recorded_before_it_is_overwritten(cases):
    ref = cases["res"].ref
    assert (ref["pre:relu"] < 0).any() and (ref["pre:relu#1"] < 0).any()
    np.testing.assert_array_equal(ref["pre:relu"], ref["bn1"])
    # rows: layers in execution order first (the same order as without inputs), then outputs, then pre:
    rows = store.rows_from(0, list(ref.items()))
    kinds = [("pre" if store.is_pre(t.name) else "out" if store.is_output(t.name) else "layer") for t in rows]
    assert kinds == sorted(kinds, key=["layer", "out", "pre"].index)
    assert [t.name for t in rows if kinds[t.order] == "layer"] == leaf_calls(cases["res"])


def faulty(case, tmp: Path, edit) -> Path:
    """A model dir with layers.onnx edited by `edit(graph)` (model.onnx copied as is)."""
    d = tmp / "faulty"
    d.mkdir(exist_ok=True)
    m = case.graph()
    edit(m.graph)
    onnx.save(m, str(d / "layers.onnx"))
    shutil.copy(case.dir / "model.onnx", d / "model.onnx")
    return d


def scale_initializer(name: str, s: float):
    def edit(g):
        t = next(t for t in g.initializer if t.name == name)
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * np.float32(s), name))
    return edit


@pytest.mark.parametrize("key, weight, first", [("mlp", "model.fc1.weight", "fc1"),
                                                 ("res", "model.conv1.weight", "conv1")])
def test_fault_is_charged_to_the_layer_that_introduces_it(cases, tmp_path, key, weight, first):
    case = cases[key]
    acc, own, _ = case.run(OrtCpuRunner, faulty(case, tmp_path, scale_initializer(weight, 1.05)))
    errs = case.own_errors(own)
    assert errs[first] > 1e-2
    rest = {n: e for n, e in errs.items() if n != first}
    assert max(rest.values()) < NOISE, {n: e for n, e in rest.items() if e >= NOISE}
    # accumulated error blames every layer downstream too
    last = leaf_calls(case)[-1]
    assert rel_l2(acc[last], case.ref[last]) > 1e-3


def between_node(case, op: str) -> str:
    lv = onnx_cut.analyse(case.graph())
    leaf_nodes = {i for s in lv.nodes.values() for i in s}
    hits = [n.name for i, n in enumerate(case.graph().graph.node) if n.op_type == op and i not in leaf_nodes]
    assert len(hits) == 1, hits
    return hits[0]


def test_fault_in_a_residual_add_shows_in_the_next_leafs_between_value_only(cases, tmp_path):
    case = cases["res"]
    add = between_node(case, "Add")

    def to_sub(g):
        next(n for n in g.node if n.name == add).op_type = "Sub"
    _, own, _ = case.run(OrtCpuRunner, faulty(case, tmp_path, to_sub))
    errs = case.own_errors(own)
    assert errs["between:relu#1"] > 1e-2
    rest = {n: e for n, e in errs.items() if n != "between:relu#1"}
    assert max(rest.values()) < NOISE, {n: e for n, e in rest.items() if e >= NOISE}


def test_softmax_axis_fault_shows_between_qkv_and_out(cases, tmp_path):
    case = cases["block"]
    sm = between_node(case, "Softmax")

    def axis(g):
        node = next(n for n in g.node if n.name == sm)
        del node.attribute[:]
        node.attribute.append(helper.make_attribute("axis", 1))
    _, own, _ = case.run(OrtCpuRunner, faulty(case, tmp_path, axis))
    errs = case.own_errors(own)
    assert errs["between:out"] > 1e-2
    rest = {n: e for n, e in errs.items() if n != "between:out"}
    assert max(rest.values()) < NOISE, {n: e for n, e in rest.items() if e >= NOISE}


def test_regions_name_the_ops_between_leaves(cases):
    block = layer_regions(cases["block"].graph())
    assert block["out"]["after"] == ["qkv"] and "Softmax" in block["out"]["ops"]
    assert block["ln2"] == {"after": ["out"], "ops": ["Add"]}  # the residual add
    assert block["fc1"] == {"after": ["ln2"], "ops": []}
    res = layer_regions(cases["res"].graph())
    assert res["relu#1"] == {"after": ["relu", "bn2"], "ops": ["Add"]}
    assert all(not r["ops"] for r in layer_regions(cases["mlp"].graph()).values())


def test_compiled_and_int8_runners_say_own_error_is_not_measured(cases):
    case = cases["mlp"]
    assert "torch.compile" in TorchCompileRunner(case.job("torch_compile")).own_unsupported
    job = case.job()
    job.dtype, job.dtype_cfg = "int8", {"torch": "float32", "mode": "int8_static"}
    assert "int8" in OrtCpuRunner(job).own_unsupported
    assert OrtCpuRunner(case.job()).own_unsupported is None


def test_capture_without_fp64_reference_says_own_error_is_not_measured(cases, tmp_path):
    case = cases["mlp"]
    job = case.job("torch_cpu")
    job.provider_cfg = {"dtypes": ["fp32"]}
    job.reference = tmp_path / "fp64.parquet"  # reference.fp64: false writes none
    res = run_capture(TorchCpuRunner, job, [{"input": case.x}], 0, 1)
    assert res.status == "OK" and res.own is None and "reference.fp64: true" in res.own_reason
    store.write(job.reference, [store.Tensor(0, n, i, v) for i, (n, v) in enumerate(case.ref.items())])
    res = run_capture(TorchCpuRunner, job, [{"input": case.x}], 0, 1)
    assert res.own_reason == "" and [n for n, _ in res.own[0]][:2] == ["between:fc1", "fc1"]


def test_pipeline_writes_own_values_for_each_cell_from_the_fp64_reference(tmp_path):
    repo = make_repo(tmp_path / "repo", dtypes=("fp32",), providers=("torch_cpu", "ort_cpu"))
    repo.repro()  # reference.fp64 is on by default
    art = repo.path / "artifacts"
    ref = store.read_dict(art / "reference/tiny_mlp/fp64.parquet")
    assert (0, "pre:fc2") in ref
    assert not any(store.is_pre(t.name) for t in store.read(art / "reference/tiny_mlp/fp32.parquet"))
    layers = json.loads((art / "models/tiny_mlp/layers.json").read_text())
    assert layers["regions"]["fc2"] == {"after": ["act"], "ops": []}
    for provider in ("torch_cpu", "ort_cpu"):
        cap = art / f"capture/tiny_mlp-fp32-{provider}"
        status = json.loads((cap / "status.json").read_text())
        assert status["own"] == {"measured": True, "skipped": []}
        assert status["layers"] == 3  # pre: and own values never count as layers
        own = store.read_dict(cap / "own.parquet")
        assert {n for (k, n) in own if k == 0} == {"fc1", "act", "fc2", "between:fc1", "between:act",
                                                   "between:fc2", "between:output"}
        for (k, n), t in own.items():
            assert rel_l2(t.array, ref[(k, store.own_reference_name(n))].array) < NOISE, (provider, n)


def _node(op, ins, outs, scope=None, **attrs):
    n = helper.make_node(op, ins, outs, name=outs[0], **attrs)
    if scope is not None:
        p = n.metadata_props.add()
        p.key, p.value = onnx_cut.SCOPES, repr(["", "model", f"model.{scope}", op.lower()])
    return n


def test_cut_graph_on_a_hand_built_graph_feeds_leaves_and_between_ops_from_the_reference():
    """onnx only: a = relu(x); b = relu(a + x) (module `a` called once, `r` twice); `d` a leaf with
    no node in the metadata (skipped, named)."""
    f = lambda n: helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2, 3])  # noqa: E731
    nodes = [_node("Relu", ["x"], ["a"], "a"), _node("Add", ["a", "x"], ["s"]),
             _node("Relu", ["s"], ["r"], "r"), _node("Neg", ["r"], ["n"]), _node("Relu", ["n"], ["r#1"], "r"),
             _node("Identity", ["r#1"], ["d"]), _node("Identity", ["d"], ["output"])]
    m = helper.make_model(helper.make_graph(nodes, "g", [f("x")], [f(o) for o in ("output", "a", "r", "r#1", "d")]),
                          opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    lv = onnx_cut.analyse(m)
    assert lv.inputs == {"a": "x", "r": "s", "r#1": "n"} and list(lv.skipped) == ["d"]
    assert onnx_cut.regions(m)["r"] == {"after": ["a"], "ops": ["Add"]}
    assert onnx_cut.regions(m)["r#1"] == {"after": ["r"], "ops": ["Neg"]}
    cut = onnx_cut.cut(m, lv)
    onnx.checker.check_model(cut, full_check=True)
    import onnxruntime as ort

    s = ort.InferenceSession(cut.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.array([[1, -2, 3], [-4, 5, -6]], np.float32)
    ref = {"a": np.full((2, 3), 7, np.float32), "r": np.full((2, 3), -1, np.float32),
           "r#1": np.full((2, 3), 9, np.float32), "d": np.full((2, 3), 9, np.float32),
           "pre:a": -x, "pre:r": np.full((2, 3), -3, np.float32), "pre:r#1": np.full((2, 3), 2, np.float32)}
    feed = {"x": x, **{i.name: ref[i.name.removeprefix(onnx_cut.REF)] for i in s.get_inputs() if i.name != "x"}}
    got = dict(zip([o.name for o in s.get_outputs()], s.run(None, feed)))
    np.testing.assert_array_equal(got["a"], np.maximum(-x, 0))           # a on its reference input
    np.testing.assert_array_equal(got["r#1"], np.full((2, 3), 2))         # r#1 on pre:r#1, not on -r
    np.testing.assert_array_equal(got["between:r"], ref["a"] + x)         # the Add on the reference a
    np.testing.assert_array_equal(got["between:r#1"], -ref["r"])          # the Neg on the reference r


def _folded_reshape_graph(first_op: str) -> onnx.ModelProto:
    """a = relu(x) (2, 3, 4); leaf `p` reads `a` through `first_op`: a Reshape to [6, 4] (then MatMul)
    or a MatMul directly. Its reference input is (2, 12): in torch a reshape to (2, 12) sat between
    `a` and `p`, and the exporter folded it into p's own Reshape."""
    f = lambda n, s: helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s)  # noqa: E731
    w = numpy_helper.from_array(np.arange(20, dtype=np.float32).reshape(4, 5) / 10, "w")
    shape = numpy_helper.from_array(np.array([6, 4], np.int64), "shape")
    if first_op == "Reshape":
        p = [_node("Reshape", ["a", "shape"], ["flat"], "p"), _node("MatMul", ["flat", "w"], ["p"], "p")]
        out = [6, 5]
    else:
        p = [_node("MatMul", ["a", "w"], ["p"], "p")]
        out = [2, 3, 5]
    nodes = [_node("Relu", ["x"], ["a"], "a"), *p, _node("Identity", ["p"], ["output"])]
    g = helper.make_graph(nodes, "g", [f("x", [2, 3, 4])], [f("output", out), f("a", [2, 3, 4]), f("p", out)],
                          initializer=[w, shape])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_a_reshape_folded_into_the_leaf_feeds_the_reference_input_through_it():
    """GPT-2's attn.c_proj (transformers' Conv1D, `x.view(-1, nx)` first): the attention output
    (b, s, h, d) is reshaped to (b, s, h*d) between the leaves, and the exporter folds that into
    c_proj's Reshape, so the only tensor entering c_proj has the wrong rank for `pre:<call>`."""
    m = _folded_reshape_graph("Reshape")
    lv = onnx_cut.analyse(m, {"a": (2, 3, 4), "p": (2, 12)})
    assert lv.inputs == {"a": "x", "p": "a"} and lv.reshaped == {"p": (2, 12)} and not lv.skipped
    cut = onnx_cut.cut(m, lv)
    onnx.checker.check_model(cut, full_check=True)
    import onnxruntime as ort

    s = ort.InferenceSession(cut.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    x, ref_a, pre_p = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 4), (2, 3, 4), (2, 12)))
    feed = {"x": x, "ref:a": ref_a, "pre:a": ref_a, "pre:p": pre_p, "ref:p": np.zeros((6, 5), np.float32)}
    got = dict(zip([o.name for o in s.get_outputs()], s.run(None, {i.name: feed[i.name] for i in s.get_inputs()})))
    w = numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == "w"))
    np.testing.assert_allclose(got["p"], pre_p.reshape(6, 4) @ w, rtol=1e-6)   # p on its reference input
    np.testing.assert_array_equal(got["between:p"], ref_a.reshape(2, 12))     # in the reference input's shape


def test_a_leaf_input_of_another_shape_read_by_other_ops_is_skipped_and_named():
    m = _folded_reshape_graph("MatMul")
    lv = onnx_cut.analyse(m, {"a": (2, 3, 4), "p": (2, 12)})
    assert lv.inputs == {"a": "x"} and not lv.reshaped
    assert "[2, 3, 4]" in lv.skipped["p"] and "[2, 12]" in lv.skipped["p"]


TINY_GPT2 = """\
tiny_gpt2:
  arch:
    source: hf
    name: gpt2
    kwargs: {vocab_size: 1000, n_embd: 64, n_layer: 2, n_head: 4, n_positions: 64}
  input:
    - {name: input_ids, shape: [1, 16], dtype: int64, init: tokens}
  tolerances: []
"""


def test_gpt2_own_error_on_ort_cpu_is_measured(tmp_path):
    """A tiny GPT-2 (gpt2_small's pattern: Conv1D `attn.c_proj` after a folded reshape) through the
    pipeline: the ort_cpu cell has own.parquet, and c_proj's own value is at fp32 rounding."""
    repo = make_repo(tmp_path / "repo", models=("tiny_gpt2",), dtypes=("fp32",), providers=("ort_cpu",),
                     compose=False)
    (repo.path / "conf/models/tiny_gpt2.yaml").write_text(TINY_GPT2)
    repo.edit("conf/config.yaml", "samples: 2 ", "samples: 1 ")
    repo.run([f"{BIN}/parity", "compose"])
    repo.commit("tiny_gpt2")
    repo.repro("capture@tiny_gpt2-fp32-ort_cpu")
    art = repo.path / "artifacts"
    cap = art / "capture/tiny_gpt2-fp32-ort_cpu"
    status = json.loads((cap / "status.json").read_text())
    assert status["own"]["measured"] is True, status["own"]
    assert not [s for s in status["own"]["skipped"] if "c_proj" in s], status["own"]["skipped"]
    own = store.read_dict(cap / "own.parquet")
    ref = store.read_dict(art / "reference/tiny_gpt2/fp64.parquet")
    for k in {k for k, _ in own}:
        for n in ("h.1.attn.c_proj", "between:h.1.attn.c_proj"):
            assert rel_l2(own[(k, n)].array, ref[(k, store.own_reference_name(n))].array) < NOISE, (k, n)
        errs = {n: rel_l2(t.array, ref[(k, store.own_reference_name(n))].array) for (j, n), t in own.items() if j == k}
        assert max(errs.values()) < NOISE, {n: e for n, e in errs.items() if e >= NOISE}
