"""Compare captured tensors against the reference. numpy only (no torch).

A layer passes when the fraction of elements outside |a - b| <= atol + rtol * |b| is at most
`max_mismatch` (0 by default, as torch.testing.assert_close) and `a` has no NaN/Inf where `b` is
finite. Metrics are computed in float64:
  max_abs   max |a - b|                      mean_abs  mean |a - b|
  max_rel   max |a - b| / |b| over b != 0    rel_l2    ||a - b|| / ||b||
  cosine    <a, b> / (||a|| ||b||)           tol_ratio max |a - b| / (atol + rtol |b|) (<= 1 passes)
  frac_outside, n_outside, nan/inf counts of both sides, the worst element's index and its values
  (worst_actual, worst_expected; allowed there = atol + rtol |worst_expected|), and `hist`: element
  counts per decade of |a - b| / allowed (HIST_EDGES).

Speed and precision: one fused pass per (actual, expected) pair, in blocks of CHUNK elements cast
to float64 in cache (compare_arrays). Element-wise values are the unblocked float64 ones, so
max_abs, max_rel, tol_ratio, n_outside, hist, the NaN/Inf counts and the worst index are exact (bit
for bit what one whole-array float64 pass gives); the sums behind mean_abs, rel_l2 and cosine are
added per block with numpy's pairwise sum and then across blocks, which agrees with a whole-array
sum to a relative 1e-12 (tests/test_compare_fused.py checks both against the implementation this
replaced, on random and adversarial arrays). No BLAS: every reduction runs on one thread in a fixed
order, so the same arrays give the same bytes whatever the thread count or the machine's load.
"""

from __future__ import annotations

import math
import threading
from dataclasses import asdict, dataclass, field

import numpy as np

METRICS = ("max_abs", "mean_abs", "max_rel", "rel_l2", "cosine", "tol_ratio", "frac_outside")
# `hist` bins: |a - b| / allowed <= 1e-6, (1e-6, 1e-5], ..., (1e2, 1e3], > 1e3 (11 counts; the ones
# above 1 sum to n_outside). Decades of the ratio to the tolerance: the same scale for every dtype.
HIST_EDGES = tuple(10.0 ** e for e in range(-6, 4))


@dataclass
class LayerDiff:
    name: str
    order: int
    shape: list[int]
    numel: int
    atol: float
    rtol: float
    tol_source: str
    max_abs: float = 0.0
    mean_abs: float = 0.0
    max_rel: float = 0.0
    rel_l2: float = 0.0
    cosine: float = 1.0
    tol_ratio: float = 0.0
    frac_outside: float = 0.0
    n_outside: int = 0
    nan_actual: int = 0
    inf_actual: int = 0
    nan_expected: int = 0
    inf_expected: int = 0
    worst_index: list[int] = field(default_factory=list)
    worst_sample: int = 0
    worst_actual: float = 0.0      # the values at worst_sample/worst_index (the highest tol_ratio)
    worst_expected: float = 0.0
    hist: list[int] | None = None  # element counts per HIST_EDGES decade, summed over samples
    passed: bool = True            # by the cell's verdict mode (diff.verdict)
    problem: str = ""  # set when the layer could not be compared (missing, shape mismatch)
    passed_tolerance: bool = True  # the assert_close-style check, whatever the mode
    oracle: dict | None = None     # fp64 oracle metrics (parity.core.oracle.judge), when judged

    def as_dict(self) -> dict:
        return asdict(self)


def dot(x: np.ndarray, y: np.ndarray) -> float:
    """x . y of 1-D float64 arrays, in a summation order fixed by numpy, not by the machine. np.dot
    hands large vectors to OpenBLAS, which splits them over its threads (OMP_NUM_THREADS, the core
    count, `parity repro -j N`): the last bits of rel_l2/cosine changed with the thread count, and a
    threaded ddot was 25-100x slower on a loaded 2-core machine. einsum: one thread, no temporary."""
    return float(np.einsum("i,i->", x, y))


# Elements per block of the fused compare: five float64 rows of 512 KiB (2.5 MiB, in L2/L3 cache),
# large enough that numpy's per-call overhead (~1 us, ~25 calls a block) stays a few percent of the
# work. Best of 15 on an 802,816-element float32 pair here: 8K blocks 1.2 GB/s, 16K 1.5, 64K 1.8.
CHUNK = 65536
_ONE = HIST_EDGES.index(1.0) if 1.0 in HIST_EDGES else None  # the hist edge that is the pass/fail line


_WORK = threading.local()


