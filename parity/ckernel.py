"""The compare's inner loop in C, compiled once per machine and loaded with ctypes (optional).

parity.compare works in numpy: ~18 passes over each 64K-element block (sums, ratios, the decade
histogram), ~1 GB/s of compared bytes. This kernel does the same block in one pass at several
GB/s. It computes every value with the same float64 operations in the same order as the numpy
path, the sums included (numpy's pairwise summation, replicated: 8 accumulators per 128-element
leaf, halves rounded down to a multiple of 8), so the metrics are the same bytes with or without it
(tests/test_ckernel.py checks that bit for bit on random and adversarial arrays). No -ffast-math;
-ffp-contract=off keeps a*b+c from becoming one rounding (FMA).

Built with the machine's C compiler (`cc`, or $CC) on first use into
$PARITY_CACHE_DIR or ~/.cache/parity (a file named by the hash of the source and flags, written
atomically: parallel diff processes may race to build it). No compiler, a failed build or
PARITY_NO_CKERNEL=1: parity.compare stays on its numpy path, with the same results.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NEDGES = 10  # len(parity.compare.HIST_EDGES); the edges are passed in

_HEAD = r"""
#include <math.h>
#include <stdint.h>

#define NE 10
#define PW 128
#define L 8

typedef struct {
    double aa, bb, dd, ab, ad;  /* pairwise sums of a^2, b^2, (a-b)^2, a*b, |a-b| */
    double max_abs, max_rel, max_ratio;
    int64_t worst, any_rel, bad;
    int64_t above[NE];          /* elements with ratio > edges[k] */
} Block;

typedef struct { double aa, bb, dd, ab, ad; } Sums;

typedef struct {
    double atol, rtol, best;
    const double *edges;
    int64_t worst, bad;
    double mabs[L], mrel[L];
    int64_t above[NE];
} Ctx;

#define C8(r) (((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7])))
"""

# One block of n elements of type $T, in one pass: numpy's pairwise summation (DOUBLE_pairwise_sum
# in numpy's loops_utils.h.src: below 8 elements a plain loop from 0.0, up to 128 eight
# accumulators combined as C8 then the tail, above that two halves, the first rounded down to a
# multiple of 8) of five derived sequences at once, and at each leaf (<= 128 elements, still in
# cache) the element-wise part: ratio |a-b| / (atol + rtol |b|), its max and first index (searched
# only in a leaf whose max beats the best so far), counts above each hist edge (up to the leaf's
# max), max |a-b|, max |a-b| / |b| over b != 0. Lane-wise loops the compiler vectorises without
# reordering any sum.
_BODY = r"""
static void elem_$S(const $T *xs, const $T *ys, int64_t m, int64_t off, Ctx *c) {
    double r[PW], q[PW], dd[PW];
    int64_t nan = 0;
    double rtol = c->rtol, atol = c->atol;
    for (int64_t i = 0; i < m; i++) {
        double d = fabs((double)xs[i] - (double)ys[i]), b = fabs((double)ys[i]);
        double t = b * rtol;
        t = t + atol;
        double v = d / t;
        r[i] = v;
        dd[i] = d;
        q[i] = b > 0 ? d / b : -1.0;
        nan |= (v != v);
    }
    if (nan) {  /* 0/0 with atol <= 0 counts as 0, as numpy's path; other NaN ratios go to numpy */
        for (int64_t i = 0; i < m; i++)
            if (r[i] != r[i]) { if (!(atol <= 0)) c->bad = 1; r[i] = 0.0; }
    }
    double lm[L];
    for (int j = 0; j < L; j++) lm[j] = -1.0;
    int64_t i = 0;
    for (; i + L <= m; i += L) {
        for (int j = 0; j < L; j++) {
            double v = r[i + j], d = dd[i + j], w = q[i + j];
            lm[j] = v > lm[j] ? v : lm[j];
            c->mabs[j] = d > c->mabs[j] ? d : c->mabs[j];
            c->mrel[j] = w > c->mrel[j] ? w : c->mrel[j];
        }
    }
    for (; i < m; i++) {
        double v = r[i], d = dd[i], w = q[i];
        lm[0] = v > lm[0] ? v : lm[0];
        c->mabs[0] = d > c->mabs[0] ? d : c->mabs[0];
        c->mrel[0] = w > c->mrel[0] ? w : c->mrel[0];
    }
    double cm = lm[0];
    for (int j = 1; j < L; j++) cm = lm[j] > cm ? lm[j] : cm;
    if (cm > c->best) {
        for (i = 0; i < m; i++) if (r[i] == cm) break;
        c->best = cm; c->worst = off + i;
    }
    for (int k = 0; k < NE; k++) {
        double e = c->edges[k];
        if (!(cm > e)) break;
        int64_t cnt[L];
        for (int j = 0; j < L; j++) cnt[j] = 0;
        for (i = 0; i + L <= m; i += L)
            for (int j = 0; j < L; j++) cnt[j] += r[i + j] > e;
        for (; i < m; i++) cnt[0] += r[i] > e;
        int64_t tot = 0;
        for (int j = 0; j < L; j++) tot += cnt[j];
        c->above[k] += tot;
    }
}

