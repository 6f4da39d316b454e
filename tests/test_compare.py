"""Comparison: atol and rtol together, NaN/Inf handling, drift origin and worst layer."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
from conftest import ROOT, env

from parity.core import compare


def layer(name, order, actual, expected, atol=1e-5, rtol=1e-3, max_mismatch=0.0):
    return compare.compare_layer(name, order, [(0, np.asarray(actual, np.float32), np.asarray(expected, np.float32))],
                                 atol, rtol, "test", max_mismatch)


def test_pass_needs_atol_plus_rtol_times_reference():
    ref = np.array([1000.0, 1e-6, 0.0])
    # 0.5 off at 1000 is within rtol 1e-3 (allowed 1.00001); an absolute-only check would flag it
    assert layer("a", 0, ref + [0.5, 0, 0], ref).passed
    d = layer("a", 0, ref + [2.0, 0, 0], ref)
    assert not d.passed and d.n_outside == 1 and math.isclose(d.frac_outside, 1 / 3)
    assert d.worst_index == [0] and d.tol_ratio > 1.9


def test_metrics_values():
    d = layer("a", 0, [1.0, 2.0, 2.0], [1.0, 2.0, 4.0])
    assert d.max_abs == 2.0 and math.isclose(d.mean_abs, 2 / 3) and d.max_rel == 0.5
    assert math.isclose(d.rel_l2, 2 / math.sqrt(21))
    assert math.isclose(d.cosine, (1 + 4 + 8) / (3 * math.sqrt(21)))


def test_max_mismatch_allows_a_fraction_of_elements():
    ref = np.zeros(100)
    act = ref.copy()
    act[:2] = 1.0
    assert not layer("a", 0, act, ref).passed
    assert layer("a", 0, act, ref, max_mismatch=0.02).passed


def test_nan_in_output_fails_and_is_counted():
    d = layer("a", 0, [np.nan, 1.0], [0.0, 1.0])
    assert not d.passed and d.nan_actual == 1 and d.tol_ratio == math.inf
    # matching infinities are equal; NaN never matches (torch.testing's equal_nan=False)
    assert layer("a", 0, [np.inf, 1.0], [np.inf, 1.0]).passed
    assert not layer("a", 0, [np.nan], [np.nan]).passed


def test_shape_mismatch_is_a_failure_with_a_reason():
    d = compare.compare_layer("a", 0, [(0, np.zeros((2, 3)), np.zeros((3, 2)))], 1e-5, 1e-3, "t")
    assert not d.passed and "shape mismatch" in d.problem


def test_drift_origin_is_first_failing_layer_in_execution_order_and_worst_is_largest_ratio():
    ok = np.ones(4)
    layers = [layer("c", 2, ok * 3, ok), layer("a", 0, ok, ok), layer("b", 1, ok * 1.01, ok),
              layer("output", 3, ok * 2, ok)]
    s = compare.summarize(layers, {"output"})
    assert s["drift_origin"] == "b" and s["worst_layer"] == "c"
    assert s["layers"] == 3 and s["layers_failed"] == 2 and s["failed"] == ["b", "c", "output"]
    only_output = compare.summarize([layer("a", 0, ok, ok), layer("output", 1, ok * 2, ok)], {"output"})
    assert only_output["drift_origin"] == "output"
    clean = compare.summarize([layer("a", 0, ok, ok)], {"output"})
    assert clean["passed"] and clean["drift_origin"] is None and clean["worst_layer"] is None


def test_metrics_do_not_depend_on_the_thread_count():
    """A layer's metrics are the same bytes whatever the BLAS thread count (the core count, OMP_NUM_THREADS,
    `parity repro -j N`): large layers (resnet18: 800k values) once went through a multi-threaded dot."""
    code = ("import json, numpy as np; from parity.core import compare; r = np.random.default_rng(0); "
            "b = r.standard_normal(1_000_003).astype(np.float32); a = b + 1e-4 * r.standard_normal(b.size).astype(np.float32); "
            "m = compare.compare_arrays(a, b, 1e-5, 1e-3); print(json.dumps([m['rel_l2'].hex(), m['cosine'].hex()]))")
    got = {t: json.loads(subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                                        env={**env(), "OMP_NUM_THREADS": t, "OPENBLAS_NUM_THREADS": t}).stdout)
           for t in ("1", "2", "4")}
    assert got["1"] == got["2"] == got["4"], got


def test_worst_element_values_and_error_histogram_over_samples():
    """What the report shows of a failing layer: the values at its worst element (in the sample that
    holds it) and element counts per decade of |a - b| / allowed, which sum to every element, with
    the ones past the tolerance equal to n_outside."""
    rng = np.random.default_rng(0)
    b0, b1 = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 3, 4))
    a0, a1 = b0 + 1e-7, b1.copy()
    a1[1, 2, 3] += 0.5    # the worst element, in sample 1
    a1[0, 0, 0] += 0.01   # outside too, but less so
    pairs = [(0, a0.astype(np.float32), b0.astype(np.float32)), (1, a1.astype(np.float32), b1.astype(np.float32))]
    d = compare.compare_layer("x", 0, pairs, 1e-5, 1e-3, "test")
    assert (d.worst_sample, d.worst_index) == (1, [1, 2, 3])
    assert d.worst_actual == float(np.float32(a1[1, 2, 3])) and d.worst_expected == float(np.float32(b1[1, 2, 3]))
    assert len(d.hist) == len(compare.HIST_EDGES) + 1 and sum(d.hist) == d.numel == 48
    outside = sum(n for n, lo in zip(d.hist, (0.0,) + compare.HIST_EDGES) if lo >= 1.0)
    assert outside == d.n_outside == 2
    # the highest non-empty bin is the worst element's decade
    assert max(i for i, n in enumerate(d.hist) if n) == sum(e < d.tol_ratio for e in compare.HIST_EDGES)
