"""parity.ckernel, the compare's block loop in C: every metric the same bytes as the numpy path
(parity.compare without the kernel), on random and adversarial arrays of every dtype the captures
hold, at sizes around the block and leaf boundaries. The numpy path is itself checked against the
original implementation in tests/test_compare_fused.py."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest

from parity import ckernel, compare

pytestmark = pytest.mark.skipif(ckernel.load() is None, reason="no C compiler here: the compare runs on numpy")


def _numpy_only(fn, *args):
    saved = list(compare._KERNEL)
    compare._KERNEL[:] = [None]
    try:
        return fn(*args)
    finally:
        compare._KERNEL[:] = saved


def _same(x, y) -> bool:
    if isinstance(x, float) and isinstance(y, float):
        return (math.isnan(x) and math.isnan(y)) or (x == y and math.copysign(1, x) == math.copysign(1, y))
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_same(u, v) for u, v in zip(x, y))
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    return x == y


def _cases():
    rng = np.random.default_rng(7)
    C = compare.CHUNK
    for n in (1, 7, 8, 9, 127, 128, 129, 255, 256, 257, 1000, C - 1, C, C + 1, 3 * C + 17):
        b = rng.standard_normal(n).astype(np.float32)
        a = (b + rng.standard_normal(n).astype(np.float32) * np.float32(1e-4)).astype(np.float32)
        yield f"close-{n}", a, b
    n = 2 * compare.CHUNK + 5
    b = rng.standard_normal(n).astype(np.float32)
    yield "far", rng.standard_normal(n).astype(np.float32), b
    yield "equal", b.copy(), b
    z = np.zeros(n, np.float32)
    yield "zeros", z, z.copy()
    yield "zero-ref", b, z
    yield "zero-act", z, b
    a = b.copy()
    a[::97] = 0.0
    b2 = b.copy()
    b2[::89] = 0.0
    yield "some-zeros", a, b2
    huge = (rng.uniform(-1, 1, n) * 3e38).astype(np.float32)
    yield "huge-f32", huge, (huge * np.float32(0.999)).astype(np.float32)
    tiny = (rng.standard_normal(n) * 1e-40).astype(np.float32)  # float32 subnormals
    yield "subnormal", tiny, (tiny * np.float32(1.5)).astype(np.float32)
    for bad in (np.nan, np.inf, -np.inf):
        a = b.copy()
        a[[3, compare.CHUNK + 11]] = bad
        yield f"act-{bad}", a, b
        yield f"ref-{bad}", b, a
        yield f"both-{bad}", a, a.copy()
    wide = rng.standard_normal(n) * 1e160  # float64 sums of squares overflow
    yield "huge-f64", wide, wide * (1 + 1e-9)
    d = rng.standard_normal(n)
    yield "f64", d + 1e-7 * rng.standard_normal(n), d
    h = rng.standard_normal(n).astype(np.float16)
    yield "f16-vs-f32", h, h.astype(np.float32) + np.float32(1e-3)
    yield "f16", h, (h * np.float16(1.001)).astype(np.float16)
    yield "strided", b[::2], (b[::2] + np.float32(1e-5)).astype(np.float32)
    yield "2d", b[:C].reshape(256, -1), (b[:C] * np.float32(1.0001)).reshape(256, -1)


@pytest.mark.parametrize("atol,rtol", [(1e-5, 1e-3), (0.0, 0.0), (0.0, 1e-2), (1e-3, 0.0), (1e-8, 1e-6)])
def test_the_kernel_gives_the_numpy_paths_bytes(atol, rtol):
    assert compare._kernel() is not None  # the kernel is what compare_arrays runs here
    failures = []
    for name, a, b in _cases():
        got = compare.compare_arrays(a, b, atol, rtol)
        want = _numpy_only(compare.compare_arrays, a, b, atol, rtol)
        if not _same(got, want):
            failures.append((name, {k: (got[k], want[k]) for k in got if not _same(got[k], want[k])}))
    assert not failures, failures


def test_compare_layer_over_samples_is_the_same_with_and_without_the_kernel():
    rng = np.random.default_rng(3)
    pairs = []
    for s in range(3):
        b = rng.standard_normal((2, 64, 40, 40)).astype(np.float32)
        a = (b + rng.standard_normal(b.shape).astype(np.float32) * np.float32(3e-4 * (s + 1))).astype(np.float32)
        pairs.append((s, a, b))
    got = compare.compare_layer("l", 0, pairs, 1e-5, 1e-3, "t").as_dict()
    want = _numpy_only(compare.compare_layer, "l", 0, pairs, 1e-5, 1e-3, "t").as_dict()
    assert _same(got, want)
    assert got["n_outside"] > 0 and not got["passed"]


def test_the_library_is_built_once_into_the_cache_and_found_again(tmp_path, monkeypatch):
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path))
    first = ckernel.build()
    assert first is not None and first.parent == tmp_path and first.stat().st_size > 0
    mtime = first.stat().st_mtime_ns
    assert ckernel.build() == first and first.stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary left behind


def test_without_a_compiler_the_compare_falls_back_to_numpy(tmp_path, monkeypatch):
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert ckernel.build() is None
    assert list(tmp_path.iterdir()) == []
    assert shutil.which("cc") or shutil.which("gcc")  # the machine's own compiler built the one in use


def test_a_compiler_that_fails_is_tried_once_not_by_every_diff_process(tmp_path, monkeypatch):
    cc = tmp_path / "badcc"
    calls = tmp_path / "calls"
    cc.write_text(f"#!/bin/sh\necho x >> {calls}\nexit 1\n")
    cc.chmod(0o755)
    cache = tmp_path / "cache"
    monkeypatch.setenv("PARITY_CACHE_DIR", str(cache))
    monkeypatch.setenv("CC", str(cc))
    assert ckernel.build() is None
    assert ckernel.build() is None
    assert calls.read_text().count("x") == 2  # both flag sets, once
    assert [p.suffix for p in cache.iterdir()] == [".failed"]
