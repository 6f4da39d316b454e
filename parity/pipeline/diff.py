"""The diff of one cell: per-layer comparison of a capture against the torch fp32 reference (tolerance
metrics) and the fp64 oracle relative to the trusted baseline (parity.analysis.diffcell), turned into
what the diff stage writes: metrics.json, layers.json, layers.csv. numpy only, imported where used."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import TYPE_CHECKING

from parity.config import params as config
from parity.core import tolerance
from parity.core.io import read_json, write_json, write_text
from parity.core.metrics import worst_ratio

if TYPE_CHECKING:
    from parity.analysis import diffcell

# layers.csv, the DVC plot (dvc.yaml `plots:`, drawn by parity/pipeline/plot_layers.json): `ratio` is what the
# verdict judges over its limit (oracle: excess / k; tolerance: tol_ratio), so 1 is the limit in both;
# `own_ratio` the same for the layer's own error. Every number is finite (a log axis and Vega's
# scales need it): a non-finite or larger ratio is drawn at PLOT_CAP and `note` says so; a zero ratio
# (exact) is left empty, off the log axis.
PLOT_FIELDS = ("order", "layer", "ratio", "own_ratio", "passed", "max_abs", "rel_l2", "tol_ratio", "excess",
               "bits_lost", "own_excess", "note")
PLOT_CAP = 1.0e6


def _output_metrics(d) -> dict:
    from parity.core import compare

    if not d:
        return {}
    m = {k: getattr(d, k) for k in compare.METRICS + ("nan_actual", "inf_actual", "passed")}
    if d.oracle:
        m.update(excess=d.oracle["excess"], bits_lost=d.oracle["bits_lost"])
    return m


def metrics_of(key: str, cd: diffcell.CellDiff, layers_json: dict, k: float = 4.0) -> dict:
    """metrics.json of a cell; k: the oracle's limit on excess (dtypes.<d>.oracle.k)."""
    from parity.core import store

    status, summary = cd.status, cd.summary
    outputs = [d for d in cd.layers if store.is_output(d.name)]
    head = next((d for d in outputs if not d.name.startswith(store.PLAIN)), None)
    plain = next((d for d in outputs if d.name.startswith(store.PLAIN)), None)
    verdict = status["status"] if status["status"] != "OK" else cell_verdict(summary)
    m = {
        "status": status["status"], "verdict": verdict, "reason": status.get("reason", ""),
        "verdict_mode": cd.mode, "passed": summary["passed"],
        **{k: summary.get(k) for k in ("layers", "layers_failed", "drift_origin", "worst_layer",
                                       "worst_tol_ratio", "worst_excess")},
        "output": _output_metrics(head),
        "plain_output": _output_metrics(plain),  # the shipped graph (model.onnx), no extra outputs
    }
    if status["status"] == "OK":
        excesses = [d.oracle["excess"] for d in cd.layers if d.oracle] + [r["excess"] for r in cd.own]
        m["worst_ratio"] = worst_ratio(cd.mode, k, excesses, summary.get("worst_tol_ratio"))
    if cd.mode != "oracle" and status["status"] == "OK":
        m["verdict_mode_reason"] = cd.mode_reason
    if summary.get("precision") is not None:
        m["precision"] = summary["precision"]
    if summary.get("baseline"):
        m["baseline"] = summary["baseline"]
    origin = summary.get("drift_origin")
    if origin:
        m["drift_origin_where"] = where(origin, layers_json)
        cause = summary.get("drift_origin_cause") or {}
        m["drift_origin_cause"] = {"label": cause.get("label"), "summary": cause.get("summary")}
    return m


def cell_verdict(summary: dict) -> str:
    """FAIL when a layer fails; else BASELINE (the oracle's baseline judged against itself),
    NOT_EXERCISED (no layer shows the rounding of the cell's precision), or PASS (parity.core.status)."""
    if not summary["passed"]:
        return "FAIL"
    if summary.get("baseline"):
        return "BASELINE"
    if (summary.get("precision") or {}).get("exercised") is False:
        return "NOT_EXERCISED"
    return "PASS"


def where(name: str, layers_json: dict) -> str:
    """A readable place: 'Softmax, MatMul between qkv and out' for the ops between leaves."""
    from parity.analysis import diffcell

    if not name.startswith(diffcell.BETWEEN):
        return name
    leaf = name[len(diffcell.BETWEEN):]
    reg = (layers_json.get("regions") or {}).get(leaf) or {}
    ops = [o for o in reg.get("ops", []) if o not in ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity",
                                                      "Constant", "Shape", "Gather", "Concat", "Slice", "Split")]
    ops = ops or reg.get("ops", [])
    after = ", ".join(reg.get("after", [])) or "the inputs"
    return f"{', '.join(dict.fromkeys(ops)) or 'ops'} between {after} and {leaf}"


def _num(v) -> str:
    return "" if v is None or not math.isfinite(v) else repr(v)


