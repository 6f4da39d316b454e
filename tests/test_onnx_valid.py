"""Valid ONNX models that used to be refused or mislabelled (issue 25, items 17-22): bool graph inputs,
negative integer inputs of a model without a vocabulary, rank-0 inputs kept rank 0 (so the ONNX
reference evaluator gives the fp64 golden), a file stamped with an IR version newer than onnxruntime
reads, the real reason when there is no fp64 golden, and an fp16 conversion onnxruntime cannot load."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import BIN, make_repo


def where_reduce_cumsum(ir_version=None):
    """Where(cond: bool) -> ReduceMean(axes: int64 [1], -1 from a file) -> CumSum(axis: int64 rank 0,
    -1 from a file), opset 18, stamped as onnx's make_model stamps it (IR 14 with onnx 1.23)."""
    from onnx import TensorProto as T, helper as h

    nodes = [h.make_node("Neg", ["x"], ["nx"]),
             h.make_node("Where", ["cond", "x", "nx"], ["w"]),
             h.make_node("ReduceMean", ["w", "axes"], ["r"], keepdims=1),
             h.make_node("CumSum", ["r", "axis"], ["y"])]
    g = h.make_graph(nodes, "wrc", [h.make_tensor_value_info("x", T.FLOAT, [2, 3, 4]),
                                    h.make_tensor_value_info("cond", T.BOOL, [2, 3, 4]),
                                    h.make_tensor_value_info("axes", T.INT64, [1]),
                                    h.make_tensor_value_info("axis", T.INT64, [])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2, 3, 1])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 18)])
    if ir_version is not None:
        m.ir_version = ir_version
    return m


CONF = """\
wrc:
  arch: {source: onnx, path: models/wrc.onnx}
  input:
    - {name: x, shape: [2, 3, 4], dtype: float32, init: normal}
    - {name: cond, shape: [2, 3, 4], dtype: bool, init: randint}
    - {name: axes, shape: [1], dtype: int64, init: file, path: data/inputs/axes.npy}
    - {name: axis, shape: [], dtype: int64, init: file, path: data/inputs/axis.npy}
  tolerances: []
"""


