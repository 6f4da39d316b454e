"""The layout of parity's metrics files, and the one place that reads their keys.

Two files per run, made for two kinds of reader:

artifacts/report/summary.json: the only DVC metric of the model pipeline (dvc.yaml `metrics:`), what
`dvc exp show` and `dvc metrics diff` print. Compact and collision-free, so a table of experiments
stays narrow: the totals, then one small entry per cell, keyed by the cell's name (cell names always
contain '-', the totals never do):

    {"cells": 8, "passed": 3, "failed": 1, "not_run": 0, "baseline": 4,
     "mlp-fp16-ort_cpu": {"verdict": "FAIL", "worst": 3.2, "origin": "fc1"}, ...}

  baseline, not_exercised   totals of the cells with those verdicts, only when there are some
  verdict  PASS, FAIL, NOT_EXERCISED (within the limit, but no layer shows the rounding of the
           cell's precision: parity.core.oracle.precision), BASELINE (the oracle's baseline backend,
           judged against itself), or the status of a cell that did not run (UNSUPPORTED, ...)
  worst    the cell's worst error over what its verdict allows (1 is the limit: the oracle's
           excess / k over every layer and own error; tolerance mode: the worst tol_ratio)
  origin   the drift origin (first layer whose error fails), only when there is one
  plan_keep, plan_passes   with analysis.plan: modules the plan keeps in float32, and whether it passes
  suites: {suite-dtype-provider: {cases, ok}}   with suites selected (the suite cells' counts)

artifacts/diff/<cell>/metrics.json: every detail of one cell (verdict mode and reason, drift origin
with its cause, worst layer, output and plain-output metrics). A plain DVC output, not a `metrics:`
entry (its ~40 keys per cell made `dvc exp show` 380 columns wide); `parity compare`, `parity exp`
and `dvc metrics diff --targets artifacts/diff/<cell>/metrics.json` read it at any revision.

Older revisions (before this layout) have `per_cell: {cell: {verdict, drift_origin}}` in
summary.json; `cells_of` reads both. Light: no numpy.
"""

from __future__ import annotations

import re

from parity.core import paths, status

SUMMARY = "summary.json"          # under the report stage's --out
CELL_METRICS = paths.CELL_METRICS  # under artifacts/diff/<cell>/ (parity.core.paths)
TOTALS = ("cells", "passed", "failed", "not_run")
RAN = status.VERDICTS  # the one vocabulary: parity.core.status
# totals written only when a cell has that verdict (so a run without them keeps its summary.json)
EXTRA_TOTALS = {"baseline": status.Status.BASELINE.value, "not_exercised": status.Status.NOT_EXERCISED.value}
CELL_METRICS_PATH = re.compile(r"^artifacts/diff/(?P<cell>[^/]+)/metrics\.json$")


def is_cell(key: str) -> bool:
    """A summary.json key that names a cell (model-dtype-provider), not a total."""
    return "-" in key


def cell_entry(m: dict, plan: dict | None = None) -> dict:
    """summary.json's entry of one cell, from its metrics.json (and its plan.json)."""
    e = {"verdict": verdict(m)}
    w = m.get("worst_ratio")
    if w is not None:  # a number, or "inf"/"nan" as parity.core.io writes them (an error past any tolerance)
        e["worst"] = w
    if m.get("drift_origin"):
        e["origin"] = m["drift_origin"]
    if m.get("shapes"):  # several input shapes (parity.pipeline.cellfiles): each shape's verdict
        e["shapes"] = {lab: x.get("verdict") for lab, x in m["shapes"].items()}
    if plan:
        e["plan_keep"] = len(plan.get("keep") or [])
        e["plan_passes"] = plan.get("passes")
    return e


def suite_entries(coverage: dict) -> dict:
    """summary.json's `suites` entry from the report's coverage ({suite: coverage json or None}):
    {suite-dtype-provider: {cases, ok}}."""
    out = {}
    for suite, cov in sorted((coverage or {}).items()):
        for col in (cov or {}).get("columns", []):
            provider, _, dtype = col.partition("/")
            counts = (cov.get("counts") or {}).get(col) or {}
            out[f"{suite}-{dtype}-{provider}"] = {"cases": sum(counts.values()), "ok": counts.get("OK", 0)}
    return out


def summary(entries: dict[str, dict], suites: dict | None = None) -> dict:
    """summary.json from {cell: cell_entry} (and suite_entries): the totals, the cells, `suites`."""
    vs = [e.get("verdict") for e in entries.values()]
    s = {"cells": len(vs), "passed": sum(v == status.Status.PASS for v in vs),
         "failed": sum(v == status.Status.FAIL for v in vs)}
    s["not_run"] = sum(v not in RAN for v in vs)
    for key, v in EXTRA_TOTALS.items():  # only when some cell has that verdict
        if vs.count(v):
            s[key] = vs.count(v)
    for key, e in entries.items():
        if not is_cell(key):
            raise ValueError(f"cell name without '-': {key!r}")
        s[key] = e
    if suites:
        s["suites"] = suites
    return s


def cells_of(s: dict) -> dict[str, dict]:
    """{cell: entry} of a summary.json, this layout or the older `per_cell` one (where `origin` was
    `drift_origin`)."""
    if isinstance(s.get("per_cell"), dict):
        return {c: {"verdict": e.get("verdict"), **({"origin": e["drift_origin"]} if e.get("drift_origin") else {}),
                    **{k: v for k, v in e.items() if k not in ("verdict", "drift_origin")}}
                for c, e in s["per_cell"].items()}
    return {k: v for k, v in s.items() if is_cell(k) and isinstance(v, dict)}


def totals(s: dict) -> dict:
    return {k: s.get(k) for k in TOTALS + tuple(EXTRA_TOTALS) if k in TOTALS or k in s}


# -- a cell's metrics.json -------------------------------------------------------------------------

def verdict(m: dict) -> str:
    return m.get("verdict") or m.get("status") or "MISSING"


def origin(m: dict) -> str | None:
    """The drift origin of a cell's metrics.json or summary entry."""
    return m.get("drift_origin") or m.get("origin")


def output(m: dict, key: str, plain: bool = False):
    """An output-level metric (max_abs, rel_l2, excess, ...) of the model's output, or of the shipped
    graph's (plain: model.onnx)."""
    return (m.get("plain_output" if plain else "output") or {}).get(key)


def cell_path(cell: str) -> str:
    return paths.cell_metrics(cell)
