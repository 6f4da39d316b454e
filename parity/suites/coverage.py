"""The coverage matrix of a suite: a row per case, grouped by op, x (provider/dtype) -> status,
with support rates per provider, an ONNX-export column, max_abs histograms and latency relative to
the reference. Light: json/csv only (no numpy, no torch), so the report stage can import it.

`rows` has one row per case (in op order, then case order) with that case's numbers in each cell
(status, reason, max_abs, rel_l2, tol_ratio, grad_tol_ratio, tolerance source, the fp64 oracle's
verdict and excess, latency ratio);
`ops` has one row per op whose status in a cell is the worst over its cases (the reason is the first
case with that status). `supported` counts cases the provider ran (OK, MISMATCH, NAN_*); INVALID
cases (they fail on the reference too) and SKIPPED ones (skip_on) are left out of the rates. ONNX
model cases at a reduced dtype carry `exercised` (parity.suites.onnxcase): whether the op computed at
that dtype, per case and counted per op cell.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from pathlib import Path

from parity.core import status

# worst first: what an op's cell shows when its cases disagree
SEVERITY = status.SEVERITY  # the one vocabulary: parity.core.status
RAN = status.CASE_RAN
CASE_NUMBERS = ("max_abs", "rel_l2", "tol_ratio", "grad_max_abs", "grad_tol_ratio", "tol_source", "grad_tol_source",
                "verdict", "excess", "grad_excess", "floor_from", "oracle_note", "note", "drawn", "exercised")
BUCKETS = (("0", 0.0), ("<1e-6", 1e-6), ("<1e-4", 1e-4), ("<1e-2", 1e-2), ("<1", 1.0), (">=1", math.inf))


def bucket(x) -> str | None:
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return None
    if x == 0:
        return "0"
    for name, hi in BUCKETS[1:]:
        if x < hi:
            return name
    return ">=1"


def build(suite: str, cells: list[tuple[str, str]], diff_dir: Path, timing_dir: Path | None = None,
          onnx_opset: int | None = None, onnx_providers=()) -> dict:
    """cells: (dtype, provider) in matrix order; reads diff_dir/<dtype>-<provider>/results.json and
    timing_dir/<dtype>-<provider>.json (when present). onnx_providers: the providers whose runner is
    ONNX-based (Runner.onnx_based): their EXPORT_FAILs make the ONNX column's EXPORT_FAIL."""
    cols, per_col, lat = [], {}, {}
    onnx_cols = {f"{prov}/{dtype}" for dtype, prov in cells if prov in set(onnx_providers)}
    for dtype, prov in cells:
        col = f"{prov}/{dtype}"
        cols.append(col)
        f = Path(diff_dir) / f"{dtype}-{prov}" / "results.json"
        per_col[col] = json.loads(f.read_text())["cases"] if f.exists() else None
        t = Path(timing_dir) / f"{dtype}-{prov}.json" if timing_dir else None
        lat[col] = json.loads(t.read_text())["cases"] if t and t.exists() else {}
    ops = _ops(cols, per_col, lat, onnx_cols)
    op_rows = [_row(op, cols) for op in ops.values()]
    rows = _case_rows(cols, per_col, lat, ops)
    stats = _column_stats(cols, per_col)
    kinds = {c.get("kind") for cases in per_col.values() if cases for c in cases}
    ref = ("each model's expected outputs (ONNX backend-test output_<j>.pb)" if kinds == {"onnx"} else
           "torch_cpu/fp32 eager on the dtype-rounded inputs")
    if kinds == {"onnx"}:
        onnx_opset = "each model's own"  # no per-op export: the cases are ONNX models
    return {"suite": suite, "columns": cols, "reference": ref,
            "onnx_opset": onnx_opset, "rows": rows, "ops": op_rows, "counts": stats["counts"], "support": stats["support"],
            "pass_rate": stats["pass_rate"], "support_by_provider": stats["support_by_provider"],
            "histogram": stats["histogram"], "buckets": [n for n, _ in BUCKETS],
            # backward checks vs the fp32 reference's gradients (input and parameter grads)
            "gradients": stats["gradients"]}