def test_bool_negative_and_rank0_inputs_and_a_newer_ir_stamp_run_with_the_fp64_golden(tmp_path):
    import onnx

    from parity.core import store

    m = where_reduce_cumsum()
    assert m.ir_version > 13  # onnx 1.23 stamps IR 14; onnxruntime 1.31 reads <= 13
    r = make_repo(tmp_path / "repo", dtypes=("fp32",), providers=("ort_cpu",), compose=False)
    (r.path / "models").mkdir()
    onnx.save(m, str(r.path / "models/wrc.onnx"))
    (r.path / "data/inputs").mkdir(parents=True, exist_ok=True)
    np.save(r.path / "data/inputs/axes.npy", np.array([[-1], [-1]], np.int64))  # 2 samples; negative: valid ONNX
    np.save(r.path / "data/inputs/axis.npy", np.array([-1, -1], np.int64))  # 2 samples of rank 0
    (r.path / "conf/models/wrc.yaml").write_text(CONF)
    r.set_defaults(models=("wrc",))
    r.run([f"{BIN}/parity", "compose"])
    r.commit("wrc")
    out = r.run(["dvc", "repro"]).stdout
    a = r.path / "artifacts"
    assert "IR version" in out and "lowered to 13" in out, out  # the export summary says so
    lj = json.loads((a / "models/wrc/layers.json").read_text())
    assert any("lowered to 13" in n for n in lj["loaded_as"]), lj
    ins = {t.name: t.array for t in store.read(a / "inputs/wrc.parquet") if t.sample == 0}
    assert ins["cond"].dtype == np.bool_ and ins["axis"].shape == () and ins["axes"].tolist() == [-1]
    assert (a / "reference/wrc/fp64.parquet").exists()  # the evaluator took the rank-0 axis
    st = json.loads((a / "capture/wrc-fp32-ort_cpu/status.json").read_text())
    assert st["status"] == "OK", st
    d = json.loads((a / "diff/wrc-fp32-ort_cpu/metrics.json").read_text())
    assert d["verdict"] == "PASS" and d["verdict_mode"] == "oracle", d
    x, c = ins["x"], ins["cond"]
    want = np.cumsum(np.where(c, x, -x).mean(axis=-1, keepdims=True), axis=-1)
    got = [t.array for t in store.read(a / "reference/wrc/fp32.parquet") if t.name == "output" and t.sample == 0][0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_store_keeps_rank0_and_files_without_it_keep_their_bytes(tmp_path):
    from parity.core import store

    store.write(tmp_path / "a.parquet", [store.Tensor(0, "s", 0, np.array(3, np.int64)),
                                         store.Tensor(0, "m", 1, np.array([True, False]))])
    got = {t.name: t.array for t in store.read(tmp_path / "a.parquet")}
    assert got["s"].shape == () and got["s"] == 3 and got["m"].dtype == np.bool_
    # a file written before (rank 0 stored as [1]) reads as it always did
    old = [store.Tensor(0, "s", 0, np.array([3], np.int64))]
    store.write(tmp_path / "old.parquet", old)
    assert [t.array.shape for t in store.read(tmp_path / "old.parquet")] == [(1,)]
    v = [store.Tensor(0, "v", 0, np.arange(6, dtype=np.float32).reshape(2, 3))]
    store.write(tmp_path / "v1.parquet", v)
    import hashlib
    assert hashlib.md5((tmp_path / "v1.parquet").read_bytes()).hexdigest() == V_MD5


V_MD5 = "4f2a4cb43a81cecc3b942c025d709b18"  # the store's format since page checksums (issue 36 item 1; before: zstd, stored-once rows, BENCHMARKS 17d)


def test_negative_ints_need_a_vocabulary_to_be_refused_and_bool_inits(tmp_path, monkeypatch):
    from parity.pipeline import inputfiles
    from parity.config import inputspec

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data/inputs").mkdir(parents=True)
    np.save(tmp_path / "data/inputs/ix.npy", np.array([-2, 1], np.int64))
    spec = {"name": "ix", "shape": [2], "dtype": "int64", "init": "file", "path": "data/inputs/ix.npy"}
    assert _load_file(spec, {"source": "onnx"}, 1).tolist() == [[-2, 1]]
    with pytest.raises(inputfiles.InputError, match=r"values span \[-2, 1\], outside \[0, 100\)"):
        _load_file({**spec, "name": "input_ids"}, {"source": "hf", "kwargs": {"vocab_size": 100}}, 1)
    np.save(tmp_path / "data/inputs/m.npy", np.array([0, 2], np.int64))
    with pytest.raises(inputfiles.InputError, match="bool input holds 0/1"):
        _load_file({"name": "m", "shape": [2], "dtype": "bool", "init": "file",
                              "path": "data/inputs/m.npy"}, {}, 1)
    m = {"arch": {"source": "onnx", "path": "m.onnx"}, "input": [{"name": "m", "shape": [2], "dtype": "bool"}]}
    with pytest.raises(ValueError, match=r"input\[0\].init: a bool input takes init randint"):
        inputspec.validate("models.x", m)


def test_ir_version_named_when_the_opset_is_too_new_too(tmp_path):
    import onnx

    from parity.models import onnx_source

    m = where_reduce_cumsum(ir_version=14)
    m.opset_import[0].version = 28
    onnx.save(m, str(tmp_path / "f.onnx"))
    with pytest.raises(onnx_source.OnnxSourceError) as e:
        onnx_source.load_checked(tmp_path / "f.onnx", "models.f.arch.path")
    msg = str(e.value)
    assert "IR version 14 is newer than the installed onnxruntime" in msg and "opset ai.onnx 28" in msg, msg
    notes = []
    ok = onnx_source.load_checked(_saved(tmp_path / "g.onnx", where_reduce_cumsum(ir_version=14)), "w", notes)
    assert ok.ir_version == 13 and notes and "IR version 14 lowered to 13" in notes[0], notes


def _saved(p: Path, m) -> Path:
    import onnx

    onnx.save(m, str(p))
    return p


def test_no_fp64_reason_is_the_real_one(tmp_path):
    """reference.fp64 is true, the evaluator cannot run a contrib op: that node runs alone on
    onnxruntime (parity.pipeline.onnx_fp64) and the verdict's reason says that."""
    import onnx
    from onnx import TensorProto as T, helper as h, numpy_helper as nh

    from parity.pipeline import diff
    from parity.config import schema
    from parity.pipeline import onnx_reference

    w = nh.from_array(np.eye(4, dtype=np.float32), "w")
    g = h.make_graph([h.make_node("FusedMatMul", ["x", "w"], ["y"], domain="com.microsoft", alpha=2.0),
                      h.make_node("Relu", ["y"], ["z"])], "contrib",
                     [h.make_tensor_value_info("x", T.FLOAT, [2, 4])], [h.make_tensor_value_info("z", T.FLOAT, [2, 4])], [w])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)], ir_version=8),
              str(tmp_path / "c.onnx"))
    p = {"models": {"c": {"arch": {"source": "onnx", "path": str(tmp_path / "c.onnx")},
                          "input": [{"name": "x", "shape": [2, 4]}]}},
         "dtypes": {"fp32": {"torch": "float32", "tol": {"atol": 1e-4, "rtol": 1e-6}, "oracle": {"k": 4.0}}},
         "reference": {"fp64": True}, "diff": {"verdict": "oracle"}}
    out = tmp_path / "ref"
    out.mkdir()
    assert onnx_reference.reference(p, "c", [{"x": np.ones((2, 4), np.float32)}], out) == 0
    assert (out / "fp64.parquet").exists()  # the golden run, FusedMatMul run alone on onnxruntime
    base = tmp_path / "base"
    base.mkdir()
    (base / "status.json").write_text('{"status": "OK"}')
    mode, why = diff.verdict_mode(schema.rule(p, "c", "fp32", []), out, base)
    assert mode == "oracle" and "reference.fp64: false" not in why and "(FusedMatMul) ran on onnxruntime" in why, why


