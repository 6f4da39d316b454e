"""The fp64 oracle: a backend passes when it is as close to fp64 as the trusted backend at the same
precision (excess <= k), so a correct fp16 backend passes and a slightly broken one fails, with no
hand-tuned tolerance."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest import make_repo
from parity.core import dtypes
from parity.core import oracle
from test_drift_origin import weight_of

U16 = dtypes.FP16.u


def fp16_round(x):
    return x.astype(np.float16).astype(np.float32)


def test_same_rounding_as_the_baseline_passes_and_twice_the_error_is_excess_two():
    rng = np.random.default_rng(0)
    g = rng.standard_normal(10_000)
    base = g + 8 * U16 * rng.standard_normal(g.size)  # an accumulated error of ~8 ulps: above u * rms
    err = oracle.Sq().add(base, g)
    assert oracle.judge(err, oracle.Sq().add(base, g), U16, 4.0)["excess"] == 1.0
    worse = g + 2 * (base - g)  # twice the baseline's error, elementwise
    j = oracle.judge(oracle.Sq().add(worse, g), oracle.Sq().add(base, g), U16, 4.0)
    assert j["excess"] == pytest.approx(2.0) and j["passed"]
    bad = g + 5 * (base - g)
    assert not oracle.judge(oracle.Sq().add(bad, g), oracle.Sq().add(base, g), U16, 4.0)["passed"]


def test_an_exact_baseline_does_not_demand_zero_error():
    g = np.random.default_rng(1).standard_normal(4096)
    exact = oracle.Sq().add(g, g)  # e.g. a ReLU the baseline computes exactly
    rounded = oracle.Sq().add(fp16_round(g), g)
    j = oracle.judge(rounded, exact, U16, 4.0)
    assert j["passed"] and j["excess"] < 1  # rounding of the value itself: the u * rms floor
    assert j["bits_lost"] < 0  # rel_l2 of one rounding is below u


def test_nan_where_fp64_is_finite_fails_whatever_the_excess():
    g = np.ones(8)
    a = g.copy()
    a[3] = np.nan
    j = oracle.judge(oracle.Sq().add(a, g), oracle.Sq().add(g, g), U16, 4.0)
    assert not j["passed"] and j["nonfinite"] == 1


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    r = make_repo(tmp_path_factory.mktemp("oracle") / "repo", dtypes=("fp16",), providers=("ort_cpu",))
    r.repro()
    return r


def run_cell(repo, model_dir, tmp_path):
    cap, out = tmp_path / "capture", tmp_path / "diff"
    repo.run(["python", "-m", "stages.capture", "--model", "tiny_mlp", "--dtype", "fp16", "--provider", "ort_cpu",
              "--model-dir", str(model_dir), "--inputs", "artifacts/inputs/tiny_mlp.parquet", "--out", str(cap),
              "--timing", str(tmp_path / "t.json")])
    repo.run(["python", "-m", "stages.diff", "--model", "tiny_mlp", "--dtype", "fp16", "--provider", "ort_cpu",
              "--capture", str(cap), "--reference", "artifacts/reference/tiny_mlp",
              "--baseline", "artifacts/baseline/tiny_mlp/fp16", "--out", str(out)])
    return json.loads((out / "metrics.json").read_text())


def test_correct_fp16_backend_passes_without_any_tolerance_override(repo):
    m = json.loads((repo.path / "artifacts/diff/tiny_mlp-fp16-ort_cpu/metrics.json").read_text())
    assert m["verdict_mode"] == "oracle" and m["verdict"] == "PASS", m
    assert m["worst_tol_ratio"] > 1  # assert_close's fp16 tolerance vs fp32 would have failed it


def test_a_half_percent_weight_error_in_an_fp16_cell_fails_at_that_layer(repo, tmp_path):
    import onnx
    from onnx import numpy_helper

    model_dir = tmp_path / "model"
    shutil.copytree(repo.path / "artifacts/models/tiny_mlp", model_dir)
    for fname in ("layers.onnx", "model.onnx"):
        m = onnx.load(str(model_dir / fname))
        init = weight_of(m, "fc1")
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(1.005), init.name))
        onnx.save(m, str(model_dir / fname))
    m = run_cell(repo, model_dir, tmp_path)
    assert m["verdict"] == "FAIL" and m["drift_origin"] == "fc1", m
    assert m["output"]["excess"] > 4
