"""Models given as ONNX files (arch.source: onnx; parity/models/onnx_source.py): a graph built with
onnx.helper (no torch) runs through the real pipeline on ort_cpu at fp32 and fp16 with per-node results,
torch providers say UNSUPPORTED, and the five kinds of bad file fail with a message naming the file and
the problem, writing nothing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import BIN, Repo, env, make_repo, ran_stages

NODES = ["c1", "r1", "c2", "r2", "f", "g", "ln", "r3", "logits"]


def tiny_graph():
    """Conv/Relu x2, Flatten, Gemm, LayerNormalization, Relu, Gemm: built with onnx.helper only."""
    import onnx
    from onnx import TensorProto as T, helper as h, numpy_helper as nh

    rng = np.random.default_rng(0)

    def init(name, *shape, s=0.2):
        return nh.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)

    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             h.make_node("Flatten", ["r2"], ["f"], name="flat"),
             h.make_node("Gemm", ["f", "w3", "b3"], ["g"], name="fc1", transB=1),
             h.make_node("LayerNormalization", ["g", "ln_s", "ln_b"], ["ln"], name="ln", axis=-1),
             h.make_node("Relu", ["ln"], ["r3"], name="relu3"),
             h.make_node("Gemm", ["r3", "w4", "b4"], ["logits"], name="fc2", transB=1)]
    inits = [init("w1", 8, 3, 3, 3), init("b1", 8), init("w2", 8, 8, 3, 3, s=0.1), init("b2", 8),
             init("w3", 32, 512, s=0.05), init("b3", 32), nh.from_array(np.ones(32, np.float32), "ln_s"),
             nh.from_array(np.zeros(32, np.float32), "ln_b"), init("w4", 10, 32), init("b4", 10)]
    g = h.make_graph(nodes, "tiny", [h.make_tensor_value_info("x", T.FLOAT, [2, 3, 8, 8])],
                     [h.make_tensor_value_info("logits", T.FLOAT, [2, 10])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(m, full_check=True)
    return m


def model_conf(name: str, path: str, shape=(2, 3, 8, 8)) -> str:
    return (f"{name}:\n  arch: {{source: onnx, path: {path}}}\n"
            f"  input:\n    - {{name: x, shape: {list(shape)}, dtype: float32, init: normal, mean: 0.0, std: 1.0}}\n"
            f"  tolerances: []\n")


def onnx_repo(path: Path, providers=("torch_cpu", "ort_cpu"), model=None) -> Repo:
    import onnx

    r = make_repo(path, providers=providers, compose=False)
    (r.path / "models").mkdir()
    onnx.save(model if model is not None else tiny_graph(), str(r.path / "models" / "tiny.onnx"))
    (r.path / "conf" / "models" / "tiny_onnx.yaml").write_text(model_conf("tiny_onnx", "models/tiny.onnx"))
    r.set_defaults(models=("tiny_onnx",))
    r.run([f"{BIN}/parity", "compose"])
    r.commit("onnx model")
    return r


def test_onnx_file_runs_per_node_on_ort_and_torch_says_unsupported(tmp_path):
    from parity.core import store

    r = onnx_repo(tmp_path / "repo")
    r.repro()
    a = r.path / "artifacts"
    lj = json.loads((a / "models/tiny_onnx/layers.json").read_text())
    assert [x["name"] for x in lj["layers"]] == NODES  # ONNX tensor names, topological order
    assert lj["output_tensors"] == {"output": "logits"}
    ref = [t.name for t in store.read(a / "reference/tiny_onnx/fp32.parquet") if t.sample == 0]
    assert ref == NODES + ["output"]
    assert (a / "reference/tiny_onnx/fp64.parquet").exists()  # the evaluator ran the float64 graph
    for dtype in ("fp32", "fp16"):
        st = json.loads((a / f"capture/tiny_onnx-{dtype}-ort_cpu/status.json").read_text())
        assert st["status"] == "OK" and st["layers"] == len(NODES), st
        d = json.loads((a / f"diff/tiny_onnx-{dtype}-ort_cpu/layers.json").read_text())
        assert [x["name"] for x in d["layers"]][:len(NODES)] == NODES
        assert d["verdict_mode"] == "oracle", d["verdict_mode_reason"]  # fp64 golden + ORT baseline
        t = json.loads((a / f"capture/tiny_onnx-{dtype}-torch_cpu/status.json").read_text())
        assert t["status"] == "UNSUPPORTED" and "ONNX file" in t["reason"], t
    summary = json.loads((a / "report/summary.json").read_text())
    assert "tiny_onnx-fp16-ort_cpu" in json.dumps(summary)


def test_onnx_file_pipeline_runs_with_no_torch_importable(tmp_path):
    """docs/onnx_models.md: an ONNX file is validated with no torch on its path. Every stage of an
    ort_cpu cell (export, reference_onnx, baseline, capture, diff, report), and the torch_cpu cell that
    says UNSUPPORTED, runs with a `torch` that fails to import ahead of the real one on PYTHONPATH (an
    import hoisted to a module's top once put torch into the export and baseline of such a model)."""
    r = onnx_repo(tmp_path / "repo", providers=("ort_cpu", "torch_cpu"))
    fake = tmp_path / "no-torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('torch imported on an ONNX-file path')\n")
    e = env()
    e["PYTHONPATH"] = str(fake.parent)
    p = subprocess.run(["dvc", "repro"], cwd=r.path, env=e, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    ran = ran_stages(p.stdout)
    assert {"export@tiny_onnx", "reference_onnx@tiny_onnx", "capture@tiny_onnx-fp32-ort_cpu",
            "baseline@tiny_onnx-fp32", "diff@tiny_onnx-fp32-ort_cpu"} <= set(ran), ran
    assert "torch imported" not in p.stdout + p.stderr
    t = json.loads((r.path / "artifacts/capture/tiny_onnx-fp32-torch_cpu/status.json").read_text())
    assert t["status"] == "UNSUPPORTED" and "runs torch models only" in t["reason"], t


def _export(r: Repo) -> subprocess.CompletedProcess:
    return r.run(["dvc", "repro", "export@tiny_onnx"], check=False)


def _truncate(p: Path):
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


def _external_missing(p: Path):
    import onnx

    m = onnx.load(str(p))
    onnx.save(m, str(p), save_as_external_data=True, all_tensors_to_one_file=True, location="tiny.data",
              size_threshold=0)
    (p.parent / "tiny.data").unlink()


def _future_opset(p: Path):
    import onnx

    m = tiny_graph()
    m.opset_import[0].version = 27  # past what onnxruntime 1.31 officially supports (26)
    onnx.save(m, str(p))


BAD = {
    "missing": (lambda p: p.unlink(), "no such file"),
    "not_onnx": (lambda p: p.write_text("this is a README, not a model\n"), "not an ONNX model"),
    "truncated": (_truncate, "truncated"),
    "external_missing": (_external_missing, "external data missing"),
    "opset": (_future_opset, "outside what the installed onnxruntime"),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_onnx_file_fails_naming_file_and_problem(tmp_path, kind):
    r = onnx_repo(tmp_path / "repo", providers=("ort_cpu",))
    f = r.path / "models" / "tiny.onnx"
    spoil, words = BAD[kind]
    spoil(f)
    if kind == "missing":  # at compose time, before any stage runs
        res = r.run([f"{BIN}/parity", "compose"], check=False)
    else:
        res = _export(r)
    assert res.returncode != 0
    err = res.stdout + res.stderr
    assert "models/tiny.onnx" in err and words in err, err
    assert not (r.path / "artifacts" / "models" / "tiny_onnx").exists() or \
        not any((r.path / "artifacts" / "models" / "tiny_onnx").iterdir())


@pytest.mark.slow
def test_torchvision_onnx_as_a_file_runs_per_node(tmp_path):
    """resnet18 exported by the pipeline, then used as a plain .onnx file (arch.source: onnx)."""
    import shutil

    from parity.core import store

    r = make_repo(tmp_path / "repo", models=("resnet18",), dtypes=("fp32",), providers=("ort_cpu",))
    r.repro("export@resnet18")
    (r.path / "models").mkdir()
    shutil.copy(r.path / "artifacts/models/resnet18/model.onnx", r.path / "models/rn18.onnx")
    shutil.copy(r.path / "artifacts/models/resnet18/weights.bin", r.path / "models/weights.bin")  # its external data
    (r.path / "conf/models/rn18.yaml").write_text(model_conf("rn18", "models/rn18.onnx", (1, 3, 224, 224))
                                                  .replace("name: x,", "name: input,"))
    r.set_defaults(models=("rn18",), dtypes=("fp32", "fp16"), providers=("torch_cpu", "ort_cpu"))
    r.run([f"{BIN}/parity", "compose"])
    r.commit("resnet18 as an ONNX file")
    r.repro()
    a = r.path / "artifacts"
    lj = json.loads((a / "models/rn18/layers.json").read_text())
    import onnx

    plain = onnx.load(str(r.path / "models/rn18.onnx"))
    produced = [o for n in plain.graph.node for o in n.output]
    assert len(lj["layers"]) > 50 and all(x["name"] in produced for x in lj["layers"])  # node outputs
    assert lj["output_tensors"] == {"output": "output"}  # the file's output was already named output
    for dtype in ("fp32", "fp16"):
        st = json.loads((a / f"capture/rn18-{dtype}-ort_cpu/status.json").read_text())
        assert st["status"] == "OK" and st["layers"] == len(lj["layers"]), st
        assert json.loads((a / f"capture/rn18-{dtype}-torch_cpu/status.json").read_text())["status"] == "UNSUPPORTED"
        m = json.loads((a / f"diff/rn18-{dtype}-ort_cpu/metrics.json").read_text())
        assert m["verdict"] in ("PASS", "FAIL") and m["layers"] >= len(lj["layers"]), m
    names = [t.name for t in store.read(a / "reference/rn18/fp32.parquet") if t.sample == 0]
    assert names[:len(lj["layers"])] == [x["name"] for x in lj["layers"]]


def test_contrib_op_in_the_reference_and_the_golden_run(tmp_path):
    """A contrib op (com.microsoft FusedMatMul) runs on onnxruntime, not in the ONNX reference
    evaluator: the fp32 reference is there, and the fp64 golden too, with that node run alone on
    onnxruntime and named (tests/test_onnx_oracle.py has the rest of the fallbacks)."""
    import onnx
    from onnx import TensorProto as T, helper as h, numpy_helper as nh

    from parity.pipeline import onnx_reference

    w = nh.from_array(np.eye(4, dtype=np.float32), "w")
    g = h.make_graph([h.make_node("FusedMatMul", ["x", "w"], ["y"], domain="com.microsoft", alpha=2.0),
                      h.make_node("Relu", ["y"], ["z"])], "contrib",
                     [h.make_tensor_value_info("x", T.FLOAT, [2, 4])], [h.make_tensor_value_info("z", T.FLOAT, [2, 4])], [w])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)], ir_version=8)
    onnx.save(m, str(tmp_path / "c.onnx"))
    p = {"models": {"c": {"arch": {"source": "onnx", "path": str(tmp_path / "c.onnx")},
                          "input": [{"name": "x", "shape": [2, 4]}]}}, "dtypes": {"fp32": {}}}
    feeds = [{"x": np.arange(8, dtype=np.float32).reshape(2, 4) - 3}]
    rows = onnx_reference.reference_rows(p, "c", feeds)
    # y (the contrib op's output) has no type ONNX shape inference can give: not captured (docs say so)
    assert [t.name for t in rows] == ["z", "output"]
    assert np.array_equal(rows[-1].array, np.maximum(2 * feeds[0]["x"], 0))
    gold, why, fell = onnx_reference.golden_rows(p, "c", feeds, rows)
    assert why == "" and [t.name for t in gold] == ["z", "output"], why
    assert [(r["op"], r["ran"]) for r in fell] == [("FusedMatMul", "onnxruntime float64")], fell


def test_a_negative_dim_value_is_a_dynamic_axis_not_a_size():
    """Paddle2ONNX writes `dim_value: -1` for a dynamic batch (PP-OCR's text-direction classifier): it was
    refused ("has shape [-1, 3, 48, 192], the spec [1, 3, 48, 192]"); any size is accepted there."""
    from onnx import TensorProto, helper

    from parity.models.onnx_source import OnnxSourceError, check_inputs

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 48, 192])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g)
    check_inputs(m, [{"name": "x", "shape": [2, 3, 48, 192], "dtype": "float32"}], Path("cls.onnx"), "arch.path")
    with pytest.raises(OnnxSourceError, match="has shape"):
        check_inputs(m, [{"name": "x", "shape": [2, 3, 48, 100], "dtype": "float32"}], Path("cls.onnx"), "arch.path")
