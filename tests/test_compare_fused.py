"""The fused, blocked compare (parity.core.compare.compare_layer) against the implementation it replaced
(kept below, verbatim, as the oracle) on random and adversarial arrays.

Documented precision (parity.core.compare.compare_arrays): max_abs, max_rel, tol_ratio, n_outside,
frac_outside, hist, the NaN/Inf counts, the worst element's sample, index and values, passed: bit
for bit.
mean_abs, rel_l2 and cosine (sums added block by block, in another order): relative 1e-12."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
from conftest import ROOT, env

from parity.core import compare

EXACT = ("max_abs", "max_rel", "tol_ratio", "n_outside", "frac_outside", "numel", "nan_actual", "inf_actual",
         "nan_expected", "inf_expected", "worst_index", "worst_sample", "worst_actual", "worst_expected", "hist",
         "passed", "problem", "shape")


# ---- the oracle: parity/core/compare.py's compare_arrays/compare_layer before the fused compare (as of
# main 2115912, with the ratio histogram and the worst element's values) ----
def _old_dot(x, y):
    return float(np.einsum("i,i->", x, y))


def _old_ratio_histogram(ratio):
    above = [int(np.count_nonzero(~(ratio <= e))) for e in compare.HIST_EDGES]
    return [int(ratio.size) - above[0]] + [above[i] - above[i + 1] for i in range(len(above) - 1)] + [above[-1]]


def old_compare_arrays(actual, expected, atol, rtol):
    a = np.asarray(actual, dtype=np.float64).ravel()
    b = np.asarray(expected, dtype=np.float64).ravel()
    fin_a, fin_b = np.isfinite(a), np.isfinite(b)
    if fin_a.all() and fin_b.all():
        both = None
        diff = np.abs(a - b)
        absb = np.abs(b)
        nonfinite_bad = None
        out = {"nan_actual": 0, "inf_actual": 0, "nan_expected": 0, "inf_expected": 0}
    else:
        both = fin_a & fin_b
        out = {
            "nan_actual": int(np.isnan(a).sum()), "inf_actual": int(np.isinf(a).sum()),
            "nan_expected": int(np.isnan(b).sum()), "inf_expected": int(np.isinf(b).sum()),
        }
        nonfinite_bad = ~both & ~((a == b) & ~np.isnan(a))
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.where(both, np.abs(a - b), 0.0)
        absb = np.abs(np.where(both, b, 0.0))
        a, b = np.where(both, a, 0.0), np.where(both, b, 0.0)
    allowed = absb * rtol
    allowed += atol
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = diff / allowed
    if atol <= 0:
        ratio[np.isnan(ratio)] = 0.0
    if nonfinite_bad is not None:
        ratio[nonfinite_bad] = np.inf
    n_out = int(np.count_nonzero(ratio > 1.0))
    worst = int(np.argmax(ratio)) if ratio.size else 0
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = diff / absb
    rel = rel[absb > 0]
    sq_ref = _old_dot(b, b)
    sq_diff = _old_dot(diff, diff) if nonfinite_bad is None or not nonfinite_bad.any() else math.inf
    na, nb = math.sqrt(_old_dot(a, a)), math.sqrt(sq_ref)
    cosine = 1.0 if na == nb == 0.0 else (0.0 if na == 0.0 or nb == 0.0 else _old_dot(a, b) / (na * nb))
    out.update(
        max_abs=float(diff.max()) if diff.size else 0.0,
        mean_abs=(float(diff.mean()) if both is None else float(diff[both].mean()) if both.any() else 0.0),
        max_rel=float(rel.max()) if rel.size else 0.0,
        rel_l2=(math.sqrt(sq_diff / sq_ref) if sq_ref > 0 else (0.0 if sq_diff == 0 else math.inf)),
        cosine=cosine, tol_ratio=float(ratio.max()) if ratio.size else 0.0, n_outside=n_out,
        numel=int(a.size), sq_diff=sq_diff, sq_ref=sq_ref, worst_flat=worst, hist=_old_ratio_histogram(ratio),
    )
    return out


def old_compare_layer(name, order, pairs, atol, rtol, tol_source, max_mismatch=0.0):
    shape = list(pairs[0][2].shape) if pairs else []
    d = compare.LayerDiff(name=name, order=order, shape=shape, numel=0, atol=atol, rtol=rtol, tol_source=tol_source)
    if not pairs:
        d.passed, d.problem = False, "no samples"
        return d
    sum_abs, sq_diff, sq_ref = 0.0, 0.0, 0.0
    cos = []
    for sample, actual, expected in pairs:
        if tuple(actual.shape) != tuple(expected.shape):
            d.passed = False
            d.problem = f"shape mismatch: actual {list(actual.shape)} vs reference {list(expected.shape)}"
            return d
        m = old_compare_arrays(actual, expected, atol, rtol)
        if m["tol_ratio"] >= d.tol_ratio and (m["tol_ratio"] > d.tol_ratio or not d.worst_index):
            d.tol_ratio = m["tol_ratio"]
            d.worst_sample = sample
            d.worst_index = [int(i) for i in np.unravel_index(m["worst_flat"], expected.shape)] if expected.size else []
        d.hist = [x + y for x, y in zip(d.hist or [0] * len(m["hist"]), m["hist"])]
        d.max_abs = max(d.max_abs, m["max_abs"])
        d.max_rel = max(d.max_rel, m["max_rel"])
        d.n_outside += m["n_outside"]
        d.numel += m["numel"]
        for k in ("nan_actual", "inf_actual", "nan_expected", "inf_expected"):
            setattr(d, k, getattr(d, k) + m[k])
        sum_abs += m["mean_abs"] * m["numel"]
        sq_diff += m["sq_diff"]
        sq_ref += m["sq_ref"]
        cos.append(m["cosine"])
    if d.numel:
        _, actual, expected = next(p for p in pairs if p[0] == d.worst_sample)
        d.worst_actual = float(actual[tuple(d.worst_index)])
        d.worst_expected = float(expected[tuple(d.worst_index)])
    d.mean_abs = sum_abs / d.numel if d.numel else 0.0
    d.rel_l2 = math.sqrt(sq_diff / sq_ref) if sq_ref > 0 else (0.0 if sq_diff == 0 else math.inf)
    d.cosine = min(cos)
    d.frac_outside = d.n_outside / d.numel if d.numel else 0.0
    unexpected_nonfinite = (d.nan_actual + d.inf_actual) > (d.nan_expected + d.inf_expected)
    d.passed = d.frac_outside <= max_mismatch and not unexpected_nonfinite
    return d
# ---- end of the oracle ----


def _close(x: float, y: float, rel: float) -> bool:
    if math.isnan(x) or math.isnan(y) or math.isinf(x) or math.isinf(y):
        return (math.isnan(x) and math.isnan(y)) or x == y
    return abs(x - y) <= rel * max(abs(x), abs(y))


def check(pairs, atol=1e-5, rtol=1e-3, max_mismatch=0.0):
    with warnings.catch_warnings():  # the old code warned on empty and overflowing inputs
        warnings.simplefilter("ignore", RuntimeWarning)
        want = old_compare_layer("l", 0, pairs, atol, rtol, "t", max_mismatch).as_dict()
    got = compare.compare_layer("l", 0, pairs, atol, rtol, "t", max_mismatch).as_dict()
    for k in EXACT:
        w, g = want[k], got[k]
        same = (isinstance(w, float) and math.isnan(w) and math.isnan(g)) or (w == g and type(w) is type(g))
        assert same, f"{k}: fused {g!r} vs old {w!r}"
    for k in ("mean_abs", "rel_l2", "cosine"):
        assert _close(got[k], want[k], rel=1e-12), f"{k}: fused {got[k]!r} vs old {want[k]!r}"
    return got


@pytest.fixture(params=[65536, 1000, 7], ids=["chunk64k", "chunk1000", "chunk7"])
def chunk(request, monkeypatch):
    """Block sizes: the default, and small ones so every case spans many blocks."""
    monkeypatch.setattr(compare, "CHUNK", request.param)
    return request.param


SIZES = (0, 1, 7, 999, 1000, 1001, 4099, 70_000, 200_003)


@pytest.mark.parametrize("n", SIZES)
def test_random_float32_pairs_match_the_old_compare(chunk, n):
    r = np.random.default_rng(n)
    b = r.standard_normal((2, n)).astype(np.float32) * np.float32(3)
    a = (b + r.standard_normal(b.shape).astype(np.float32) * np.float32(2e-3)).astype(np.float32)
    check([(0, a[0], b[0]), (1, a[1], b[1])])
    check([(0, a[0], b[0])], atol=0.0, rtol=0.0)
    check([(0, a[0], b[0])], atol=1e-2, rtol=0.0, max_mismatch=0.1)


def test_adversarial_values_match_the_old_compare(chunk):
    r = np.random.default_rng(7)
    n = 5003
    b = r.standard_normal(n).astype(np.float32)
    a = b.copy()
    a[::97] += np.float32(1e-2)
    cases = {}
    x, y = a.copy(), b.copy()
    x[[3, 1500, 4000]] = np.nan
    cases["nan in actual"] = (x, y)
    x, y = a.copy(), b.copy()
    y[[10, 2000]] = np.nan
    x[10] = np.nan
    cases["nan in both"] = (x, y)
    x, y = a.copy(), b.copy()
    x[[5, 6, 7]], y[[5, 6, 7]] = (np.inf, -np.inf, np.inf), (np.inf, -np.inf, -np.inf)
    cases["matching and opposite infinities"] = (x, y)
    x, y = a.copy(), b.copy()
    y[[100, 4500]] = np.inf
    cases["inf in reference only"] = (x, y)
    x, y = a.copy(), b.copy()
    y[::3], x[::6] = 0, 0
    cases["zeros in the reference, some not in the actual (max_rel over b != 0)"] = (x, y)
    cases["all zeros"] = (np.zeros(n, np.float32), np.zeros(n, np.float32))
    cases["actual zero"] = (np.zeros(n, np.float32), b)
    cases["reference zero"] = (a, np.zeros(n, np.float32))
    big = np.float32(np.finfo(np.float32).max)
    cases["float32 max, opposite signs"] = (np.full(n, big), np.full(n, -big))
    cases["huge and tiny"] = (b * np.float32(1e37), b * np.float32(1e-44))
    cases["identical (tie for the worst index everywhere)"] = (b, b)
    x = b.copy()
    x[[17, 1017, 4017]] += np.float32(1.0)  # equal errors in different blocks: the first one is worst
    cases["equal worst elements"] = (x, b)
    for name, (x, y) in cases.items():
        for atol, rtol in ((1e-5, 1e-3), (0.0, 1e-3), (0.0, 0.0)):
            try:
                check([(0, x, y), (1, y, x)], atol, rtol)
            except AssertionError as e:
                raise AssertionError(f"{name} (atol {atol}, rtol {rtol}): {e}") from None


def test_fp16_and_float64_ranges_match_the_old_compare(chunk):
    r = np.random.default_rng(3)
    h = (r.standard_normal(3001) * 2000).astype(np.float16)
    h[::50] = np.float16(65504)
    h[1::50] = np.float16(6e-8)  # subnormal
    with np.errstate(over="ignore"):
        g = (h.astype(np.float32) * np.float32(1.001)).astype(np.float16)  # 65504 * 1.001 -> inf
    check([(0, g, h)], 1e-3, 1e-3)
    check([(0, g.astype(np.float32), h.astype(np.float32))], 1e-3, 1e-3)
    d = r.standard_normal(3001) * 1e200  # float64 inputs (op suites): squares overflow -> exact path
    check([(0, d * (1 + 1e-9), d)], 1e-5, 1e-3)
    check([(0, np.full(50, 1e300), np.full(50, -1e300))], 1e-5, 1e-3)
    check([(0, d, d * 1e-310)], 1e-5, 1e-3)


def test_shapes_and_empty():
    check([(0, np.zeros((2, 0, 3), np.float32), np.zeros((2, 0, 3), np.float32))])
    check([(0, np.float32(2.5).reshape(()), np.float32(2.0).reshape(()))])
    r = np.random.default_rng(1)
    b = r.standard_normal((4, 3, 50, 50)).astype(np.float32)
    d = check([(0, b * np.float32(1.01), b), (1, b + np.float32(1e-3), b)])
    assert d["worst_sample"] == 1 and len(d["worst_index"]) == 4
    assert compare.compare_layer("l", 0, [], 1e-5, 1e-3, "t").problem == "no samples"


def test_results_are_byte_identical_run_to_run():
    """Same arrays, same bytes: in one process and in a fresh one."""
    code = ("import json, numpy as np; from parity.core import compare; r = np.random.default_rng(0); "
            "b = r.standard_normal(300_001).astype(np.float32); a = b + 1e-4 * r.standard_normal(b.size).astype(np.float32); "
            "d = compare.compare_layer('x', 0, [(0, a, b), (1, b, a)], 1e-5, 1e-3, 't').as_dict(); "
            "print(json.dumps({k: v.hex() if isinstance(v, float) else v for k, v in d.items()}, sort_keys=True))")
    runs = {subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                           env=env()).stdout for _ in range(2)}
    assert len(runs) == 1, runs


def old_sq_add(actual, gold):
    """parity.core.oracle.Sq.add's sums before the blocked compare: (err, ref, nonfinite)."""
    g = np.asarray(gold, dtype=np.float64).ravel()
    d = np.asarray(actual, dtype=np.float64).ravel() - g
    fin = np.isfinite(d)
    bad = 0
    if not fin.all():
        bad = int((~fin & np.isfinite(g)).sum())
        d = np.where(fin, d, 0.0)
    return _old_dot(d, d), _old_dot(g, g), bad


@pytest.mark.parametrize("n", (0, 1, 999, 70_000))
def test_oracle_sums_match_the_old_ones(chunk, n):
    """The fp64 oracle's sums (float32 values against float64 gold): relative 1e-12, counts exact."""
    r = np.random.default_rng(n)
    g = r.standard_normal(n) * 5
    a = (g + r.standard_normal(n) * 1e-6).astype(np.float32)
    cases = [(a, g)]
    if n > 10:
        x, y = a.copy(), g.copy()
        x[::7], y[::5], y[1] = np.nan, np.inf, np.nan
        x[2] = np.inf
        cases.append((x, y))
        cases.append((np.full(n, 3e38, np.float32), -g * 1e300))  # squares overflow to inf
    for x, y in cases:
        with np.errstate(all="ignore"):
            err, ref, bad = old_sq_add(x, y)
            got_err, got_bad = compare.sq_error(x, y)
            got_ref = compare.sum_sq(y)
        assert got_bad == bad
        assert _close(got_err, err, 1e-12) and _close(got_ref, ref, 1e-12), (got_err, err, got_ref, ref)