def test_fp16_conversion_onnxruntime_cannot_load_is_infer_fail_naming_the_conversion(tmp_path):
    """LayerNormalization with its Mean/InvStdDev outputs, converted to fp16: onnxruntime refuses the
    converted graph's types. INFER_FAIL (as a suite case whose session fails), the reason names the
    conversion; not EXPORT_FAIL (the export ran)."""
    import onnx
    from onnx import TensorProto as T, helper as h, numpy_helper as nh

    from parity.backends.capture_driver import run_capture
    from parity.backends.runner import CaptureJob
    from parity.backends.ort_cpu import OrtCpuRunner

    g = h.make_graph([h.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv"], axis=-1)], "ln",
                     [h.make_tensor_value_info("x", T.FLOAT, [2, 3, 4, 5])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2, 3, 4, 5]), h.make_tensor_value_info("mean", T.FLOAT, None),
                      h.make_tensor_value_info("inv", T.FLOAT, None)],
                     [nh.from_array(np.ones(5, np.float32), "s"), nh.from_array(np.zeros(5, np.float32), "b")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    for f in ("layers.onnx", "model.onnx"):
        onnx.save(m, str(tmp_path / f))
    feeds = [{"x": np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)}]
    res = {}
    for dt in ("float32", "float16"):
        job = CaptureJob(model="ln", model_cfg={"arch": {}}, dtype="fp16" if dt == "float16" else "fp32",
                         dtype_cfg={"torch": dt, "mode": "cast"}, provider="ort_cpu",
                         provider_cfg={"runner": "parity.backends.ort_cpu:OrtCpuRunner", "dtypes": ["fp32", "fp16"]},
                         model_dir=tmp_path)
        res[dt] = run_capture(OrtCpuRunner, job, feeds, 0, 1)
    assert res["float32"].status == "OK", res["float32"].reason
    r = res["float16"]
    # the plain graph opens first (run_capture's order): either graph's name
    assert r.status == "INFER_FAIL" and "converted to float16" in r.reason and ".onnx" in r.reason, r.reason


def _load_file(spec: dict, arch: dict, n: int):
    """inputfiles.load_file with the bound and id-ness the model's InputPlan gives the spec."""
    from parity.config import inputspec
    from parity.pipeline import inputfiles

    plan = inputspec.plan({"arch": arch, "input": [spec]})
    return inputfiles.load_file(spec, n, plan.bounds[0], plan.ids[0])
