"""Per-case verdicts of a suite cell (suite x dtype x provider). numpy only, never torch.

A case the run stage marked OK becomes:
  NAN_IN_REFERENCE  the reference has NaN where the provider does not (or the other way round with
                    the reference also holding NaN): no fair comparison
  NAN_IN_OUTPUT     the provider has NaN where the reference is finite
  MISMATCH          a forward output or a gradient is outside atol + rtol |ref| (or a shape
                    differs, or gradcheck failed); the reason names the tensor, tol_ratio and key
  OK                everything within tolerance (NaN at identical positions on both sides allowed)
Every other status (CRASH, TIMEOUT, EXPORT_FAIL, ...) passes through with its reason.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from parity import compare, status
from parity.suites import spec

STATUS_ORDER = status.CASE_ORDER  # the one vocabulary: parity.status


def _nan_mask(a: np.ndarray) -> np.ndarray:
    return np.isnan(a) if a.dtype.kind == "f" else np.zeros(a.shape, bool)


def diff_case(p: dict, suite: str, dtype: str, row: dict, outs: dict, refs: dict, max_mismatch: float = 0.0) -> dict:
    """row: the run stage's result row; outs/refs: tensor name -> array for this case."""
    res = {"id": row["id"], "label": row["label"], "kind": row["kind"], "status": row["status"],
           "reason": row.get("reason", ""), "max_abs": None, "rel_l2": None, "tol_ratio": None,
           "grad_max_abs": None, "grad_tol_ratio": None, "tol_source": None, "grad_tol_source": None,
           "onnx_ops": row.get("onnx_ops"),
           **{k: row[k] for k in ("note", "drawn", "exercised") if row.get(k) is not None}}
    if row["status"] != "OK":
        return res
    if row.get("gradcheck") is not None:
        ok = row["gradcheck"]["passed"]
        res.update(status="OK" if ok else "MISMATCH", reason="" if ok else "gradcheck: " + row["gradcheck"]["reason"])
        return res
    worst = {"out": (-1.0, None), "grad": (-1.0, None)}
    problems, nan_both = [], 0
    for name in row["outputs"]:
        kind = "grad" if name.startswith("grad:") else "out"
        a, b = outs.get(name), refs.get(name)
        if b is None or a is None:
            problems.append(("MISMATCH", f"{name}: missing on the {'reference' if b is None else 'provider'}"))
            continue
        if a.shape != b.shape:
            problems.append(("MISMATCH", f"{name}: shape {list(a.shape)} vs reference {list(b.shape)}"))
            continue
        if a.dtype.kind in "biu" and b.dtype.kind in "biu":
            atol = rtol = 0.0
            src = "exact (integer output)"
        else:
            atol, rtol, src = spec.tolerance_for(p, suite, dtype, row["id"], kind)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        na, nb = _nan_mask(a64), _nan_mask(b64)
        if na.any() or nb.any():
            if not np.array_equal(na, nb):
                if nb.any():
                    problems.append(("NAN_IN_REFERENCE", f"{name}: {int(nb.sum())} NaN in the reference, "
                                                         f"{int(na.sum())} in the output, at different places"))
                else:
                    problems.append(("NAN_IN_OUTPUT", f"{name}: {int(na.sum())} NaN in the output, none in the "
                                                      f"reference"))
                continue
            nan_both += int(nb.sum())
            keep = ~nb
            a64, b64 = a64[keep], b64[keep]
        inf_ok = np.isinf(b64) & (a64 == b64)
        if inf_ok.any():
            a64, b64 = np.where(inf_ok, 0.0, a64), np.where(inf_ok, 0.0, b64)
        if a64.size == 0:
            continue
        d = compare.compare_layer(name, 0, [(0, a64, b64)], atol, rtol, src, max_mismatch)
        if d.tol_ratio > worst[kind][0] or worst[kind][1] is None:
            worst[kind] = (d.tol_ratio, d)
        if not d.passed:
            if d.nan_actual + d.inf_actual > d.nan_expected + d.inf_expected:
                problems.append(("MISMATCH", f"{name}: non-finite values the reference lacks"))
            else:
                problems.append(("MISMATCH", f"{name}: {d.n_outside}/{d.numel} elements outside tolerance, "
                                             f"max_abs {d.max_abs:.3g}, tol_ratio {d.tol_ratio:.3g} "
                                             f"(atol {atol:g}, rtol {rtol:g} <{src}>)"))
    for kind, prefix in (("out", ""), ("grad", "grad_")):
        d = worst[kind][1]
        if d is not None:
            res[prefix + "max_abs"] = d.max_abs
            res[prefix + "tol_ratio"] = d.tol_ratio
            res[prefix + "tol_source"] = d.tol_source
            if kind == "out":
                res["rel_l2"] = d.rel_l2
    if problems:
        order = {"NAN_IN_REFERENCE": 0, "NAN_IN_OUTPUT": 1, "MISMATCH": 2}
        worst_status = min((s for s, _ in problems), key=order.get)
        res.update(status=worst_status, reason="; ".join(r for _, r in problems[:3]) +
                   (f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""))
    else:
        res.update(status="OK", reason=f"{nan_both} NaN at the same places on both sides" if nan_both else "")
    return res


def summarize(rows: list[dict]) -> dict:
    counts = Counter(r["status"] for r in rows)
    grads = [r for r in rows if r.get("grad_tol_ratio") is not None]
    finite = [r["max_abs"] for r in rows if isinstance(r.get("max_abs"), float) and math.isfinite(r["max_abs"])]
    return {"cases": len(rows), "counts": {s: counts[s] for s in STATUS_ORDER if counts[s]},
            "ok": counts["OK"], "grad_checked": len(grads),
            "grad_ok": sum(1 for r in grads if r["status"] == "OK"),
            "max_abs": max(finite) if finite else None}