def _ops(cols: list[str], per_col: dict, lat: dict, onnx_cols: set) -> dict[str, dict]:
    """Per op label: its case ids, ONNX op types, whether an ONNX-based cell failed to export, and per
    column its cases' (status, reason, id), max_abs values and latency ratios."""
    ops: dict[str, dict] = {}
    for col in cols:
        for r in per_col[col] or []:
            op = ops.setdefault(r["label"], {"op": r["label"], "case_ids": [], "onnx": set(), "onnx_fail": False,
                                             "cells": {}})
            if r["id"] not in op["case_ids"]:
                op["case_ids"].append(r["id"])
            if r.get("onnx_ops"):
                op["onnx"].update(r["onnx_ops"])
            if col in onnx_cols and r["status"] == "EXPORT_FAIL":
                op["onnx_fail"] = True
            cell = op["cells"].setdefault(col, {"statuses": [], "max_abs": [], "ratios": [], "exercised": []})
            cell["statuses"].append((r["status"], r["reason"], r["id"]))
            if r.get("exercised") and r["status"] in RAN:
                cell["exercised"].append(r["exercised"]["exercised"])
            if r.get("max_abs") is not None:
                cell["max_abs"].append(r["max_abs"])
            t = lat[col].get(r["id"])
            if t and t.get("ref_latency_ms"):
                cell["ratios"].append(t["latency_ms"] / t["ref_latency_ms"])
    return ops


def _case_rows(cols: list[str], per_col: dict, lat: dict, ops: dict) -> list[dict]:
    """A row per case, grouped by op (op order, then case order), with the case's own numbers per column."""
    cases: dict[str, dict] = {}
    for col in cols:
        for r in per_col[col] or []:
            t = lat[col].get(r["id"])
            crow = cases.setdefault(r["id"], {"op": r["label"], "case": r["id"], "kind": r.get("kind"), "onnx": "",
                                              "cells": {}})
            if r.get("onnx_ops") and not crow["onnx"]:
                crow["onnx"] = " ".join(sorted(r["onnx_ops"]))
            crow["cells"][col] = {"status": r["status"], "reason": r.get("reason", ""),
                                  **{k: r[k] for k in CASE_NUMBERS if r.get(k) is not None},
                                  "latency_ratio": (t["latency_ms"] / t["ref_latency_ms"]
                                                    if t and t.get("ref_latency_ms") else None)}
    rows = []
    for op in ops.values():
        for cid in op["case_ids"]:
            crow = cases[cid]
            for col in cols:
                crow["cells"].setdefault(col, {"status": "NOT_RUN", "reason": "no result (stage not run)"})
            rows.append(crow)
    return rows


def _row(op: dict, cols: list[str]) -> dict:
    """An op's row: per column the worst status of its cases (SEVERITY) with that case's reason."""
    out = {"op": op["op"], "cases": len(op["case_ids"]),
           "onnx": ("EXPORT_FAIL" if op["onnx_fail"] and not op["onnx"] else " ".join(sorted(op["onnx"]))),
           "cells": {}}
    for col in cols:
        c = op["cells"].get(col)
        if c is None:
            out["cells"][col] = {"status": "NOT_RUN", "reason": "no result (stage not run)", "n": 0, "n_ok": 0}
            continue
        worst = min(c["statuses"], key=lambda s: SEVERITY.index(s[0]) if s[0] in SEVERITY else 0)
        n_ok = sum(1 for s in c["statuses"] if s[0] == "OK")
        reason = worst[1] if worst[0] == "OK" else f"{worst[2]}: {worst[1]}"
        if len(c["statuses"]) > 1:
            reason = f"{n_ok}/{len(c['statuses'])} cases OK. " + reason
        out["cells"][col] = {"status": worst[0], "reason": reason, "n": len(c["statuses"]), "n_ok": n_ok,
                             "max_abs": max(c["max_abs"]) if c["max_abs"] else None,
                             "latency_ratio": statistics.median(c["ratios"]) if c["ratios"] else None,
                             **_exercised(c["exercised"])}
    return out


