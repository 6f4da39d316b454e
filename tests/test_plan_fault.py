"""options.fault (parity.backends.fault) acts on every graph an onnxruntime provider runs: the plan's
mixed-precision runs (OrtCpuRunner.mixed) ignored it, so a plan was searched on the unfaulted model
while the cell's capture ran the faulted one. Real onnxruntime on a two-node graph."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from parity.backends.ort_cpu import OrtCpuRunner
from parity.backends.runner import CaptureJob


def _runner(model_dir, options: dict) -> OrtCpuRunner:
    job = CaptureJob(model="m", model_cfg={}, dtype="fp16", dtype_cfg={"torch": "float16", "mode": "cast"},
                     provider="ort_cpu", provider_cfg={"runner": "parity.backends.ort_cpu:OrtCpuRunner",
                                                       "options": options}, model_dir=model_dir)
    return OrtCpuRunner(job)


def test_the_plans_mixed_runs_carry_the_providers_fault(tmp_path):
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32) * 0.5, "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"], name="fc1"),
                           helper.make_node("Relu", ["h"], ["output"], name="act")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), tmp_path / "model.onnx")
    x = {"x": np.ones((1, 4), np.float32)}
    for reduced in (False, True):  # everything in fp32; everything in fp16 (the weights converted)
        outs = []
        for options in ({}, {"fault": {"node": "fc1", "scale": 2.0}}):
            r = _runner(tmp_path, options)
            r.mixed(reduced, [])
            outs.append(dict(r.infer_plain(x))["output"])
        np.testing.assert_array_equal(outs[0], np.full((1, 4), 0.5, np.float32))
        np.testing.assert_array_equal(outs[1], np.full((1, 4), 1.0, np.float32))
