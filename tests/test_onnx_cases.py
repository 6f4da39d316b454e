"""ONNX node tests as suite cases, in process (parity.suites.onnxcase.run on ort_cpu, judged by the suite
diff): a handful written with onnx's own generators (onnx.backend.test.case.node.<op>, as import-onnx
writes them), covering what the harness must feed and compare so that a valid test runs as given:
float8 / int4 / bfloat16 values, sequences, optionals, strings, an opset stamp lowered when every op
is defined identically at onnxruntime's newest opset, and onnxruntime's own no-kernel refusal as
UNSUPPORTED. At fp16, `exercised` says whether the op computed in fp16. The DVC run of an imported
suite is tests/test_onnx_conformance.py; the whole import is benchmarks/onnx_node_suite.py."""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path

import pytest

from parity.backends import load_runner
from parity.backends.runner import OpJob, OpSkip
from parity.suites import coverage, diff, onnxcase, onnximport, render

MODULES = ("castlike", "identity", "celu", "roialign", "string_concat", "gemm", "affinegrid")
TESTS = ("test_castlike_FLOAT8E4M3FN_to_FLOAT", "test_castlike_INT4_to_FLOAT", "test_castlike_FLOAT_to_BFLOAT16",
         "test_identity_sequence", "test_identity_opt", "test_celu", "test_celu_expanded",
         "test_roialign_aligned_false", "test_string_concat", "test_gemm_default_matrix_bias", "test_affine_grid_2d")
P = {"suites": {"onx": {"tolerances": [dict(onnximport.ONNX_TOL)]}},
     "dtypes": {"fp32": {"torch": "float32", "tol": {"atol": 1e-5, "rtol": 1e-4}},
                "fp16": {"torch": "float16", "tol": {"atol": 1e-2, "rtol": 1e-2}}}}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The TESTS, from onnx's generators (importing an op's module runs its exports into the list)."""
    from onnx.backend.test.case import node

    out = tmp_path_factory.mktemp("node")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in MODULES:
            importlib.import_module(f"onnx.backend.test.case.node.{m}")
    cases = {c.name: c for c in node._NodeTestCases if c.name in TESTS}
    assert set(cases) == set(TESTS), set(TESTS) - set(cases)
    for c in cases.values():
        onnximport.write_case(out, c)
    return out


def runner_for(cell: dict):
    return load_runner(cell["runner"])(OpJob(cell["provider"], {"runner": cell["runner"], "options": {}},
                                             cell["torch_dtype"]))


def judged(folder: Path, name: str, dtype: str = "fp32") -> dict:
    """The suite diff's verdict on one node test run on ort_cpu at `dtype`."""
    cell = {"provider": "ort_cpu", "runner": "parity.backends.ort_cpu:OrtCpuRunner",
            "torch_dtype": P["dtypes"][dtype]["torch"]}
    case = {"id": name, "kind": "onnx", "label": "onnx::" + name, "onnx": {"path": str(folder / name)}}
    try:
        res = onnxcase.run(case, cell, lambda c: load_runner(c["runner"]), runner_for)
    except OpSkip as e:  # as parity.suites.execute._run_sample ends a case
        res = {"status": e.status, "reason": e.reason}
    row = {"id": name, "label": case["label"], "kind": "onnx", "status": res["status"], "reason": res.get("reason", ""),
           "outputs": [n for n, _ in res.get("outputs", [])],
           **{k: res[k] for k in ("note", "exercised") if k in res}}
    return diff.diff_case(P, "onx", dtype, row, dict(res.get("outputs", [])), dict(res.get("reference", [])))


@pytest.mark.parametrize("name", ["test_castlike_FLOAT8E4M3FN_to_FLOAT", "test_castlike_INT4_to_FLOAT",
                                  "test_castlike_FLOAT_to_BFLOAT16", "test_identity_sequence", "test_identity_opt",
                                  "test_string_concat"])
def test_every_onnx_value_type_is_fed_and_compared(folder, name):
    r = judged(folder, name)
    assert r["status"] == "OK", (r["status"], r["reason"])
    if name == "test_string_concat":
        assert "digests" in r["note"], r


def test_an_opset_stamp_is_lowered_only_when_every_op_is_unchanged(folder):
    top = onnxcase.ort_max_opset()
    skipped = judged(folder, "test_celu")  # Celu-28 itself: onnxruntime 1.31 reads opset <= 26
    assert skipped["status"] == "SKIPPED" and f"(ai.onnx opset <= {top})" in skipped["reason"], skipped
    assert "Celu-" in skipped["reason"] and "newer than the installed onnxruntime" in skipped["reason"]
    lowered = judged(folder, "test_celu_expanded")  # its function body: ops defined identically at `top`
    assert lowered["status"] == "OK" and f"lowered to {top}" in lowered["note"], lowered


def test_a_missing_kernel_is_unsupported_in_onnxruntimes_words(folder):
    r = judged(folder, "test_roialign_aligned_false")
    assert r["status"] == "UNSUPPORTED" and "Could not find an implementation for RoiAlign" in r["reason"], r


def test_fp16_says_which_ops_computed_in_fp16(folder):
    gemm = judged(folder, "test_gemm_default_matrix_bias", "fp16")
    assert gemm["status"] == "OK" and gemm["exercised"]["exercised"] is False, gemm
    assert "bit-identical to the fp32 graph's" in gemm["exercised"]["evidence"]
    grid = judged(folder, "test_affine_grid_2d", "fp16")
    assert grid["exercised"]["exercised"] is True and "fp16 compute" in grid["exercised"]["evidence"], grid
    assert "exercised" not in judged(folder, "test_castlike_INT4_to_FLOAT")  # fp32: nothing to exercise
    cov = coverage._row({"op": "onnx::Gemm", "case_ids": ["a", "b"], "onnx": {"Gemm"}, "onnx_fail": False,
                         "cells": {"ort_cpu/fp16": {"statuses": [("OK", "", "a"), ("OK", "", "b")], "max_abs": [],
                                                    "ratios": [], "exercised": [False, None]}}}, ["ort_cpu/fp16"])
    assert cov["cells"]["ort_cpu/fp16"]["exercised"]["label"] == "computed 0, fp32 1, cannot tell 1", cov
    td = render._status_td({"status": "MISMATCH", "reason": "r", "max_abs": "inf",  # write_json's non-finite
                            "exercised": {"label": "fp32 kernels"}}, None)
    assert "max_abs inf | precision: fp32 kernels" in td, td


def test_ir_and_opset_notes_do_not_change_the_file(folder):
    before = (folder / "test_celu_expanded" / "model.onnx").read_bytes()
    judged(folder, "test_celu_expanded")
    assert (folder / "test_celu_expanded" / "model.onnx").read_bytes() == before
