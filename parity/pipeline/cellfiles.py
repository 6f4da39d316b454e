"""What the diff stage writes of a cell (parity.pipeline.diff), from its judged shapes
(parity.pipeline.diff.judge): metrics.json (verdict and its mode, drift_origin with its cause,
worst layer, worst_ratio, output-level metrics), layers.json (every layer's metrics, the causes, the
oracle's own errors) and layers.csv (the DVC plot), and the stage's summary line.

Shapes (`models.<m>.shapes`, parity.config.inputspec): every shape is a sample set of the same cell,
diffed on its own (layers, verdict, drift origin), then combined into the cell's result.

The cell passes when every shape passes. Otherwise its top-level metrics are those of the first shape
that does not pass (`shape` names it, `failing_shapes` lists them all, the drift origin's place says
`at shape <label>`), so every reader of metrics.json (summary.json, `parity show`, the report)
attributes the failure to its shape. `shapes` holds each shape's verdict and main numbers. A model
without `shapes` is one sample set (label None): no `shape`/`shapes` keys, its files as they always were.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from parity.core import compare, status, store
from parity.core.verdict import decide
from parity.core.io import write_json, write_text

# layers.csv, the DVC plot (dvc.yaml `plots:`, drawn by parity/pipeline/plot_layers.json): `ratio` is what the
# verdict judges over its limit (oracle: excess / k; tolerance: tol_ratio; as the judge computed it,
# parity.core.oracle.ratios), so 1 is the limit in both; `own_ratio` the same for the layer's own
# error. Every number is finite (a log axis and Vega's scales need it): a non-finite or larger ratio is
# drawn at PLOT_CAP and `note` says so; a zero ratio (exact) is left empty with the note "0 (exact)" (the
# template draws it as a square a decade below the smallest value).
PLOT_FIELDS = ("order", "layer", "ratio", "own_ratio", "passed", "max_abs", "rel_l2", "tol_ratio", "excess",
               "bits_lost", "own_excess", "note")
PLOT_CAP = 1.0e6


# what metrics.json keeps per shape (the full per-layer tables are in layers.json `shapes`)
SHAPE_KEYS = ("verdict", "status", "reason", "passed", "layers", "layers_failed", "drift_origin", "worst_layer",
              "worst_ratio")


def write(shapes: list, layers_json: dict, key: str, out: Path) -> str:
    """metrics.json, layers.json and layers.csv of a cell under `out` from its (label, CellDiff) per
    shape (label None: a model without shapes), as judged: nothing of the config. The summary line."""
    ms = [(lab, metrics_of(c, layers_json)) for lab, c in shapes]
    cd, m = (shapes[0][1], ms[0][1]) if shapes[0][0] is None else (shapes[deciding(ms)][1], combine(ms))
    layers = layers_json_of(cd, key, shapes)
    csv_text, line = plot_csv(cd), summary_line(m, cd)
    write_json(out / "metrics.json", m)
    write_json(out / "layers.json", layers, sort_keys=False)
    write_text(out / "layers.csv", csv_text)
    return line


def layers_json_of(cd, key: str, shapes: list) -> dict:
    """layers.json: the deciding shape's layers at the top, every shape's under `shapes`."""
    extra = {} if shapes[0][0] is None else {"shape": next(lab for lab, c in shapes if c is cd), "shapes": {
        lab: {"layers": [d.as_dict() for d in c.layers], "own": c.own} for lab, c in shapes}}
    return {"cell": key, "verdict_mode": cd.mode, "verdict_mode_reason": cd.mode_reason,
            "drift_origin_cause": cd.summary.get("drift_origin_cause"),
            "hist_edges": list(compare.HIST_EDGES),  # each layer's `hist` bins
            "settings": cd.status.get("settings") or {}, "layer_causes": cd.layer_causes,
            "layers": [d.as_dict() for d in cd.layers], "own": cd.own, **extra}


def _output_metrics(d) -> dict:
    if not d:
        return {}
    m = {k: getattr(d, k) for k in compare.METRICS + ("nan_actual", "inf_actual", "passed")}
    if d.oracle:
        m.update(excess=d.oracle["excess"], bits_lost=d.oracle["bits_lost"])
    return m


def metrics_of(cd, layers_json: dict) -> dict:
    """metrics.json of a cell."""
    status, summary = cd.status, cd.summary
    outputs = cd.outputs
    head = next((d for d in outputs if not d.name.startswith(store.PLAIN)), None)
    plain = next((d for d in outputs if d.name.startswith(store.PLAIN)), None)
    verdict = decide(status, summary).status  # the one verdict function (parity.core.verdict)
    m = {
        "status": status["status"], "verdict": verdict, "reason": status.get("reason", ""),
        "verdict_mode": cd.mode, "passed": summary["passed"],
        **{k: summary.get(k) for k in ("layers", "layers_failed", "drift_origin", "worst_layer",
                                       "worst_tol_ratio", "worst_excess")},
        "output": _output_metrics(head),
        "plain_output": _output_metrics(plain),  # the shipped graph (model.onnx), no extra outputs
    }
    if status["status"] == "OK":  # the worst error over the verdict's limit (parity.core.oracle.worst_ratio)
        m["worst_ratio"] = summary["worst_ratio"]
    if cd.mode != "oracle" and status["status"] == "OK":
        m["verdict_mode_reason"] = cd.mode_reason
    if summary.get("precision") is not None:
        m["precision"] = summary["precision"]
    if summary.get("baseline"):
        m["baseline"] = summary["baseline"]
    if summary.get("notes"):  # the oracle's notes (parity.core.oracle.judge)
        m["notes"] = summary["notes"]
    if summary.get("quant"):  # the quantisation's cost, not judged (diff.quant_summary)
        m["quant"] = summary["quant"]
    origin = summary.get("drift_origin")
    if origin:
        m["drift_origin_where"] = where(origin, layers_json)
        cause = summary.get("drift_origin_cause") or {}
        m["drift_origin_cause"] = {"label": cause.get("label"), "summary": cause.get("summary")}
    return m


def where(name: str, layers_json: dict) -> str:
    """A readable place: 'Softmax, MatMul between qkv and out' for the ops between leaves."""
    if not name.startswith(store.BETWEEN):
        return name
    leaf = name[len(store.BETWEEN):]
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
    # 0 (a bit-exact layer) has no place on a log axis: left empty, and the note says so (plot_layers.json
    # draws it as a square a decade below the smallest value: `dvc plots diff` lost it without a word)
    return ("", "0 (exact)") if v <= 0 else (repr(v), "")


def plot_csv(cd) -> str:
    """layers.csv: one row per layer in execution order, the verdict's ratio to its limit (1) first
    (the judge's, parity.core.oracle.ratios)."""
    own = {r["layer"]: r["excess"] for r in cd.own if r["kind"] == "leaf"}
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(PLOT_FIELDS)
    for d in cd.layers:
        o = d.oracle or {}
        ex, own_ex = o.get("excess"), own.get(d.name)
        ratio, note = _ratio(cd.ratios[d.name][0])
        own_ratio, own_note = _ratio(cd.ratios[d.name][1])
        w.writerow([d.order, d.name, ratio, own_ratio, int(d.passed), _num(d.max_abs), _num(d.rel_l2),
                    _num(d.tol_ratio), _num(ex), _num(o.get("bits_lost")), _num(own_ex),
                    "; ".join(n for n in (note, own_note and f"own {own_note}") if n)])
    return buf.getvalue()


def summary_line(m: dict, cd) -> str:
    per = "".join(f" [{lab}: {x['verdict']}]" for lab, x in (m.get("shapes") or {}).items())  # models.<m>.shapes
    if m["status"] != "OK":
        return m["verdict"] + (f": {m['reason']}" if m.get("reason") else "") + per
    # one verdict number, on one scale and by one name wherever it is shown (issue 36 item 11: a PASS cell's
    # log said tol_ratio 43.2, an assert_close number the oracle verdict does not judge): excess/limit
    ratio = m.get("worst_ratio")
    worst = (f"worst excess/limit={'inf' if ratio in ('inf', float('inf')) else format(ratio, '.3g')}"
             if ratio is not None else "worst excess/limit=-") + (f" at {m['worst_layer']}" if m.get("worst_layer") else "")
    origin = m.get("drift_origin_where") or m.get("drift_origin")
    cause = (m.get("drift_origin_cause") or {}).get("summary")
    return (f"{m['verdict']}{per} [{cd.mode}]: {status.layer_counts(m)}, "
            + (f"drift_origin={origin}{' (' + cause + ')' if cause else ''}, " if origin else "")
            + f"{worst}, output max_abs={m['output'].get('max_abs', 0):.3e}"
            + (f" bits_lost={m['output']['bits_lost']:.1f}" if m['output'].get('bits_lost') is not None else "")
            + (f"; {(m.get('precision') or {}).get('evidence')}" if m.get("precision") else "")
            + (f"; {m['baseline']}" if m.get("baseline") else "") + _quant_cost(m.get("quant")))


def _quant_cost(q: dict | None) -> str:
    """The quantisation's expected cost, apart from the verdict (diff.quant_summary)."""
    if not q:
        return ""
    differ = q.get("weights_differ") or []
    return (f"; {q['scheme']} cost (not judged): output rel_l2 {q.get('cost_output') or 0:.3g} vs fp32, largest "
            f"layer {q.get('cost_max') or 0:.3g}" + (f"; packed weights differ from parity's at {', '.join(differ[:4])}"
                                                     if differ else ""))


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