def _exercised(flags: list) -> dict:
    """An op cell's precision evidence (ONNX cases at a reduced dtype, parity.suites.onnxcase.exercised):
    of its cases that ran, how many computed at the cell's dtype (True), ran fp32 kernels (False) or
    cannot tell (None: only the storage rounding shows), and a word for the matrix."""
    if not flags:
        return {}
    n, k, f = len(flags), sum(x is True for x in flags), sum(x is False for x in flags)
    label = ("computed" if k == n else "fp32 kernels" if f == n else "cannot tell" if k == f == 0 else
             f"computed {k}, fp32 {f}, cannot tell {n - k - f}")
    return {"exercised": {"cases": n, "computed": k, "fp32": f, "label": label}}


def _column_stats(cols: list[str], per_col: dict) -> dict:
    """Per column: status counts, support and pass rates, the max_abs histogram, gradient checks;
    support per provider over its columns."""
    counts, support, hist, pass_rate, grads = {}, {}, {}, {}, {}
    by_prov: dict[str, list[int]] = {}
    for col in cols:
        rs = per_col[col] or []
        cnt: dict[str, int] = {}
        for r in rs:
            cnt[r["status"]] = cnt.get(r["status"], 0) + 1
        counts[col] = dict(sorted(cnt.items(), key=lambda kv: SEVERITY.index(kv[0]) if kv[0] in SEVERITY else 0))
        valid = [r for r in rs if r["status"] not in ("INVALID", "SKIPPED")]
        ran = sum(1 for r in valid if r["status"] in RAN)
        support[col] = ran / len(valid) if valid else None
        pass_rate[col] = sum(1 for r in valid if r["status"] == "OK") / len(valid) if valid else None
        h = {name: 0 for name, _ in BUCKETS}
        for r in rs:
            b = bucket(r.get("max_abs"))
            if b:
                h[b] += 1
        hist[col] = h
        g = [r for r in rs if r.get("grad_tol_ratio") is not None]
        worst_g = max(g, key=lambda r: r["grad_tol_ratio"], default=None)
        grads[col] = {"checked": len(g), "ok": sum(1 for r in g if r["status"] == "OK"),
                      "worst_tol_ratio": worst_g["grad_tol_ratio"] if worst_g else None,
                      "worst_case": worst_g["id"] if worst_g else None}
        acc = by_prov.setdefault(col.split("/")[0], [0, 0])
        acc[0] += ran
        acc[1] += len(valid)
    return {"counts": counts, "support": support, "pass_rate": pass_rate, "histogram": hist, "gradients": grads,
            "support_by_provider": {p: (a / b if b else None) for p, (a, b) in by_prov.items()}}


def _yes(e: dict | None) -> str:
    return "" if not e else {True: "yes", False: "no (fp32 kernels)", None: "cannot tell"}[e["exercised"]]


def to_csv(cov: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    cols = cov["columns"]
    ex = [c for c in cols if any(r["cells"][c].get("exercised") for r in cov["rows"])]
    w.writerow(["op", "case", f"onnx_ops(opset {cov.get('onnx_opset')})", *cols, *(f"exercised {c}" for c in ex)])
    for r in cov["rows"]:  # a row per case, grouped by op; the precision evidence of reduced-dtype ONNX cases
        w.writerow([r["op"], r["case"], r["onnx"], *(r["cells"][c]["status"] for c in cols),
                    *(_yes(r["cells"][c].get("exercised")) for c in ex)])
    w.writerow(["(support rate)", "", "", *("" if cov["support"][c] is None else f"{cov['support'][c]:.3f}" for c in cols)])
    w.writerow(["(pass rate)", "", "", *("" if cov["pass_rate"][c] is None else f"{cov['pass_rate'][c]:.3f}" for c in cols)])
    return buf.getvalue()
