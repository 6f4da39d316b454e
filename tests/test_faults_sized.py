"""The fault table's fp16 rows say what fp16 must say (issue 35): a fault below one fp16 rounding is expected
to PASS at fp16, its sized variant (where one exists) to FAIL at the same layer with the same label; the quantised set runs on
the provider of its dtype; fp16_round --format bf16 rounds a leaf's output to bf16 (a narrower format than
an fp16 cell's own), on onnxruntime, in the tiny net of tests/test_faults.py."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import onnx
import pytest

ort = pytest.importorskip("onnxruntime")

from parity.analysis.faults import FaultError, inject  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.test_faults import X, model_dir, run  # noqa: E402,F401  (model_dir: the tiny net's export fixture)


def table():
    spec = importlib.util.spec_from_file_location("fault_table", ROOT / "benchmarks" / "fault_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bf16(v: np.ndarray) -> np.ndarray:
    """float32 -> nearest bf16 (ties to even) -> float32, by the bits."""
    b = v.astype(np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32)


def test_rows_below_fp16_rounding_expect_pass_at_fp16_and_their_sized_variants_fail():
    t = table()
    rows = {r[0]: r for r in t.FAULTS}
    for small, sized in (("BatchNorm eps 1e-5 -> 1e-3", "BatchNorm eps 1e-5 -> 1e-2"), ("bias +1e-3", "bias +1e-2"),
                         ("+5e-5 on one layer's output", "+2e-2 on one layer's output")):
        assert t.expectation(rows[small], "fp16") == (None, None, None)      # PASS expected
        at32 = t.expectation(rows[small], "fp32")[0]
        assert at32 and t.expectation(rows[sized], "fp16")[0] == at32 == t.expectation(rows[sized], "fp32")[0]
        assert t.expectation(rows[sized], "fp16")[1] is not None               # a label, at both dtypes
    for below in ("GELU -> tanh", "conv output rounded to fp16 and back", "conv output rounded to bf16 and back"):
        assert t.expectation(rows[below], "fp16") == (None, None, None)       # no fp16-sized variant
    assert t.expectation(rows["conv output rounded to bf16 and back"], "fp32") == ("layer1.0.conv1", "narrow_format",
                                                                                  "bf16")
    # a fault above fp16's rounding keeps its origin at fp16 (the old 7-tuple rows)
    assert t.expectation(rows["conv weight x1.05"], "fp16") == ("layer1.0.conv1", "scale", None)


def test_quantised_set_runs_each_dtype_on_its_provider():
    t = table()
    assert {t.PROVIDER[d] for d in ("int4_weight", "int8_dynamic", "int8_static")} == {"ort_int4", "ort_int8"}
    rows = {r[0]: r for r in t.SETS["issue35q"]}
    assert rows["unfaulted"][2] is None and all(t.expectation(rows["unfaulted"], d) == (None, None, None)
                                                for d in t.QUANT)
    for d in t.QUANT:
        assert t.expectation(rows["up_proj weight x1.1"], d) == (t.UP0, "scale", None)
        assert t.expectation(rows["SiLU -> Sigmoid"], d)[1] == "op_substitution"


def test_fp16_round_bf16_rounds_to_bf16(model_dir):  # noqa: F811
    layers = onnx.load(str(model_dir / "layers.onnx"))
    clean = run(model_dir / "layers.onnx", X)
    m, change = inject(layers, "fp16_round", "conv2", fmt="bf16")
    assert change["format"] == "bf16" and "bf16" in change["change"]
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in s.get_outputs()], s.run(None, {"input": X})))["conv2"]
    np.testing.assert_array_equal(got, bf16(clean["conv2"]))
    assert not np.array_equal(got, clean["conv2"].astype(np.float16).astype(np.float32))
    with pytest.raises(FaultError, match="--format 'fp8'"):
        inject(layers, "fp16_round", "conv2", fmt="fp8")


def test_cli_format_choices(model_dir, tmp_path):  # noqa: F811
    r = subprocess.run([sys.executable, "-m", "parity.analysis.faults", "--model-dir", str(model_dir), "--fault",
                        "fp16_round", "--target", "conv2", "--format", "fp8", "--out", str(tmp_path / "m")],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "--format" in r.stderr and "bf16" in r.stderr
    assert not (tmp_path / "m").exists()
