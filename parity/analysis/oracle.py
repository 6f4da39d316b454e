"""The fp64 oracle (after torch._dynamo.utils.same), per layer. numpy only.

A backend at a reduced precision cannot match the fp32 reference to a fixed tolerance; the question
is whether it is as good as that precision can be. So every value is measured against an fp64 run
of the same model on the same inputs:

  err       = rmse(cell, fp64)                     what the backend under test gets wrong
  floor     = rmse(baseline, fp64)                 what the trusted backend (torch CPU eager) gets
                                                   wrong at the cell's precision, same inputs
  excess    = err / (max(floor, u * rms(fp64)) + slack * rms(fp64) / k)
                                                   how many times worse than the trusted backend;
                                                   u * rms is the rounding of the value itself, so a
                                                   layer the baseline computes exactly (a copy, a
                                                   ReLU) is not held to zero error
  bits_lost = log2(rel_l2(cell, fp64) / u)          about how many low bits of the dtype are noise

A layer passes when excess <= k, i.e. err <= k * max(floor, u * rms) + slack * rms
(`dtypes.<d>.oracle`: k, default 4: two bits worse than the trusted backend; slack, a relative
error: a fraction of the layer's own rms), and it has no NaN/Inf the fp64 run lacks. u is the dtype's
unit roundoff. The slack is there for reductions: a backend that sums a mean over 3136 values in a
different (valid) order than eager's can be 8x further from fp64 than eager at a layer whose output
has 32 values (Inductor's squeeze-excite average pools in mobilenet_v3_small at fp32: rel_l2 6e-7,
3.4 bits), which no user calls a failure. It scales with the layer: an absolute slack (it was
torch._dynamo.utils.same's `tol / 10`, 1e-5 RMSE at fp32) is 100-3000x the measured floor on a layer
of rms 0.01 and let a 5e-4 relative weight error through (docs/verdicts.md, section 1b).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from parity.core import verdict
from parity.core.compare import sq_error, sum_sq

# the oracle's limits and whether the trusted backend reproduces a precision are read by the one
# verdict resolver (parity.core.verdict); named here too for the callers that judge by the oracle
BASELINE_MODES, Limits, has_baseline, limits, unit_roundoff = (
    verdict.BASELINE_MODES, verdict.Limits, verdict.has_baseline, verdict.limits, verdict.unit_roundoff)


@dataclass
class Sq:
    """Sums over every sample of one layer: squared error, squared fp64 value, element count."""
    err: float = 0.0
    ref: float = 0.0
    n: int = 0
    nonfinite: int = 0  # NaN/Inf in the actual where fp64 is finite

    def add(self, actual: np.ndarray, gold: np.ndarray, ref_sq: float | None = None) -> "Sq":
        """Add one sample: float64 sums, block by block (parity.core.compare.sq_error, sum_sq)."""
        err, bad = sq_error(actual, gold)
        self.err += err
        self.nonfinite += bad
        self.ref += sum_sq(gold) if ref_sq is None else ref_sq
        self.n += int(np.size(gold))
        return self

    @property
    def rmse(self) -> float:
        return math.sqrt(self.err / self.n) if self.n else 0.0

    @property
    def rms_ref(self) -> float:
        return math.sqrt(self.ref / self.n) if self.n else 0.0


def excess(err: Sq, floor: Sq | None, u: float, k: float, slack: float = 0.0) -> float:
    noise = u * err.rms_ref
    denom = max(floor.rmse if floor is not None else 0.0, noise) + slack * err.rms_ref / k
    return err.rmse / max(denom, 1e-300)


def bits_lost(err: Sq, u: float) -> float | None:
    """log2(rel_l2 / u), None when the values are exact (no bit lost)."""
    if err.err == 0.0 or err.ref == 0.0:
        return None if err.err == 0.0 else math.inf
    return math.log2(math.sqrt(err.err / err.ref) / u)


def judge(err: Sq, floor: Sq | None, u: float, k: float, slack: float = 0.0) -> dict:
    """The oracle metrics of one layer (or one own-error value) and whether it passes."""
    x = excess(err, floor, u, k, slack)
    return {"err_rmse": err.rmse, "floor_rmse": floor.rmse if floor is not None else None,
            "ref_rms": err.rms_ref, "excess": x, "bits_lost": bits_lost(err, u),
            "nonfinite": err.nonfinite, "passed": bool(x <= k and err.nonfinite == 0)}