static Sums pw_$S(const $T *x, const $T *y, int64_t n, int64_t off, Ctx *c) {
    Sums s;
    if (n < 8) {
        s.aa = s.bb = s.dd = s.ab = s.ad = 0.;
        for (int64_t i = 0; i < n; i++) {
            double a = x[i], b = y[i], d = a - b;
            s.aa += a * a; s.bb += b * b; s.dd += d * d; s.ab += a * b; s.ad += fabs(d);
        }
        elem_$S(x, y, n, off, c);
        return s;
    } else if (n <= PW) {
        double raa[8], rbb[8], rdd[8], rab[8], rad[8];
        for (int j = 0; j < 8; j++) {
            double a = x[j], b = y[j], d = a - b;
            raa[j] = a * a; rbb[j] = b * b; rdd[j] = d * d; rab[j] = a * b; rad[j] = fabs(d);
        }
        int64_t i;
        for (i = 8; i < n - (n % 8); i += 8) {
            for (int j = 0; j < 8; j++) {
                double a = x[i + j], b = y[i + j], d = a - b;
                raa[j] += a * a; rbb[j] += b * b; rdd[j] += d * d; rab[j] += a * b; rad[j] += fabs(d);
            }
        }
        s.aa = C8(raa); s.bb = C8(rbb); s.dd = C8(rdd); s.ab = C8(rab); s.ad = C8(rad);
        for (; i < n; i++) {
            double a = x[i], b = y[i], d = a - b;
            s.aa += a * a; s.bb += b * b; s.dd += d * d; s.ab += a * b; s.ad += fabs(d);
        }
        elem_$S(x, y, n, off, c);
        return s;
    } else {
        int64_t n2 = n / 2;
        n2 -= n2 % 8;
        Sums l = pw_$S(x, y, n2, off, c), r = pw_$S(x + n2, y + n2, n - n2, off + n2, c);
        s.aa = l.aa + r.aa; s.bb = l.bb + r.bb; s.dd = l.dd + r.dd; s.ab = l.ab + r.ab; s.ad = l.ad + r.ad;
        return s;
    }
}

/* a, b: n values of one block (numpy's path casts them to float64 first: the same values). best:
   the highest ratio of the blocks before (the worst index is reported only if this block beats it). */
