"""Per-shape results of a cell whose model lists several input shapes (`models.<m>.shapes`,
parity.config.inputspec): every shape is a sample set of the same cell, diffed on its own (layers, verdict,
drift origin), then combined into the cell's result.

The cell passes when every shape passes. Otherwise its top-level metrics are those of the first shape
that does not pass (`shape` names it, `failing_shapes` lists them all, the drift origin's place says
`at shape <label>`), so every reader of metrics.json (summary.json, `parity show`, the report)
attributes the failure to its shape. `shapes` holds each shape's verdict and main numbers. A model
without `shapes` never comes here: its artifacts are what they always were.
"""

from __future__ import annotations

from parity.core import status, tolerance
from parity.analysis import diffcell

# what metrics.json keeps per shape (the full per-layer tables are in layers.json `shapes`)
SHAPE_KEYS = ("verdict", "status", "reason", "passed", "layers", "layers_failed", "drift_origin", "worst_layer",
              "worst_ratio")


def cell_diffs(rule: tolerance.Rule, cell: diffcell.Cell) -> list[tuple[str, diffcell.CellDiff]] | None:
    """(label, CellDiff) per shape (the rule's sample sets); None for a model without `shapes`."""
    if not rule.sample_sets:
        return None
    per = cell.status.get("shapes") or {}
    return [(lab, diffcell.diff_cell(rule, cell, samples=idx, status={**cell.status, **per.get(lab, {})}))
            for lab, idx in rule.sample_sets]


def deciding(metrics: list[tuple[str, dict]]) -> int:
    """Index of the shape whose result is the cell's: the first that does not pass, else the first."""
    return next((i for i, (_, m) in enumerate(metrics) if m["verdict"] not in status.PASSING), 0)


def combine(metrics: list[tuple[str, dict]]) -> dict:
    """The cell's metrics.json from each shape's (label, metrics)."""
    lab, top = metrics[deciding(metrics)]
    m = dict(top)
    failing = [label for label, x in metrics if x["verdict"] not in status.PASSING]
    if failing and m.get("drift_origin"):
        m["drift_origin_where"] = f"{m.get('drift_origin_where') or m['drift_origin']} at shape {lab}"
    ratios = [x["worst_ratio"] for _, x in metrics if x.get("worst_ratio") is not None]
    if ratios and m.get("worst_ratio") is not None:
        m["worst_ratio"] = max(ratios)
    m["shape"] = lab
    m["failing_shapes"] = failing
    m["shapes"] = {label: {k: x.get(k) for k in SHAPE_KEYS if k in x} for label, x in metrics}
    return m


def layers_json(per_shape: list[tuple[str, dict]]) -> dict:
    """layers.json's `shapes`: {label: {layers, own}} (the top level holds the deciding shape's)."""
    return {label: {"layers": d["layers"], "own": d["own"]} for label, d in per_shape}