def _ratio(v) -> tuple[str, str]:
    """(plotted ratio, note) for a ratio to the limit: capped, finite, empty when zero or unknown."""
    if v is None:
        return "", ""
    if not math.isfinite(v) or v > PLOT_CAP:
        return repr(PLOT_CAP), f"{v!r}, drawn at {PLOT_CAP:g}"
    return ("", "") if v <= 0 else (repr(v), "")


def plot_csv(cd: diffcell.CellDiff, k: float) -> str:
    """layers.csv: one row per layer in execution order, the verdict's ratio to its limit (1) first."""
    own = {r["layer"]: r["excess"] for r in cd.own if r["kind"] == "leaf"}
    oracle = cd.mode == "oracle"
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(PLOT_FIELDS)
    for d in cd.layers:
        o = d.oracle or {}
        ex, own_ex = o.get("excess"), own.get(d.name)
        ratio, note = _ratio((ex / k if ex is not None and k > 0 else None) if oracle else d.tol_ratio)
        own_ratio, own_note = _ratio(own_ex / k if oracle and own_ex is not None and k > 0 else None)
        w.writerow([d.order, d.name, ratio, own_ratio, int(d.passed), _num(d.max_abs), _num(d.rel_l2),
                    _num(d.tol_ratio), _num(ex), _num(o.get("bits_lost")), _num(own_ex),
                    "; ".join(n for n in (note, own_note and f"own {own_note}") if n)])
    return buf.getvalue()


def summary_line(m: dict, cd: diffcell.CellDiff) -> str:
    per = "".join(f" [{lab}: {x['verdict']}]" for lab, x in (m.get("shapes") or {}).items())  # models.<m>.shapes
    if m["status"] != "OK":
        return m["verdict"] + (f": {m['reason']}" if m.get("reason") else "") + per
    worst = (f"worst={m['worst_layer']} (excess {m['worst_excess']:.3g})" if cd.mode == "oracle" and m.get("worst_excess")
             is not None else f"worst={m['worst_layer']} (tol_ratio {m['worst_tol_ratio']:.3g})")
    origin = m.get("drift_origin_where") or m.get("drift_origin")
    cause = (m.get("drift_origin_cause") or {}).get("summary")
    return (f"{m['verdict']}{per} [{cd.mode}]: {m['layers']} layers compared, {m['layers_failed']} failing, "
            f"drift_origin={origin}{' (' + cause + ')' if cause else ''}, {worst}, output max_abs={m['output'].get('max_abs', 0):.3e}"
            + (f" bits_lost={m['output']['bits_lost']:.1f}" if m['output'].get('bits_lost') is not None else "")
            + (f"; {(m.get('precision') or {}).get('evidence')}" if m.get("precision") else "")
            + (f"; {m['baseline']}" if m.get("baseline") else ""))


def diff_and_write(p: dict, model: str, dtype: str, provider: str, capture: Path, reference: Path,
                   baseline: Path | None, model_dir: Path | None, out: Path) -> str:
    """Diff the cell, write metrics.json, layers.json and layers.csv under `out`; the summary line."""
    from parity.core import compare
    from parity.analysis import diffcell, shapes

    key = config.cell_key(model, dtype, provider)
    lj = model_dir / "layers.json" if model_dir else None
    layers_json = read_json(lj) if lj and lj.exists() else {}
    cell = diffcell.load(capture, reference, baseline)  # the values: nothing of the config
    rule = tolerance.rule(p, model, dtype, cell.names)  # the config: resolved once
    k = rule.limits.k
    per_shape = shapes.cell_diffs(rule, cell)  # models.<m>.shapes: per shape
    if per_shape is None:
        cd = diffcell.diff_cell(rule, cell)
        m = metrics_of(key, cd, layers_json, k)
    else:
        ms = [(lab, metrics_of(key, c, layers_json, k)) for lab, c in per_shape]
        cd, m = per_shape[shapes.deciding(ms)][1], shapes.combine(ms)
    write_json(out / "metrics.json", m)
    extra = {} if per_shape is None else {"shape": m["shape"], "shapes": shapes.layers_json(
        [(lab, {"layers": [d.as_dict() for d in c.layers], "own": c.own}) for lab, c in per_shape])}
    write_json(out / "layers.json", {"cell": key, "verdict_mode": cd.mode, "verdict_mode_reason": cd.mode_reason,
                                     "drift_origin_cause": cd.summary.get("drift_origin_cause"),
                                     "hist_edges": list(compare.HIST_EDGES),  # each layer's `hist` bins
                                     "settings": cd.status.get("settings") or {}, "layer_causes": cd.layer_causes,
                                     "layers": [d.as_dict() for d in cd.layers], "own": cd.own, **extra},
               sort_keys=False)
    write_text(out / "layers.csv", plot_csv(cd, k))
    return f"diff@{key}: {summary_line(m, cd)}"
