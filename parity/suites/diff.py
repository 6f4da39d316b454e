"""Per-case verdicts of a suite cell (suite x dtype x provider). numpy only, never torch.

A case the run stage marked OK becomes (the verdict decided by parity.core.verdict.decide, as a model
cell's; this module lists the problems it found, each a kind of verdict.PROBLEMS and a reason):
  NAN_IN_REFERENCE  the reference has NaN where the provider does not (or the other way round with
                    the reference also holding NaN): no fair comparison
  NAN_IN_OUTPUT     the provider has NaN where the reference is finite
  MISMATCH          a forward output or a gradient fails its verdict (or a shape differs, or
                    gradcheck failed); the reason names the tensor, the excess or tol_ratio and the key
  OK                everything within its verdict (NaN at identical positions on both sides allowed)
Every other status (CRASH, TIMEOUT, EXPORT_FAIL, ...) passes through with its reason.

Verdicts, per tensor, as a model's layers are judged (`diff.verdict`, default oracle):
  oracle     the fp64 oracle (parity.core.oracle.judge, `dtypes.<d>.oracle`): the tensor's error
             vs the case's float64 run within k x max(the trusted backend's error at the cell's dtype,
             u x rms) + slack x rms (`excess` <= k). The run stage gives the float64 values (`gold`)
             and the trusted backend's (`floor`): execute.run_case says which run is which. Where
             there is no trusted backend apart from what is tested (a torch_cpu cell: torch_cpu is
             that backend; a user op against its own reference) the floor is the precision's own
             rounding, u x rms (`floor_from: none`), never the outputs themselves (a verdict that
             could not fail).
  tolerance  |a - b| <= atol + rtol |b| against the fp32 reference: every tensor under
             `diff.verdict: tolerance`; a tensor a rule of the suite's `tolerances:` matches (the
             per-suite fixed tolerance: a rule with atol/rtol, scoped by dtype, case, kind); integer
             outputs (exact); a case without a float64 run (onnx, gradcheck; `oracle_note` says why)
The tolerance metrics (max_abs, rel_l2, tol_ratio) are reported in both modes. What the config says
about judging (diff.verdict, diff.max_mismatch, the dtype's oracle limits) is read once into the suite
cell's `Rule` (parity.config.schema.suite_rule), the Rule a model cell is judged by.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from parity.core import compare, status, tolerance
from parity.config import schema
from parity.core import oracle
from parity.core.status import Status
from parity.core.verdict import decide
from parity.suites import spec

STATUS_ORDER = status.CASE_ORDER  # the one vocabulary: parity.core.status


def _nan_mask(a: np.ndarray) -> np.ndarray:
    return np.isnan(a) if a.dtype.kind == "f" else np.zeros(a.shape, bool)


def _fixed(p: dict, suite: str, dtype: str, cid: str, kind: str, a: np.ndarray, b: np.ndarray):
    """(atol, rtol, source, fixed): fixed is True when the tensor is judged by this tolerance (an
    integer output, or a rule of the suite's `tolerances:` matches it)."""
    if a.dtype.kind in "biu" and b.dtype.kind in "biu":
        return 0.0, 0.0, "exact (integer output)", True
    atol, rtol, src = spec.tolerance_for(p, suite, dtype, cid, kind)
    return atol, rtol, src, src.startswith(f"suites.{suite}.tolerances")


def _oracle_tensor(name: str, a, keep, gold: dict, floor: dict | None, lim: tuple):
    """oracle.judge of one tensor against its float64 values (None when it has none). floor: the
    trusted backend's values by name, None for no trusted backend (a user op vs its reference)."""
    g = gold.get(name)
    if g is None or g.shape != keep.shape:
        return None
    g = np.asarray(g, np.float64)[keep]
    err = oracle.Sq().add(a, g)
    fl = None
    if floor is not None and floor.get(name) is not None:
        fl = oracle.Sq().add(np.asarray(floor[name], np.float64)[keep], g)
    return oracle.judge(err, fl, *lim)


def _floors(row: dict, outs: dict, refs: dict, floor: dict | None) -> dict | None:
    src = row.get("floor_from")
    return {"reference": refs, "floor": floor or {}, "none": None}.get(src, floor or {})


def diff_case(p: dict, suite: str, dtype: str, row: dict, outs: dict, refs: dict, gold: dict | None = None,
              floor: dict | None = None, rule: tolerance.Rule | None = None) -> dict:
    """row: the run stage's result row; outs/refs/gold/floor: tensor name -> array for this case (the
    provider's, the fp32 reference's, the float64 run's, the trusted backend's at the cell's dtype).
    rule: the suite cell's (schema.suite_rule(p, suite, dtype), made here when not given)."""
    res = {"id": row["id"], "label": row["label"], "kind": row["kind"], "status": row["status"],
           "reason": row.get("reason", ""), "max_abs": None, "rel_l2": None, "tol_ratio": None,
           "grad_max_abs": None, "grad_tol_ratio": None, "tol_source": None, "grad_tol_source": None,
           "onnx_ops": row.get("onnx_ops"),
           **{k: row[k] for k in ("note", "drawn", "exercised") if row.get(k) is not None}}
    if row["status"] != Status.OK:
        return res
    if row.get("gradcheck") is not None:
        gc = row["gradcheck"]
        problems = [] if gc["passed"] else [("mismatch", "gradcheck: " + gc["reason"])]
        v = decide(row, {"case": True, "problems": problems})
        res.update(status=v.status, reason=v.reason)
        return res
    rule = rule or schema.suite_rule(p, suite, dtype)
    use_oracle = rule.verdict == "oracle" and bool(gold) and rule.limits is not None
    ctx = {"gold": gold or {}, "floor": _floors(row, outs, refs, floor), "oracle": use_oracle,
           "lim": rule.limits if use_oracle else None,
           "worst": {"out": (-1.0, None), "grad": (-1.0, None)}, "excess": {}}
    problems, nan_both = [], 0
    for name in row["outputs"]:
        nan_both += _diff_tensor(p, suite, dtype, row["id"], name, outs.get(name), refs.get(name),
                                 rule.max_mismatch, ctx, problems)
    _summarise(res, row, ctx)
    evidence = f"{nan_both} NaN at the same places on both sides" if nan_both else ""
    v = decide(row, {"case": True, "problems": problems, "evidence": evidence})  # the one verdict function
    res.update(status=v.status, reason=v.reason)
    return res


def _summarise(res: dict, row: dict, ctx: dict) -> None:
    """The worst tolerance metrics and oracle excess per kind (out, grad) into `res`, with the verdict."""
    for kind, prefix in (("out", ""), ("grad", "grad_")):
        d = ctx["worst"][kind][1]
        if d is not None:
            res[prefix + "max_abs"] = d.max_abs
            res[prefix + "tol_ratio"] = d.tol_ratio
            res[prefix + "tol_source"] = d.tol_source
            if kind == "out":
                res["rel_l2"] = d.rel_l2
        j = ctx["excess"].get(kind)
        if j is not None:
            res[prefix + "excess"] = j["excess"]
            if kind == "out":
                res["bits_lost"] = j["bits_lost"]
    res["verdict"] = "oracle" if ctx["excess"] else "tolerance"
    if ctx["excess"]:
        res["oracle_k"] = ctx["lim"][1]
        res["floor_from"] = row.get("floor_from")
    elif row.get("oracle_note"):
        res["oracle_note"] = row["oracle_note"]


def _diff_tensor(p, suite, dtype, cid, name, a, b, max_mismatch, ctx, problems) -> int:
    """Judge one output or gradient (appending to `problems`); returns the NaN count both sides share."""
    kind = "grad" if name.startswith("grad:") else "out"
    if b is None or a is None:
        problems.append(("mismatch", f"{name}: missing on the {'reference' if b is None else 'provider'}"))
        return 0
    if a.shape != b.shape:
        problems.append(("mismatch", f"{name}: shape {list(a.shape)} vs reference {list(b.shape)}"))
        return 0
    atol, rtol, src, fixed = _fixed(p, suite, dtype, cid, kind, a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    na, nb = _nan_mask(a64), _nan_mask(b64)
    keep = ~nb
    if na.any() or nb.any():
        if not np.array_equal(na, nb):
            if nb.any():
                problems.append(("nan_reference", f"{name}: {int(nb.sum())} NaN in the reference, "
                                                     f"{int(na.sum())} in the output, at different places"))
            else:
                problems.append(("nan_output", f"{name}: {int(na.sum())} NaN in the output, none in the reference"))
            return 0
    inf_ok = np.isinf(b64) & (a64 == b64)  # the same infinity on both sides: compared as equal
    a64, b64 = np.where(inf_ok, 0.0, a64)[keep], np.where(inf_ok, 0.0, b64)[keep]
    if a64.size == 0:
        return int(nb.sum())
    d = compare.compare_layer(name, 0, [(0, a64, b64)], atol, rtol, src, max_mismatch)
    if d.tol_ratio > ctx["worst"][kind][0] or ctx["worst"][kind][1] is None:
        ctx["worst"][kind] = (d.tol_ratio, d)
    keep &= ~inf_ok
    j = None if fixed or not ctx["oracle"] else _oracle_tensor(name, a[keep], keep, ctx["gold"], ctx["floor"],
                                                               ctx["lim"])
    if j is not None:
        if j["excess"] > (ctx["excess"].get(kind) or {}).get("excess", -1.0):
            ctx["excess"][kind] = j
        if not j["passed"]:
            what = (f"{j['nonfinite']} non-finite values the float64 run lacks" if j["nonfinite"] else
                    f"excess {j['excess']:.3g} > k {ctx['lim'][1]:g}")
            floor = ("floor u x rms: no trusted backend apart" if j["floor_rmse"] is None
                     else f"trusted backend's {j['floor_rmse']:.3g}")
            problems.append(("mismatch", f"{name}: {what} (rmse vs fp64 {j['err_rmse']:.3g}, {floor}, "
                                         f"rms {j['ref_rms']:.3g} <dtypes.{dtype}.oracle>)"))
    elif not d.passed:
        if d.nan_actual + d.inf_actual > d.nan_expected + d.inf_expected:
            problems.append(("mismatch", f"{name}: non-finite values the reference lacks"))
        else:
            problems.append(("mismatch", f"{name}: {d.n_outside}/{d.numel} elements outside tolerance, "
                                         f"max_abs {d.max_abs:.3g}, tol_ratio {d.tol_ratio:.3g} "
                                         f"(atol {atol:g}, rtol {rtol:g} <{src}>)"))
    return int(nb.sum())


def summarize(rows: list[dict]) -> dict:
    counts = Counter(r["status"] for r in rows)
    grads = [r for r in rows if r.get("grad_tol_ratio") is not None]
    finite = [r["max_abs"] for r in rows if isinstance(r.get("max_abs"), float) and math.isfinite(r["max_abs"])]
    return {"cases": len(rows), "counts": {s: counts[s] for s in STATUS_ORDER if counts[s]},
            "ok": counts[Status.OK], "grad_checked": len(grads),
            "grad_ok": sum(1 for r in grads if r["status"] == Status.OK),
            "max_abs": max(finite) if finite else None}