def _work(rows: int, step: int) -> np.ndarray:
    """A (rows, step) float64 work buffer, kept per thread: a fresh 2.5 MiB one every call cost
    ~50 us in page faults, ~7% of comparing resnet18's layers."""
    buf = getattr(_WORK, "buf", None)
    if buf is None or buf.size < rows * step:
        buf = _WORK.buf = np.empty(max(rows * step, 5 * CHUNK))
    return buf[:rows * step].reshape(rows, step)


def _flags(n: int) -> np.ndarray:
    """A bool work buffer of n elements, kept per thread (a fresh one per comparison was 2.5x slower)."""
    buf = getattr(_WORK, "flags", None)
    if buf is None or buf.size < n:
        buf = _WORK.flags = np.empty(max(n, CHUNK), dtype=bool)
    return buf[:n]


class _Sample:
    """Running sums and extremes of one (actual, expected) pair, filled block by block. Every
    element-wise value is computed exactly as an unblocked float64 pass would; only the sums
    (|a-b|, (a-b)^2, b^2, a^2, a.b) are added per block, then across blocks, in a fixed order."""

    def __init__(self, numel: int):
        self.numel = numel
        self.nan_a = self.inf_a = self.nan_b = self.inf_b = 0
        self.n_out = 0
        self.above = [0] * len(HIST_EDGES)  # elements with ratio > edge (NaN included), per HIST_EDGES
        self.tol_ratio, self.worst = -1.0, 0
        self.max_abs = 0.0
        self.max_rel = -1.0  # none yet (no b != 0)
        self.sum_abs, self.n_both = 0.0, 0
        self.sq_diff = self.sq_ref = self.sq_act = self.prod = 0.0
        self.bad = False  # a non-finite value that does not match (NaN, inf vs finite, +inf vs -inf)

    def ratio(self, r: np.ndarray, offset: int) -> None:
        """tol_ratio, its first index (NaN ranks highest, as np.argmax), the count above 1 and the
        counts above each hist edge, counted only up to the block's largest ratio."""
        v = float(np.maximum.reduce(r))  # NaN if any (np.maximum propagates it)
        if (v != v and self.tol_ratio == self.tol_ratio) or v > self.tol_ratio:
            i = int(np.argmax(r))  # its first index; rarely needed after the first blocks
            self.tol_ratio, self.worst = float(r[i]), offset + i
        over_one = None
        flags = _flags(r.size)
        for k, e in enumerate(HIST_EDGES):
            if v == v and not v > e:
                break  # no element above this edge, nor above the larger ones
            if v == v:
                n = int(np.count_nonzero(np.greater(r, e, out=flags)))
            else:  # NaN counts above every edge
                n = r.size - int(np.count_nonzero(np.less_equal(r, e, out=flags)))
            self.above[k] += n
            if k == _ONE and v == v:
                over_one = n
        if over_one is None and (v > 1.0 or v != v):
            over_one = int(np.count_nonzero(r > 1.0))
        self.n_out += over_one or 0

    def rel(self, rel: np.ndarray, absb: np.ndarray) -> None:
        """max |a-b| / |b| over b != 0. `rel` holds inf (b == 0, a != b) and NaN (b == a == 0) there."""
        m = float(np.fmax.reduce(rel)) if rel.size else math.nan
        if m == math.inf:  # a b == 0 element, or a real overflow (float64 inputs): mask exactly
            keep = absb > 0
            m = float(rel[keep].max()) if keep.any() else math.nan
        if m == m and m > self.max_rel:
            self.max_rel = m

    def result(self) -> dict:
        sq_diff = math.inf if self.bad else self.sq_diff
        na, nb = math.sqrt(self.sq_act), math.sqrt(self.sq_ref)
        cosine = 1.0 if na == nb == 0.0 else (0.0 if na == 0.0 or nb == 0.0 else self.prod / (na * nb))
        sq_ref = self.sq_ref
        return {
            "nan_actual": self.nan_a, "inf_actual": self.inf_a, "nan_expected": self.nan_b, "inf_expected": self.inf_b,
            "max_abs": self.max_abs, "mean_abs": self.sum_abs / self.n_both if self.n_both else 0.0,
            "max_rel": max(self.max_rel, 0.0),
            "rel_l2": math.sqrt(sq_diff / sq_ref) if sq_ref > 0 else (0.0 if sq_diff == 0 else math.inf),
            "cosine": cosine, "tol_ratio": max(self.tol_ratio, 0.0) if self.tol_ratio == self.tol_ratio else math.nan,
            "n_outside": self.n_out, "numel": self.numel, "sq_diff": sq_diff, "sq_ref": sq_ref,
            "worst_flat": self.worst,
            "hist": [self.numel - self.above[0]] + [x - y for x, y in zip(self.above, self.above[1:])] + [self.above[-1]],
        }


