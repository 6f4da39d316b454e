"""The number formats parity reasons about (core): unit roundoff, largest finite value, smallest normal.

The one table of dtype facts. The float formats' come from their finfo (numpy's for float64/32/16,
ml_dtypes' for bfloat16 and float8_e4m3fn: ml_dtypes comes with onnx); the others are built from
those: tf32 has float32's exponent and float16's 10-bit mantissa; the integer formats (int8, int4)
keep float32 graph I/O and round to one step of a tensor's (or weight block's) range, 2**-bits.

A format is named by its short name (`fp16`) or an alias: a torch dtype name (`float16`, `half`) or a
conf/dtypes precision mode (`amp_fp16`, `int8_static`)."""

from __future__ import annotations

import math
from typing import NamedTuple

import ml_dtypes
import numpy as np


class Format(NamedTuple):
    name: str     # short name: fp64, fp32, tf32, fp16, bf16, fp8_e4m3, int8, int4
    u: float      # unit roundoff: 2**-(mantissa bits + 1); an integer format's: one step of the range
    max: float    # largest finite value
    tiny: float   # smallest positive normal value


def _float(name: str, t) -> Format:
    f = ml_dtypes.finfo(t)
    return Format(name, math.ldexp(1.0, -(int(f.nmant) + 1)), float(f.max), float(f.smallest_normal))


def _int(name: str, t, io: Format) -> Format:
    return Format(name, math.ldexp(1.0, -int(ml_dtypes.iinfo(t).bits)), io.max, io.tiny)


FP64 = _float("fp64", np.float64)
FP32 = _float("fp32", np.float32)
FP16 = _float("fp16", np.float16)
FORMATS = {f.name: f for f in (
    FP64, FP32, FP16,
    Format("tf32", FP16.u, FP32.max, FP32.tiny),
    _float("bf16", ml_dtypes.bfloat16),
    _float("fp8_e4m3", ml_dtypes.float8_e4m3fn),
    _int("int8", np.int8, FP32),
    _int("int4", ml_dtypes.int4, FP32),  # weight-only (int4_weight): relative to each weight block's range
)}
ALIASES = {
    "float64": "fp64", "double": "fp64", "float32": "fp32", "float": "fp32", "float16": "fp16",
    "half": "fp16", "bfloat16": "bf16", "amp_fp16": "fp16", "amp_bf16": "bf16",
    "int8_static": "int8", "int8_dynamic": "int8", "int4_weight": "int4",
}

TABLE = {**FORMATS, **{alias: FORMATS[short] for alias, short in ALIASES.items()}}  # every name -> its format
SHOWS = 1.0 / 16  # a value shows the rounding of its format when its rel_l2 vs the exact one >= u * SHOWS


def find(name: str) -> Format | None:
    """The format of a short name or an alias; None when unknown."""
    return TABLE.get(str(name))


def facts(name: str) -> Format:
    """The format of a short name or an alias; ValueError naming the valid ones when unknown."""
    f = find(name)
    if f is None:
        raise ValueError(f"unknown dtype {name!r}: expected one of {sorted(FORMATS) + sorted(ALIASES)}")
    return f


def reduced(name: str) -> Format | None:
    """The format when it computes below float32 (rounds coarser than fp32's u), else None (fp32,
    fp64, unknown names)."""
    f = find(name)
    return f if f is not None and f.u > FP32.u else None


def subnormal_min(f: Format) -> float:
    """The smallest positive value of a float format (its smallest subnormal): tiny x 2u."""
    return f.tiny * 2.0 * f.u


def out_of_range(values, f: Format) -> dict | None:
    """What the float format `f` cannot hold of `values` (finite ones): {"over": values with |x| above
    its largest finite value (inf, or clamped to the max, when cast), "under": nonzero values below
    its smallest subnormal (flushed to zero, or clamped up to it), "subnormal": values below its
    smallest normal that it keeps with fewer significant bits, "numel", "max_abs", "min_abs" (the
    smallest nonzero |x|)}; None when every value is a normal number of `f` (or zero)."""
    a = np.abs(np.asarray(values, dtype=np.float64).ravel())
    a = a[np.isfinite(a)]
    nz = a[a > 0]
    if not nz.size:
        return None
    over = int(np.count_nonzero(nz > f.max))
    under = int(np.count_nonzero(nz < subnormal_min(f) / 2))  # nearer zero than the smallest subnormal
    sub = int(np.count_nonzero(nz < f.tiny)) - under
    if not (over or under or sub):
        return None
    return {"over": over, "under": under, "subnormal": sub, "numel": int(a.size),
            "max_abs": float(nz.max()), "min_abs": float(nz.min())}
