"""ONNX's backend node tests as a suite (parity suite import-onnx, case kind `onnx`): node tests in
ONNX's layout (model.onnx, test_data_set_0/{input,output}_<j>.pb) imported into conf/suites and
data/onnx, run on real DVC through the suite stages on ort_cpu (torch_cpu says UNSUPPORTED) against
the tests' expected outputs; a test stamped with an opset onnxruntime cannot read is SKIPPED with the
reason, a sequence-valued one compared element by element, a wrong expected output is a MISMATCH. The full import (every node test of the installed onnx) is a command, not a test:
benchmarks/onnx_node_models.py and the README's suites section."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.conftest import BIN, make_repo


def node_test(root: Path, name: str, nodes, ins: dict, outs: dict, opset=17, ir=8, vi_out=None):
    """One node test in ONNX's backend-test layout; `outs` are the expected values."""
    import onnx
    from onnx import helper as h, numpy_helper as nh

    def vi(n, a):
        return h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))

    g = h.make_graph(nodes, name, [vi(n, a) for n, a in ins.items()],
                     vi_out or [vi(n, a) for n, a in outs.items()])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=ir)
    d = root / name / "test_data_set_0"
    d.mkdir(parents=True)
    onnx.save(m, str(root / name / "model.onnx"))
    for kind, vals in (("input", ins), ("output", outs)):
        for j, (n, a) in enumerate(vals.items()):
            (d / f"{kind}_{j}.pb").write_bytes(nh.from_array(a, n).SerializeToString())


def write_tests(root: Path) -> None:
    from onnx import TensorProto as T, helper as h

    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    c = rng.random((3, 4)) > 0.5
    node_test(root, "test_relu", [h.make_node("Relu", ["x"], ["y"])], {"x": x}, {"y": np.maximum(x, 0)})
    node_test(root, "test_where_example", [h.make_node("Where", ["c", "x", "z"], ["y"])],
              {"c": c, "x": x, "z": -x}, {"y": np.where(c, x, -x)}, opset=16)
    node_test(root, "test_cumsum_axis0d", [h.make_node("CumSum", ["x", "axis"], ["y"])],
              {"x": x, "axis": np.array(-1, np.int64)}, {"y": np.cumsum(x, axis=-1)}, opset=14)
    node_test(root, "test_relu_wrong", [h.make_node("Relu", ["x"], ["y"])], {"x": x}, {"y": np.maximum(x, 0) + 0.5})
    node_test(root, "test_relu_newer", [h.make_node("Relu", ["x"], ["y"])], {"x": x}, {"y": np.maximum(x, 0)},
              opset=25, ir=14)  # onnx 1.23's stamps: IR 14 lowered to 13, opset 25 runs
    node_test(root, "test_relu_future", [h.make_node("Relu", ["x"], ["y"])], {"x": x}, {"y": np.maximum(x, 0)},
              opset=28, ir=14)  # an opset onnxruntime 1.31 does not read, Relu unchanged since 14: lowered
    celu = np.maximum(x, 0) + np.minimum(0, np.exp(x) - 1)
    node_test(root, "test_celu_future", [h.make_node("Celu", ["x"], ["y"])], {"x": x}, {"y": celu},
              opset=28, ir=14)  # Celu-28: newer than onnxruntime 1.31 implements
    seq = h.make_tensor_sequence_value_info("s", T.FLOAT, None)
    node_test(root, "test_sequence_construct", [h.make_node("SequenceConstruct", ["x", "x"], ["s"])], {"x": x},
              {}, opset=17, vi_out=[seq])
    from onnx import numpy_helper as nh

    d = root / "test_sequence_construct" / "test_data_set_0"
    (d / "output_0.pb").write_bytes(nh.from_list([x, x], "s").SerializeToString())  # a sequence of 2 tensors


def test_node_tests_run_as_a_suite_on_dvc_with_their_expected_outputs(tmp_path):
    src = tmp_path / "node_tests"
    write_tests(src)
    r = make_repo(tmp_path / "repo", dtypes=("fp32",), providers=("torch_cpu", "ort_cpu"), compose=False)
    out = r.run([f"{BIN}/parity", "suite", "import-onnx", "--from", str(src), "--name", "onx"]).stdout
    assert "8 ONNX node tests" in out, out
    again = r.run([f"{BIN}/parity", "suite", "import-onnx", "--from", str(src), "--name", "onx"], check=False)
    assert again.returncode == 2 and "exists: pass --force" in again.stderr, again.stderr
    assert "test_relu\n" in r.run([f"{BIN}/parity", "suite", "list", "onx"]).stdout
    r.edit("conf/config.yaml", "  - suites: []", "  - suites: [onx]")
    r.run([f"{BIN}/parity", "compose"])
    r.commit("onnx node tests")
    r.repro("suite_coverage@onx")
    a = r.path / "artifacts/suites"
    cases = {c["id"]: c for c in json.loads((a / "diff/onx/fp32-ort_cpu/results.json").read_text())["cases"]}
    st = {k: c["status"] for k, c in cases.items()}
    assert st == {"test_relu": "OK", "test_where_example": "OK", "test_cumsum_axis0d": "OK",
                  "test_relu_wrong": "MISMATCH", "test_relu_newer": "OK", "test_relu_future": "OK",
                  "test_celu_future": "SKIPPED",
                  "test_sequence_construct": "OK"}, {k: (c["status"], c["reason"]) for k, c in cases.items()}
    assert "opset ai.onnx 28: Celu-28 is newer than the installed onnxruntime" in cases["test_celu_future"]["reason"]
    assert "ai.onnx opset 28 lowered to" in cases["test_relu_future"].get("note", ""), cases["test_relu_future"]
    assert "IR version 14 lowered to 13" in cases["test_relu_newer"].get("note", ""), cases["test_relu_newer"]
    assert cases["test_sequence_construct"]["max_abs"] == 0.0, cases["test_sequence_construct"]
    assert cases["test_relu"]["onnx_ops"] == ["Relu"] and "suites.onx.tolerances" in cases["test_relu"]["tol_source"]
    torch_cases = json.loads((a / "diff/onx/fp32-torch_cpu/results.json").read_text())["cases"]
    assert {c["status"] for c in torch_cases} == {"UNSUPPORTED"}
    cov = json.loads((a / "coverage/onx.json").read_text())
    ops = {o["op"]: o for o in cov["ops"]}
    assert {"onnx::Relu", "onnx::Where", "onnx::CumSum", "onnx::SequenceConstruct"} <= set(ops), sorted(ops)
    csv = (a / "coverage/onx.csv").read_text()
    assert csv.startswith("op,case,") and "onnx::Where,test_where_example" in csv, csv
