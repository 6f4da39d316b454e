"""The fp64 oracle (after torch._dynamo.utils.same), per layer. numpy only.

A backend at a reduced precision cannot match the fp32 reference to a fixed tolerance; the question
is whether it is as good as that precision can be. So every value is measured against an fp64 run
of the same model on the same inputs:

  err       = rmse(cell, fp64)                     what the backend under test gets wrong
  floor     = rmse(baseline, fp64)                 what the trusted backend (torch CPU eager) gets
                                                   wrong at the cell's precision, same inputs
  excess    = err / (max(floor, u * rms(fp64), u * max|fp64| / 4) + slack * rms(fp64) / k)
                                                   how many times worse than the trusted backend;
                                                   u * rms is the rounding of the value itself, so a
                                                   layer the baseline computes exactly (a copy, a
                                                   ReLU) is not held to zero error
  bits_lost = log2(rel_l2(cell, fp64) / u)          about how many low bits of the dtype are noise

A layer passes when excess <= k, i.e. err <= k * max(floor, u * rms, u * max|fp64| / 4) + slack * rms
(`dtypes.<d>.oracle`: k, default 4: two bits worse than the trusted backend; slack, a relative
error: a fraction of the layer's own rms), and it has no NaN/Inf the fp64 run lacks. u is the dtype's
unit roundoff. The slack is there for reductions: a backend that sums a mean over 3136 values in a
different (valid) order than eager's can be 8x further from fp64 than eager at a layer whose output
has 32 values (Inductor's squeeze-excite average pools in mobilenet_v3_small at fp32: rel_l2 6e-7,
3.4 bits), which no user calls a failure. It scales with the layer: an absolute slack (it was
torch._dynamo.utils.same's `tol / 10`, 1e-5 RMSE at fp32) is 100-3000x the measured floor on a layer
of rms 0.01 and let a 5e-4 relative weight error through (docs/verdicts.md, section 1b).
Two bounds on the yardstick (issue 34: trained weights). The scale floor: the trusted backend's error
is counted as at least SCALE_UNITS (1/4) units of roundoff of the layer's largest |fp64| value, so an
error up to k/4 u max|x| (1 u max|x| at k = 4) passes: a runtime's approximated activation is accurate
to a fraction of a unit of the function's range (ONNX Runtime's CPU Sigmoid: ~0.5 u max|y| RMSE), which
on a saturated sigmoid head (outputs ~3e-4, a few near 1) is 100-1000x torch's error there; such a pass
carries a `note` naming it. A layer whose largest value is within 4x its rms is judged as before
(u rms >= u max|x| / 4), and a fault above 1 u max|x| still fails. The floor cap: a trusted backend whose
error exceeds FLOOR_MAX_REL (1/64) of the layer's rms is broken there itself (a running variance beyond
fp16's range clamped or made inf in both conversions), so its error is counted up to that much only and
a cell as broken fails at the first layer that computes wrong values; that too carries a `note`.

So excess / k is a layer's error over its limit (1 = the limit), as tol_ratio is in tolerance mode:
`ratios` and `worst_ratio` give that ratio in either mode (layers.csv, metrics.json's worst_ratio).

Was the precision exercised, and can the verdict fail at all (`precision`, `baseline_self`)?
A reduced-precision cell (fp16, bf16, tf32, int8, int4, fp8) passes the oracle when it is as close to
fp64 as the trusted backend at that precision. A cell that never computed in that precision passes
too, and then the verdict says nothing about the precision the user asked for: ONNX Runtime's CPU
provider has no fp16 kernel for Gemm, MatMul, Softmax, BatchNormalization or Gelu, and with every
operand a graph input (nothing stored in fp16) its optimiser removes the Cast pairs around them and
runs the fp32 kernel: the outputs are bit-identical to fp32 (measured: a one-Gemm graph, onnxruntime
1.31). So each layer's relative error against fp64 (against the fp32 reference when the cell is
judged by tolerance) is compared with the format's unit roundoff u: a layer *shows the rounding* of
its precision when rel_l2 >= u / 16 (bits_lost >= -4). One rounding of a value to the format alone
gives rel_l2 ~ u / sqrt(3) (bits_lost ~ -0.8); an fp32 computation, even after 6 bits of accumulated
fp32 noise (efficientnet_b0, docs/verdicts.md), stays below u_fp32 * 2^6 = 2^-18, 8x under fp16's
u / 16 = 2^-15. A cell none of whose layers shows it is NOT_EXERCISED (parity.core.status).

A cell whose provider is the oracle's baseline backend (torch_cpu against the torch CPU eager
baseline at its own dtype; ort_cpu_noopt for an ONNX-file model) is judged against itself: its
error is its own floor, so its excess is at most 1 by construction (below 1 where u x rms or the scale
floor is the larger term of the limit: 0.19-0.29 on resnet18 fp32) and it cannot fail, so its verdict is BASELINE, not PASS; except where
its own values are broken (error above rms x FLOOR_MAX_REL, e.g. running variances that become inf
in torch's .half()): the cap makes that a FAIL, at the first such layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from parity.core import dtypes, store, tolerance
from parity.core.compare import sq_error, sum_sq_max

# the oracle's limits and whether the trusted backend reproduces a precision are read by the one
# verdict resolver (parity.core.tolerance); named here too for the callers that judge by the oracle
BASELINE_MODES, Limits, has_baseline, limits, unit_roundoff = (
    tolerance.BASELINE_MODES, tolerance.Limits, tolerance.has_baseline, tolerance.limits, tolerance.unit_roundoff)


# The scale floor: the trusted backend's error is counted as at least SCALE_UNITS units of roundoff of
# the layer's largest fp64 magnitude, so an error (RMSE) up to k x SCALE_UNITS u max|x| (1 u max|x| at
# k = 4) passes whatever the trusted backend's error (module docstring). ONNX Runtime's CPU Sigmoid is
# accurate to ~0.5 u x max|y| RMSE (2.5 u at worst) on any input range, saturated or not; Tanh 0.7-1.0,
# Erf, Exp and Softplus 0.1-0.5 (measured, onnxruntime 1.31, fp32; docs/verdicts.md section 1e). 1/4:
# a layer whose largest value is within 4x its rms (a Gaussian-like layer) keeps the limit it had
# (u rms >= u max|x| / 4), at every dtype; a saturated sigmoid (max|x| ~1, rms ~5e-3) gets 1 u.
SCALE_UNITS = 0.25
# A trusted backend whose error at a layer exceeds this share of the layer's rms does not round the
# layer, it breaks it (a parameter beyond the format's range, catastrophic cancellation): its error is
# no yardstick there, and it is counted up to this much only, so an error above k / 64 (1/16 of the
# rms at k = 4) fails whatever the trusted backend does. 1/64 is 32 units of fp16's roundoff: a rounding
# error that large is no rounding any more (docs/verdicts.md section 1e). A coarser format gets its own 32
# units (FLOOR_MAX_UNITS: bf16's cap is 1/8), so a deep model's accumulated bf16 rounding stays a yardstick.
FLOOR_MAX_REL = 1.0 / 64
FLOOR_MAX_UNITS = 32


@dataclass
class Sq:
    """Sums over every sample of one layer: squared error, squared fp64 value, element count, and the
    largest finite |fp64| value (None when unknown: sums written without it)."""
    err: float = 0.0
    ref: float = 0.0
    n: int = 0
    nonfinite: int = 0  # NaN/Inf in the actual where fp64 is finite
    amax: float | None = 0.0

    def add(self, actual: np.ndarray, gold: np.ndarray, ref_sq: float | None = None,
            ref_max: float | None = None) -> "Sq":
        """Add one sample: float64 sums, block by block (parity.core.compare.sq_error, sum_sq_max)."""
        err, bad = sq_error(actual, gold)
        self.err += err
        self.nonfinite += bad
        if ref_sq is None or ref_max is None:
            ref_sq, ref_max = sum_sq_max(gold)
        self.ref += ref_sq
        self.amax = None if self.amax is None else max(self.amax, ref_max)
        self.n += int(np.size(gold))
        return self

    @property
    def rmse(self) -> float:
        return math.sqrt(self.err / self.n) if self.n else 0.0

    @property
    def rms_ref(self) -> float:
        return math.sqrt(self.ref / self.n) if self.n else 0.0


def _floor(err: Sq, floor: Sq | None, u: float) -> tuple[float, bool]:
    """(the trusted backend's error as the yardstick, whether the cap, FLOOR_MAX_REL or FLOOR_MAX_UNITS u of
    the rms, the larger, capped it)."""
    f = floor.rmse if floor is not None else 0.0
    cap = max(FLOOR_MAX_REL, FLOOR_MAX_UNITS * u) * err.rms_ref
    return (cap, True) if f > cap > 0 else (f, False)


def scale_floor(err: Sq, u: float) -> float:
    """SCALE_UNITS units of roundoff of the layer's largest |fp64| value (0 when unknown): the least
    error the yardstick is counted as."""
    return SCALE_UNITS * u * (err.amax or 0.0)


def excess(err: Sq, floor: Sq | None, u: float, k: float, slack: float = 0.0) -> float:
    """err / (max(floor, u rms, scale floor) + slack rms / k): k times err over the limit."""
    noise = u * err.rms_ref
    denom = max(_floor(err, floor, u)[0], noise, scale_floor(err, u)) + slack * err.rms_ref / k
    return err.rmse / max(denom, 1e-300)


def limit_rel(rec: dict, u: float, k: float, slack: float) -> float | None:
    """The limit of a judged record (judge()'s err_rmse, floor_rmse, ref_rms, ref_max) as a rel_l2:
    k max(capped floor, u rms, scale floor) / rms + slack; None without a reference rms."""
    rms = rec.get("ref_rms")
    if not rms:
        return None
    f = rec.get("floor_rmse") or 0.0
    f = min(f, max(FLOOR_MAX_REL, FLOOR_MAX_UNITS * u) * rms)
    return k * max(f, u * rms, SCALE_UNITS * u * (rec.get("ref_max") or 0.0)) / rms + slack


def bits_lost(err: Sq, u: float) -> float | None:
    """log2(rel_l2 / u), None when the values are exact (no bit lost)."""
    if err.err == 0.0 or err.ref == 0.0:
        return None if err.err == 0.0 else math.inf
    return math.log2(math.sqrt(err.err / err.ref) / u)


def judge(err: Sq, floor: Sq | None, u: float, k: float, slack: float = 0.0) -> dict:
    """The oracle metrics of one layer (or one own-error value) and whether it passes; `note` says when
    the scale floor passed it (the limit without it would fail it) or the floor was capped."""
    x = excess(err, floor, u, k, slack)
    out = {"err_rmse": err.rmse, "floor_rmse": floor.rmse if floor is not None else None,
           "ref_rms": err.rms_ref, "excess": x, "bits_lost": bits_lost(err, u),
           "nonfinite": err.nonfinite, "passed": bool(x <= k and err.nonfinite == 0)}
    if err.amax is not None:
        out["ref_max"] = err.amax
        out["scale_floor"] = scale_floor(err, u)
    f, capped = _floor(err, floor, u)
    if out["passed"] and err.rmse > k * max(f, u * err.rms_ref) + slack * err.rms_ref:  # only the scale floor passes it
        vs = f", {err.rmse / f:.3g}x the trusted backend's {f:.3g}" if f > 0 else ""
        n = k * SCALE_UNITS
        out["note"] = (f"within {n:g} unit{'' if n == 1 else 's'} of roundoff of the layer's largest value |x|max = "
                       f"{err.amax:.3g} (limit {k * out['scale_floor']:.3g}; err_rmse {err.rmse:.3g}{vs}): "
                       "an approximated kernel on saturated values")
    elif capped:
        out["note"] = (f"the trusted backend's own error here, rel_l2 {floor.rmse / err.rms_ref:.3g}, is no "
                       f"rounding: its values are broken too (floor counted up to rel_l2 "
                       f"{max(FLOOR_MAX_REL, FLOOR_MAX_UNITS * u):g})")
    return out


def ratios(layers: list, own: list, mode: str, k: float) -> dict:
    """layer -> (ratio, own ratio): what the cell's verdict judges over its limit, so that 1 is the limit
    in both modes (oracle: excess / k, and the layer's own excess / k where measured; tolerance: tol_ratio,
    no own ratio); None where unknown. `layers`: compare.LayerDiff with .oracle; `own`: own-error records."""
    own_excess = {r["layer"]: r["excess"] for r in own if r["kind"] == "leaf"}
    oracle = mode == "oracle"
    out = {}
    for d in layers:
        ex, own_ex = (d.oracle or {}).get("excess"), own_excess.get(d.name)
        out[d.name] = ((ex / k if ex is not None and k > 0 else None) if oracle else d.tol_ratio,
                       own_ex / k if oracle and own_ex is not None and k > 0 else None)
    return out


def worst_ratio(layers: list, own: list, mode: str, k: float, worst_tol_ratio: float | None) -> float | None:
    """The cell's worst error over what its verdict allows (<= 1 within the limit): oracle mode, the
    largest excess (accumulated or own) / k; tolerance mode, the worst tol_ratio."""
    if mode == "oracle":
        excesses = [d.oracle["excess"] for d in layers if d.oracle] + [r["excess"] for r in own]
        finite = [x for x in excesses if x is not None]
        return max(finite) / k if finite and k > 0 else None
    return worst_tol_ratio


SHOWS = dtypes.SHOWS  # a layer shows the rounding when rel_l2 >= u * SHOWS


def _rel(d) -> float | None:
    """A layer's relative error: vs fp64 (oracle), else vs the fp32 reference (tolerance metrics)."""
    o = d.oracle or {}
    if o.get("ref_rms"):
        return o["err_rmse"] / o["ref_rms"]
    if o:
        return None  # fp64 is all zeros: nothing to round
    return d.rel_l2


def precision(layers: list, f: dtypes.Format | None, mode: str) -> dict | None:
    """{format, u, layers, rounded, exercised, largest_rel_l2, evidence} of a cell computing in the
    reduced format `f` (parity.core.dtypes.reduced; None for fp32/fp64: then None, as when no layer has
    values). `layers`: compare.LayerDiff with .oracle."""
    if f is None:
        return None
    u = f.u
    inner = [d for d in layers if not store.is_output(d.name)] or layers  # the layers `layers` counts
    rels = [r for d in inner if not d.problem and (r := _rel(d)) is not None]
    if not rels:
        return None
    label = f.name
    vs = "fp64" if mode == "oracle" else "the fp32 reference"
    rounded = sum(r >= u * SHOWS for r in rels)
    ev = (f"{rounded} of {len(rels)} layers show {label} rounding (rel_l2 vs {vs} >= u/16 = {u * SHOWS:.2g}; "
          f"largest {max(rels):.2g})")
    if not rounded:
        ev += f"; the provider ran fp32 kernels: {label} was not exercised"
    return {"format": label, "u": u, "layers": len(rels), "rounded": rounded, "exercised": rounded > 0,
            "largest_rel_l2": max(rels), "evidence": ev}


def baseline_self(mode: str, provider: str | None, baseline_provider: str | None, dtype: str) -> str | None:
    """The evidence that a cell is the oracle's baseline judged against itself, else None."""
    if mode != "oracle" or not provider or provider != baseline_provider:
        return None
    return (f"provider {provider} is the oracle's baseline backend at {dtype} (baseline@<model>-{dtype}): "
            "judged against itself, its excess is at most 1 by construction and it cannot fail while its error "
            f"is a rounding (it fails where its own values are broken: an error above rms x {FLOOR_MAX_REL:g})")
