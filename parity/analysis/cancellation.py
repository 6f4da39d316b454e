"""Catastrophic cancellation in a sum of products, named at the drift origin (issue 34). numpy only.

A Conv or MatMul whose outputs are far smaller than the products they sum (a band-pass filter on a
signal far louder than its pass band: basic-pitch's constant-Q transform) rounds its operands at the
format's unit roundoff u, and the result keeps that absolute error: relative to the small output it is
up to ~2 u kappa, kappa = rms(sum |w x|) / rms(sum w x), the summation's condition number. The fp64
golden run of an ONNX file measures kappa for every such node (parity.pipeline.onnx_fp64, fp64.parquet
metadata `sum_conditions`). Every backend at that format computes the same wrong values there, the
trusted one included, so the oracle's yardstick absorbs the error at that layer and the cell fails
only downstream, where a Log of the smallest magnitudes or their Min amplifies it (basic-pitch at fp16:
the first CQT Conv 16 u off fp64 in both fp16 runs, kappa ~100; the first failing layer a ReduceMin
of the log-magnitudes, 0.19 off in both).

`refine(cd, reference_dir, fmt, limits)`: in an oracle-mode cell that fails, the drift origin moves to
the first layer, in execution order up to the first failing one, that
  - computes wrong values: rel_l2 vs fp64 above k u (k roundings of its own values: the oracle's
    limit without the trusted backend's allowance),
  - in the trusted backend too (its rel_l2 at least 1/k of the cell's: the format's error, not this
    backend's; a fault of the backend under test is located as before),
  - and is a cancelling sum: kappa >= KAPPA_MIN (64) and rel_l2 <= EXPLAIN u kappa (what rounding the
    operands explains),
and its cause is `cancellation` ("output ~kappa x below the magnitude of the products it sums"), the
first failing layer and its own cause kept in the evidence. Only where the first failing layer has no
explanation of its own (cause `unknown`, no parameter out of the format's range): PP-OCR's detector at
fp16, whose BatchNorm variances overflow, keeps that BatchNorm (cause `range`) as its origin. A cell
without `sum_conditions` (a torch model's reference), a passing cell, one judged by tolerance or an
integer cell (its error is its quantisation, not a rounding) is left as it was.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from parity.analysis.causes import Cause, param_range
from parity.core import store

# outputs at least this many times below the magnitude of the products they sum: one rounding then
# allows 2 u kappa >= 128 u, 4x the 32 u at which the oracle calls an error no rounding
# (oracle.FLOOR_MAX_UNITS). PP-OCR's detector's Convs have kappa <= 16 (measured) and 2-5 u of
# accumulated fp16 error; basic-pitch's CQT filters 205-421 and 16-83 u.
KAPPA_MIN = 64.0
EXPLAIN = 2.0      # one rounding of each operand: a relative error of at most ~2 u kappa
UNEXPLAINED = ("unknown",)  # the first failing layer's own cause: only then is an upstream sum looked for
FLOATS = ("fp16", "bf16", "fp8_e4m3", "tf32", "fp32")  # formats that round (an int cell's error is its quantisation)


def conditions(reference_dir: Path) -> dict[str, float]:
    """{value: kappa} from the fp64 golden run's metadata ({} when it has none)."""
    path = Path(reference_dir) / "fp64.parquet"
    if not path.exists():
        return {}
    raw = store.read_metadata(path).get("sum_conditions")
    return json.loads(raw) if raw else {}


def _rels(d) -> tuple[float, float] | None:
    """(cell's rel_l2, trusted backend's rel_l2) vs fp64 of a judged layer, None without them."""
    o = d.oracle or {}
    rms = o.get("ref_rms")
    if not rms or o.get("floor_rmse") is None:
        return None
    return o["err_rmse"] / rms, o["floor_rmse"] / rms


def find(layers: list, origin: str, kappas: dict, u: float, k: float):
    """(layer, rel, floor rel, kappa) of the first cancelling sum computing wrong values at or before
    the layer `origin` (module docstring), else None."""
    ordered = sorted(layers, key=lambda d: d.order)
    stop = next((d.order for d in ordered if d.name == origin), None)
    for d in ordered:
        if stop is None or d.order > stop:
            return None
        kappa, rels = kappas.get(store.reference_name(d.name)), _rels(d)
        if kappa is None or rels is None or store.is_output(d.name):
            continue
        rel, frel = rels
        if rel > k * u and frel * k >= rel and kappa >= KAPPA_MIN and rel <= EXPLAIN * u * kappa:
            return d, rel, frel, kappa
    return None


def cause(name: str, rel: float, frel: float, kappa: float, fmt, first: str, first_cause: dict | None) -> Cause:
    """The `cancellation` cause of the cancelling sum `name` (rel_l2 `rel` vs fp64, the trusted
    backend's `frel`), which the first failing layer `first` follows from."""
    f, u = fmt.name, fmt.u
    then = "" if first == name else f"; the first failing layer, {first}, follows from it"
    return Cause("cancellation",
                 f"cancellation: output ~{kappa:.3g}x below the magnitude of the products it sums: {f}'s relative "
                 f"error is amplified (rel_l2 {rel:.3g} = {rel / u:.3g} u vs fp64, the trusted backend's {frel:.3g}; "
                 f"rounding the operands allows up to {EXPLAIN:g} u kappa = {EXPLAIN * u * kappa:.3g}): every {f} "
                 f"backend computes it so{then}",
                 {"kind": "sum", "kappa": kappa, "rel_l2": rel, "trusted_rel_l2": frel, "u": u, "dtype": f,
                  "explained_rel_l2": EXPLAIN * u * kappa, "first_failing": first,
                  "first_failing_cause": {k: (first_cause or {}).get(k) for k in ("label", "summary")}})


def refine(cd, reference_dir: Path, fmt, limits) -> None:
    """Move a failing oracle cell's drift origin to the cancelling sum it follows from, with its cause
    (module docstring). `cd`: parity.pipeline.diff.CellDiff; `limits`: (u, k, slack)."""
    origin = cd.summary.get("drift_origin")
    if cd.mode != "oracle" or not origin or cd.summary.get("passed") is not False or fmt.name not in FLOATS:
        return
    first = cd.summary.get("drift_origin_cause") or {}
    if first.get("label") not in UNEXPLAINED or param_range((cd.status or {}).get("settings"), origin) is not None:
        return  # the failing layer's own values explain it (a range problem, a pattern): it stays the origin
    kappas = conditions(reference_dir)
    u, k = limits[0], limits[1]
    hit = find(cd.layers, origin, kappas, u, k) if kappas and math.isfinite(u) else None
    if hit is None:
        return
    d, rel, frel, kappa = hit
    cd.summary["drift_origin"] = d.name
    cd.summary["drift_origin_cause"] = cause(d.name, rel, frel, kappa, fmt, origin,
                                             cd.summary.get("drift_origin_cause")).as_dict()