def _block(s: _Sample, xy: np.ndarray, w: np.ndarray, offset: int, atol: float, rtol: float) -> bool:
    """One block of finite values (xy: actual and expected rows, float64; w: 3 work rows). False,
    with nothing added, when a sum of squares is not finite: a NaN/Inf (a float32/float16 square
    cannot overflow a float64 sum), or float64 values near 1e154; _block_nonfinite takes those."""
    x, y = xy
    d, t, u = w[0, :x.size], w[1, :x.size], w[2, :x.size]
    sq = np.add.reduce(np.multiply(xy, xy, out=w[1:, :x.size]), axis=1)  # a^2, b^2 (pairwise sums)
    saa, sbb = float(sq[0]), float(sq[1])
    np.subtract(x, y, out=d)
    sdd = _sumsq(d, t)
    if not math.isfinite(saa + sbb + sdd):
        return False
    s.sq_act += saa
    s.sq_ref += sbb
    s.sq_diff += sdd
    if sdd <= (saa + sbb) / 4:  # a close to b: a.b from the sums above, to ~1e-14 relative
        s.prod += (saa + sbb - sdd) / 2
    else:  # far apart (or one much larger): that identity would cancel; a product pass
        s.prod += float(np.add.reduce(np.multiply(x, y, out=t)))
    np.abs(d, out=d)
    np.abs(y, out=u)
    np.multiply(u, rtol, out=t)
    t += atol
    np.divide(d, t, out=t)
    if atol <= 0:  # 0/0 where both the reference and the error are zero
        t[np.isnan(t)] = 0.0
    s.ratio(t, offset)
    s.max_abs = max(s.max_abs, float(np.maximum.reduce(d)))
    s.sum_abs += float(np.add.reduce(d))
    s.n_both += x.size
    np.divide(d, u, out=t)
    s.rel(t, u)
    return True


def _sumsq(x: np.ndarray, tmp: np.ndarray) -> float:
    """sum(x * x): a product pass into `tmp` and numpy's pairwise sum (one thread, a fixed order)."""
    return float(np.add.reduce(np.multiply(x, x, out=tmp)))


def _block_nonfinite(s: _Sample, x: np.ndarray, y: np.ndarray, offset: int, atol: float, rtol: float) -> None:
    """A block with NaN/Inf (or huge float64 values): the unblocked algorithm's masked formulas."""
    fin_a, fin_b = np.isfinite(x), np.isfinite(y)
    both = fin_a & fin_b
    s.nan_a += int(np.isnan(x).sum())
    s.inf_a += int(np.isinf(x).sum())
    s.nan_b += int(np.isnan(y).sum())
    s.inf_b += int(np.isinf(y).sum())
    # Non-finite values match only when both sides hold the same value (inf == inf); NaN never does.
    bad = ~both & ~((x == y) & ~np.isnan(x))
    diff = np.where(both, np.abs(x - y), 0.0)
    absb = np.abs(np.where(both, y, 0.0))
    x, y = np.where(both, x, 0.0), np.where(both, y, 0.0)
    allowed = absb * rtol
    allowed += atol
    ratio = diff / allowed
    if atol <= 0:
        ratio[np.isnan(ratio)] = 0.0
    ratio[bad] = np.inf
    s.ratio(ratio, offset)
    s.rel(diff / absb, absb)
    s.bad = s.bad or bool(bad.any())
    s.max_abs = max(s.max_abs, float(diff.max()) if diff.size else 0.0)
    s.sum_abs += float(np.add.reduce(diff))
    s.n_both += int(np.count_nonzero(both))
    s.sq_diff += _sumsq(diff, allowed)
    s.sq_ref += _sumsq(y, allowed)
    s.sq_act += _sumsq(x, allowed)
    s.prod += float(np.add.reduce(np.multiply(x, y, out=allowed)))


def sum_sq(x: np.ndarray) -> float:
    """sum(x * x) in float64, block by block (one thread, a fixed order, no full-size temporary)."""
    x = np.ravel(x)
    step = min(CHUNK, max(int(x.size), 1))
    buf = _work(2, step)
    total = 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        for lo in range(0, x.size, step):
            v = buf[0, :min(step, x.size - lo)]
            np.copyto(v, x[lo:lo + step], casting="unsafe")
            total += _sumsq(v, buf[1, :v.size])
    return total