void block_$S(const $T *a, const $T *b, int64_t n, double atol, double rtol, const double *edges,
              double best, Block *o) {
    Ctx c;
    c.atol = atol; c.rtol = rtol; c.best = best; c.edges = edges; c.worst = -1; c.bad = 0;
    for (int j = 0; j < L; j++) { c.mabs[j] = 0.0; c.mrel[j] = -1.0; }
    for (int k = 0; k < NE; k++) c.above[k] = 0;
    Sums s = pw_$S(a, b, n, 0, &c);
    o->aa = s.aa; o->bb = s.bb; o->dd = s.dd; o->ab = s.ab; o->ad = s.ad;
    double ma = c.mabs[0], mr = c.mrel[0];
    for (int j = 1; j < L; j++) { ma = c.mabs[j] > ma ? c.mabs[j] : ma; mr = c.mrel[j] > mr ? c.mrel[j] : mr; }
    o->max_ratio = c.best; o->worst = c.worst; o->max_abs = ma; o->max_rel = mr;
    o->any_rel = mr >= 0.0; o->bad = c.bad;
    for (int k = 0; k < NE; k++) o->above[k] = c.above[k];
}
"""

SOURCE = _HEAD + "".join(_BODY.replace("$T", t).replace("$S", s) for t, s in (("float", "f32"), ("double", "f64")))

# -O2 with loop vectorisation: 1.4x faster than -O3 here (-O3 vectorised the pairwise sums' leaf
# worse). -march=native: the library is built on, and cached for, the machine that runs it (the CPU's
# flags are part of its file name). Without -march=native (another compiler), the second set.
FLAGS = ["-O2", "-ftree-loop-vectorize", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC"]
PORTABLE_FLAGS = ["-O2", "-ffp-contract=off", "-shared", "-fPIC"]


class Block(ctypes.Structure):
    _fields_ = [(k, ctypes.c_double) for k in ("aa", "bb", "dd", "ab", "ad", "max_abs", "max_rel", "max_ratio")] + \
               [(k, ctypes.c_int64) for k in ("worst", "any_rel", "bad")] + [("above", ctypes.c_int64 * NEDGES)]


def _cache_dir() -> Path:
    return Path(os.environ.get("PARITY_CACHE_DIR") or Path.home() / ".cache" / "parity")


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def _cpu() -> str:
    """The CPU's feature flags (what -march=native compiles for), so that a cache directory shared
    by machines never hands one CPU's build to another."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    import platform
    return platform.machine() + platform.processor()


def library_path(cc: str, flags: list[str]) -> Path:
    key = hashlib.sha256("\0".join([SOURCE, cc, *flags, sys.platform, _cpu()]).encode()).hexdigest()[:16]
    return _cache_dir() / f"compare-{key}.so"


def build() -> Path | None:
    """The compiled kernel's path, building it if needed; None when it cannot be built here."""
    cc = _compiler()
    if cc is None:
        return None
    for flags in (FLAGS, PORTABLE_FLAGS):  # built before (a failed first set is not retried each time)
        if library_path(cc, flags).exists():
            return library_path(cc, flags)
    failed = library_path(cc, FLAGS).with_suffix(".failed")  # both sets failed here before: numpy
    if failed.exists():
        return None
    for flags in (FLAGS, PORTABLE_FLAGS):
        path = library_path(cc, flags)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
                src, out = Path(tmp) / "compare.c", Path(tmp) / "compare.so"
                src.write_text(SOURCE)
                r = subprocess.run([cc, *flags, "-o", str(out), str(src), "-lm"], capture_output=True, text=True,
                                   timeout=120)
                if r.returncode == 0:
                    os.replace(out, path)  # atomic: a racing build writes the same bytes
                    return path
        except (OSError, subprocess.SubprocessError):
            return None
    try:
        failed.write_text("the C compiler failed on both flag sets; delete this file to try again\n")
    except OSError:
        pass
    return None


_LIB: list = []


def load():
    """(block_f32, block_f64) from the compiled kernel, or None (numpy path)."""
    if _LIB:
        return _LIB[0]
    fns = None
    if os.environ.get("PARITY_NO_CKERNEL", "") in ("", "0"):
        path = build()
        if path is not None:
            try:
                lib = ctypes.CDLL(str(path))
                f32, f64 = lib.block_f32, lib.block_f64
                p, i64, dbl = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
                for f in (f32, f64):
                    f.argtypes = [p, p, i64, dbl, dbl, p, dbl, ctypes.POINTER(Block)]
                    f.restype = None
                fns = (f32, f64)
            except OSError:
                fns = None
    _LIB.append(fns)
    return fns


if __name__ == "__main__":  # `python -m parity.ckernel`: build now (make setup), say where
    p = build()
    print(f"parity: compare kernel {p}" if p else
          "parity: no C compiler, or the compare kernel's build failed: the compare runs on numpy (same results, slower)")