def sum_sq_max(x: np.ndarray) -> tuple[float, float]:
    """(sum(x * x), max |x| over the finite values, 0 when none) in one float64 pass, block by block:
    the fp64 oracle's sums of a reference value and its largest magnitude (the scale floor,
    parity.core.oracle)."""
    x = np.ravel(x)
    step = min(CHUNK, max(int(x.size), 1))
    buf = _work(2, step)
    total, top = 0.0, 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        for lo in range(0, x.size, step):
            v = buf[0, :min(step, x.size - lo)]
            np.copyto(v, x[lo:lo + step], casting="unsafe")
            s = _sumsq(v, buf[1, :v.size])
            np.abs(v, out=v)
            m = float(np.maximum.reduce(v)) if v.size else 0.0
            if not math.isfinite(s) or not math.isfinite(m):  # NaN/Inf: the finite values' max
                fin = v[np.isfinite(v)]
                m = float(fin.max()) if fin.size else 0.0
            total += s
            top = max(top, m)
    return total, top


def sq_error(actual: np.ndarray, expected: np.ndarray) -> tuple[float, int]:
    """(sum of (actual - expected)^2 over the elements where that difference is finite, how many
    differences are NaN/Inf where `expected` is finite), in float64 block by block. The fp64
    oracle's error sums (parity.core.oracle.Sq)."""
    a, b = np.ravel(actual), np.ravel(expected)
    step = min(CHUNK, max(int(a.size), 1))
    buf = _work(2, step)
    total, bad = 0.0, 0
    with np.errstate(over="ignore", invalid="ignore"):
        for lo in range(0, a.size, step):
            d, t = buf[0, :min(step, a.size - lo)], buf[1, :min(step, a.size - lo)]
            np.copyto(d, a[lo:lo + step], casting="unsafe")
            np.subtract(d, b[lo:lo + step], out=d)
            s = _sumsq(d, t)
            if not math.isfinite(s):
                fin = np.isfinite(d)
                if not fin.all():
                    bad += int(np.count_nonzero(~fin & np.isfinite(b[lo:lo + step])))
                    d[~fin] = 0.0
                    s = _sumsq(d, t)
            total += s
    return total, bad


def compare_arrays(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float) -> dict:
    """Metrics for one pair of same-shape arrays (one sample of one layer), in one fused pass over
    blocks of CHUNK elements: each input is read once (cast to float64 into a cache-resident
    buffer) and every metric comes from that block while it is in cache. Reductions run on one
    thread in numpy's own loops (no BLAS), so the bytes of every metric are the same run to run,
    whatever the thread count. Max-type values, counts and the worst index equal an unblocked
    float64 pass bit for bit; the sums (mean_abs, rel_l2, cosine) agree to a relative 1e-12
    (tests/test_compare_fused.py)."""
    a = np.ravel(actual)
    b = np.ravel(expected)
    s = _Sample(int(a.size))
    step = min(CHUNK, max(int(a.size), 1))
    buf = _work(5, step)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # inf/NaN are handled below
        for lo in range(0, a.size, step):
            hi = min(lo + step, a.size)
            xy = buf[:2, :hi - lo]
            np.copyto(xy[0], a[lo:hi], casting="unsafe")
            np.copyto(xy[1], b[lo:hi], casting="unsafe")
            if not _block(s, xy, buf[2:], lo, atol, rtol):
                _block_nonfinite(s, xy[0], xy[1], lo, atol, rtol)
    return s.result()


def compare_layer(name: str, order: int, pairs: list[tuple[int, np.ndarray, np.ndarray]],
                  atol: float, rtol: float, tol_source: str, max_mismatch: float = 0.0) -> LayerDiff:
    """Aggregate over samples: worst case for max-type metrics, element-weighted means."""
    shape = list(pairs[0][2].shape) if pairs else []
    d = LayerDiff(name=name, order=order, shape=shape, numel=0, atol=atol, rtol=rtol, tol_source=tol_source)
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
        m = compare_arrays(actual, expected, atol, rtol)
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


def summarize(layers: list[LayerDiff], output_names: set[str]) -> dict:
    """drift_origin: first failing layer in execution order (an output if only outputs fail);
    worst_layer: the layer with the highest tol_ratio (how far past its tolerance it is)."""
    ordered = sorted(layers, key=lambda d: d.order)
    inner = [d for d in ordered if d.name not in output_names]
    outs = [d for d in ordered if d.name in output_names]
    failed = [d for d in ordered if not d.passed]
    origin = next((d.name for d in inner if not d.passed), None)
    if origin is None:
        origin = next((d.name for d in outs if not d.passed), None)
    worst = max(ordered, key=lambda d: (d.tol_ratio, -d.order), default=None)
    if worst is not None and worst.tol_ratio == 0.0:
        worst = None  # bit-identical everywhere: no layer is "worst"
    return {
        "layers": len(inner),
        "layers_failed": sum(1 for d in inner if not d.passed),
        "failed": [d.name for d in failed],
        "drift_origin": origin,
        "worst_layer": worst.name if worst else None,
        "worst_tol_ratio": worst.tol_ratio if worst else 0.0,
        "passed": not failed,
    }
