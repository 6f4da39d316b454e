"""Render the summary across cells: Markdown, and a self-contained HTML page (inline SVG, no
scripts, no network) with per-layer error curves on a log scale. Light: stdlib only."""

from __future__ import annotations

import html
import math

from parity.core import svg
from parity.core.status import Status, layer_counts
from parity.suites.render import render_coverage_html

VERDICT_COLOURS = {"PASS": "#1a7f37", "FAIL": "#cf222e", "UNAVAILABLE": "#6e7781",
                   "UNSUPPORTED": "#6e7781", "EXPORT_FAIL": "#9a6700", "INFER_FAIL": "#9a6700", "COMPILE_FAIL": "#9a6700",
                   "MISSING": "#6e7781", "NOT_EXERCISED": "#bc4c00", "BASELINE": "#0969da"}
# a layer's row shows the judge's decision (layers.json `passed`), not a verdict of its own
LAYER_SHOWN = {True: "pass", False: Status.FAIL.value}


def fmt(v, digits: int = 3) -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        return f"{v:.{digits}e}" if v and (abs(v) < 1e-2 or abs(v) >= 1e4) else f"{v:.{digits}g}"
    return str(v)


def _num(v) -> float:
    if isinstance(v, str):
        return float(v)
    return float(v)


# metrics.json keys the report reads, by the name used here: when metrics.json renames a key, add the new
# name in front (one edit); dotted names reach nested keys.
METRIC_KEYS = {
    "verdict": ("verdict",), "verdict_mode": ("verdict_mode",), "verdict_mode_reason": ("verdict_mode_reason",),
    "reason": ("reason",), "layers": ("layers",), "layers_failed": ("layers_failed",),
    "drift_origin": ("drift_origin",), "drift_origin_where": ("drift_origin_where",),
    "drift_origin_cause": ("drift_origin_cause",), "worst_layer": ("worst_layer",),
    "output": ("output",), "precision": ("precision",), "baseline": ("baseline",),
}


def metric(m: dict, name: str, default=None):
    """One value of a cell's metrics.json (METRIC_KEYS names where it lives)."""
    for key in METRIC_KEYS.get(name, (name,)):
        v = m
        for part in key.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        if v is not None:
            return v
    return default


def shapes_text(m: dict) -> str:
    """'s16 PASS, s128 FAIL from fc1' for a model with several input shapes (parity.pipeline.cellfiles); ''
    otherwise."""
    return ", ".join(f"{lab} {x.get('verdict')}" + (f" from {x['drift_origin']}" if x.get("drift_origin") else "")
                     for lab, x in (metric(m, "shapes") or {}).items())


def extra_totals(summary: dict) -> str:
    """', 4 baseline (judged against themselves), 1 not exercised (...)' when there are such cells."""
    parts = []
    if summary.get("baseline"):
        parts.append(f"{summary['baseline']} baseline (the oracle's own backend, judged against itself)")
    if summary.get("not_exercised"):
        parts.append(f"{summary['not_exercised']} not exercised (no layer shows its precision's rounding)")
    return "".join(", " + x for x in parts)


def precision_text(m: dict) -> str:
    """'3 of 3 layers show fp16 rounding (...)' of a reduced-precision cell (parity.core.oracle.precision)."""
    return (metric(m, "precision") or {}).get("evidence") or ""


def verdict(c: dict) -> str:
    return metric(c["metrics"], "verdict", "MISSING")


def cell_rows(cells: list[dict]) -> list[list[str]]:
    rows = []
    for c in cells:
        m, t = c["metrics"], c.get("timing") or {}
        out = metric(m, "output") or {}
        ratio = c.get("latency_ratio")
        n = metric(m, "layers")
        rows.append([c["model"], c["dtype"], c["provider"], verdict(c), metric(m, "verdict_mode") or "-",
                     f"{metric(m, 'layers_failed', '-')}/{n}" if n is not None else "-",
                     fmt(metric(m, "drift_origin_where") or metric(m, "drift_origin")), fmt(metric(m, "worst_layer")),
                     fmt(results_ratio(m)), fmt(per_limit(c, out.get("excess"), out.get("tol_ratio"))),
                     fmt(out.get("bits_lost"), 2),
                     fmt(out.get("max_abs")), fmt(out.get("rel_l2")), fmt(out.get("cosine"), 6),
                     fmt(t.get("median_ms")) + (f" ({ratio:.2f}x)" if ratio else "")])
    return rows


HEADER = ["model", "dtype", "provider", "verdict", "mode", "failed/layers", "drift_origin", "worst layer",
          f"worst {svg.RATIO}", f"output {svg.RATIO}", "output bits lost", "output max_abs", "output rel_l2", "output cosine",
          "latency ms (vs torch_cpu fp32)"]


def per_limit(c: dict, excess, tol_ratio=None):
    """A verdict number on the one scale the report shows (svg.RATIO: 1 is the limit): in oracle mode an
    excess over the cell's k (dtypes.<d>.oracle.k), in tolerance mode the tol_ratio as it is."""
    if metric(c["metrics"], "verdict_mode") != "oracle":
        return _num(tol_ratio) if tol_ratio is not None else None
    k, x = c.get("k"), _num(excess) if excess is not None else None
    return x / k if x is not None and k else None


def results_ratio(m: dict):
    """The cell's worst excess/limit (metrics.json worst_ratio; summary.json's `worst`)."""
    v = metric(m, "worst_ratio")
    return float("inf") if v in ("inf", "Infinity") else v


def is_model_output(name: str) -> bool:
    """The model's own outputs among the layers (parity.core.store.OUTPUT / PLAIN naming)."""
    name = name.removeprefix("plain:")
    return name == "output" or name.startswith("output:")


def mismatch(d: dict) -> str:
    """torch.testing's "Mismatched elements: n / N (p%)" of one layer, against its atol/rtol."""
    n, total = d.get("n_outside") or 0, d.get("numel") or 0
    return f"{n} / {total} ({100 * n / total:.3g}%)" if total else "-"


def worst_element(d: dict) -> list[str]:
    """[where, actual, expected, allowed] at the layer's highest |a - b| / allowed: the sample and the
    index into that sample's tensor."""
    if "worst_actual" not in d or not d.get("numel"):
        return ["-", "-", "-", "-"]
    exp = _num(d["worst_expected"])
    allowed = d["atol"] + d["rtol"] * abs(exp) if math.isfinite(exp) else math.nan
    return [f"sample {d['worst_sample']} [{', '.join(str(i) for i in d['worst_index'])}]",
            value(d["worst_actual"]), value(exp), fmt(allowed)]


def value(v) -> str:
    """A tensor element: 8 significant digits (float32 needs up to 9 to round-trip; fp16 5)."""
    return f"{_num(v):.8g}"


WORST_HEAD = ["worst element", "actual", "expected", "allowed"]


def tolerance_rules(layers: list[dict]) -> list[tuple[str, str]]:
    """The distinct tolerances of a cell's layers, in first-use order: [(tag, 'atol=.. rtol=.. (key)')]."""
    seen = dict.fromkeys((d["atol"], d["rtol"], d["tol_source"]) for d in layers)
    return [(f"T{i + 1}", f"atol={a:g} rtol={r:g} ({src})") for i, (a, r, src) in enumerate(seen)]


def _rule_of(layers: list[dict]):
    """d -> its tolerance tag (T1, T2, ...) as tolerance_rules numbers them."""
    keys = dict.fromkeys((d["atol"], d["rtol"], d["tol_source"]) for d in layers)
    tags = {k: f"T{i + 1}" for i, k in enumerate(keys)}
    return lambda d: tags[(d["atol"], d["rtol"], d["tol_source"])]


def tolerance_legend(c: dict) -> str:
    """The tolerance once per rule (not once per row): 'atol=1e-05 rtol=0.001 (dtypes.fp16.tol), every layer'."""
    rules = tolerance_rules(c["layers"])
    if not rules:
        return ""
    if len(rules) == 1:
        return f"Tolerance of every layer: {rules[0][1]}."
    return "Tolerances (column rule): " + "; ".join(f"{t}: {r}" for t, r in rules) + "."
def settings_text(settings: dict | None) -> str:
    """What the runner resolved for a cell (status.json `settings`): each `key=value (why)` that has a
    `<key>_from`, and a warning when the settings put the cell at int8 saturation risk."""
    s = settings or {}
    parts = [f"{k}={str(v).lower() if isinstance(v, bool) else v} ({s[k + '_from']})"
             for k, v in s.items() if k + "_from" in s]
    if s.get("saturation_risk"):
        parts.append("int8 saturation risk: u8 x s8 GEMMs with full-range weights on a CPU without VNNI "
                     f"(int8 flags: {', '.join(s.get('cpu_int8_flags') or []) or 'none'})")
    return "; ".join(parts)


def failing_rows(c: dict) -> tuple[list[str], list[list[str]]]:
    """The failing layers of a cell (and, in oracle mode, the own-error records that fail), as a
    header and rows of plain strings: one builder for the Markdown and the HTML table. Every layer
    row says how many elements are outside its atol/rtol and where the worst one is."""
    layers = [d for d in c["layers"] if not d["passed"]]
    mods = c.get("modules") or {}
    multi = len(tolerance_rules(c["layers"])) > 1
    rule = _rule_of(c["layers"])
    if metric(c["metrics"], "verdict_mode") == "oracle":
        own = {r["name"]: r for r in c.get("own") or []}
        head = ["#", "layer", "module", f"{svg.RATIO} (accumulated)", f"own {svg.RATIO}", "bits lost",
                "mismatched (vs fp32)", *WORST_HEAD, "rel_l2 vs fp32", "cause"]
        rows = [[str(d["order"]), d["name"], mods.get(d["name"], ""), fmt(per_limit(c, (d.get("oracle") or {}).get("excess"))),
                 fmt(per_limit(c, (own.get(d["name"]) or {}).get("excess"))), fmt((d.get("oracle") or {}).get("bits_lost"), 2),
                 mismatch(d), *worst_element(d), fmt(d["rel_l2"]), ""] for d in layers]
        listed = {d["name"] for d in layers}
        rows += [["", r["name"], "ops between leaves" if r["kind"] == "between" else mods.get(r["layer"], ""),
                  "", fmt(per_limit(c, r["excess"])), fmt(r["bits_lost"], 2), "", "", "", "", "", "", ""]
                 for r in c.get("own") or [] if not r["passed"] and r["name"] not in listed]
        cause = metric(c["metrics"], "drift_origin_cause") or {}
        origin = metric(c["metrics"], "drift_origin")
        for r in rows:
            if r[1] == origin and cause:
                r[-1] = cause.get("summary") or cause.get("label", "")
    else:
        head = ["#", "layer", "module", "mismatched", *WORST_HEAD, "max_abs", "max_rel", "rel_l2", svg.RATIO]
        rows = [[str(d["order"]), d["name"], mods.get(d["name"], ""), mismatch(d), *worst_element(d), fmt(d["max_abs"]),
                 fmt(d["max_rel"]), fmt(d["rel_l2"]), fmt(d["tol_ratio"])] for d in layers]
    lc = c.get("layer_causes") or {}  # causes a cell's settings explain per layer (layers.json, when given)
    if lc:
        if head[-1] != "cause":
            head, rows = head + ["cause"], [r + [""] for r in rows]
        for r in rows:
            r[-1] = (lc.get(r[1]) or {}).get("summary") or r[-1]
    if multi:
        head.append("rule")
        by_name = {d["name"]: d for d in layers}
        for r in rows:
            r.append(rule(by_name[r[1]]) if r[1] in by_name else "")
    return head, rows


def layer_rows(c: dict) -> tuple[list[str], list[list[str]]]:
    """Every layer of a cell, passing or not (the collapsible table): one builder for both formats."""
    mods = c.get("modules") or {}
    oracle = metric(c["metrics"], "verdict_mode") == "oracle"
    multi = len(tolerance_rules(c["layers"])) > 1
    rule = _rule_of(c["layers"])
    # the verdict's number is excess/limit; in oracle mode tol_ratio (assert_close against fp32) judges nothing
    head = ["#", "layer", "module", "verdict", "mismatched", "max_abs", "max_rel", "rel_l2", "cosine",
            "tol_ratio vs fp32 (not judged)" if oracle else svg.RATIO]
    head += [svg.RATIO, "bits lost"] if oracle else []
    head += ["rule"] if multi else []
    rows = []
    for d in c["layers"]:
        o = d.get("oracle") or {}
        r = [str(d["order"]), d["name"], mods.get(d["name"], ""), d.get("problem") or LAYER_SHOWN[bool(d["passed"])],
             mismatch(d), fmt(d["max_abs"]), fmt(d["max_rel"]), fmt(d["rel_l2"]), fmt(d["cosine"], 6), fmt(d["tol_ratio"])]
        r += [fmt(per_limit(c, o.get("excess"))), fmt(o.get("bits_lost"), 2)] if oracle else []
        r += [rule(d)] if multi else []
        rows.append(r)
    return head, rows


def model_rows(models: dict) -> tuple[list[str], list[list[str]]]:
    """The op inventory of every model's export (ops.json) and its leaf modules never called in the
    forward pass (layers.json `uncalled`: they have no captured output)."""
    head = ["model", "exporter", "opset", "nodes", "parameters", "ONNX ops (count)", "uncalled modules"]
    rows = []
    for name, m in models.items():
        ops = m.get("ops") or {}
        opset = ", ".join(f"{k} {v}" for k, v in sorted((ops.get("opset") or {}).items()))
        rows.append([name, str(m.get("exporter") or "-"), opset or "-", fmt(ops.get("nodes")), fmt(ops.get("parameters")),
                     ", ".join(f"{k} {v}" for k, v in sorted((ops.get("ops") or {}).items(), key=lambda kv: (-kv[1], kv[0])))
                     or "-", ", ".join(m.get("uncalled") or []) or "none"])
    return head, rows


def environment_rows(env: dict, threads=None) -> list[tuple[str, str]]:
    """The machine first (CPU model, OS, CPUs and threads: host.json and cpu.json of the env stage),
    then every backend component's versions."""
    cpu, host = env.get("cpu") or {}, env.get("host") or {}
    rows = []
    if cpu.get("model_name"):
        ids = ", ".join(f"{k} {cpu[k]}" for k in ("vendor", "family", "model", "stepping") if cpu.get(k))
        rows.append(("CPU", f"{cpu['model_name']} ({ids}); ISA: {' '.join(cpu.get('isa') or []) or '-'}"
                            + (f"; masked by {cpu['env']}" if cpu.get("env") else "")))
    if host:
        rows.append(("OS", f"{host.get('os')} ({host.get('kernel')}), Python {host.get('python')}"))
        t = ("library default" if not threads else str(threads))
        rows.append(("threads", f"{host.get('cpus_logical')} logical CPUs, {host.get('cpus_usable')} usable; "
                                f"capture.threads = {threads if threads is not None else '-'} ({t})"
                                + "".join(f"; {k}={v}" for k, v in sorted((host.get("thread_env") or {}).items()))))
    rows += [(name, ", ".join(f"{k}={v}" for k, v in fp.items())) for name, fp in sorted(env.items())
             if name not in ("cpu", "host")]
    return rows


def _bytes(n) -> str:
    """1.23 GiB / 45.6 MiB / 789 KiB; '-' for none."""
    if n is None:
        return "-"
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= k:
            return f"{n / k:.{2 if unit == 'GiB' else 1}f} {unit}"
    return f"{n / 1024:.0f} KiB"


def memory_rows(peaks: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Each stage run's peak RSS (its timing file, parity.core.memory) beside the estimate it was checked
    against: W and SA as parity/core/memory.py's table uses them. '-': no timing file (an older run) or no
    estimate (a model the meta device cannot size)."""
    head = ["stage", "peak RSS", "estimate", "peak / estimate", "W (fp32 weights)", "SA (layer outputs)", "stage s"]
    rows = []
    for r in peaks:
        t = r.get("timing") or {}
        peak = t["peak_rss_kib"] * 1024 if t.get("peak_rss_kib") is not None else None
        est = t.get("estimate_bytes")
        rows.append([r["stage"], _bytes(peak), _bytes(est), f"{peak / est:.2f}" if peak and est else "-",
                     _bytes(t.get("w_bytes")), _bytes(t.get("sa_bytes")), fmt(t.get("stage_s"))])
    return head, rows


MEMORY_NOTE = ("Peak RSS: VmHWM of each stage process (ru_maxrss of its children), from its timing file. Estimate: "
               "a x W + b x SA + base (docs/resources.md), checked before the stage allocates; "
               "PARITY_MEMORY_CHECK=0 skips the check.")


def md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    esc = lambda x: str(x).replace("|", "\\|")  # noqa: E731
    return (["| " + " | ".join(esc(x) for x in head) + " |", "|" + "---|" * len(head)]
            + ["| " + " | ".join(esc(x) for x in r) + " |" for r in rows])


def coverage_markdown(coverage: dict) -> list[str]:
    lines = []
    for suite, cov in coverage.items():
        lines += [f"## Op coverage: suite `{suite}`", ""]
        if cov is None:
            lines += ["(no coverage file: run `dvc repro`)", ""]
            continue
        lines += ["| provider/dtype | " + " | ".join(cov["columns"]) + " |",
                  "|---|" + "---|" * len(cov["columns"]),
                  "| supported | " + " | ".join(f"{cov['support'][c]:.0%}" for c in cov["columns"]) + " |",
                  "| passing | " + " | ".join(f"{cov['pass_rate'][c]:.0%}" for c in cov["columns"]) + " |",
                  "| statuses | " + " | ".join(", ".join(f"{k} {v}" for k, v in sorted(cov["counts"][c].items()))
                                              for c in cov["columns"]) + " |"]
        g = cov.get("gradients") or {}
        if any(x.get("checked") for x in g.values()):
            lines.append("| gradient checks (ok/checked, worst tol_ratio) | " + " | ".join(
                (f"{g[c]['ok']}/{g[c]['checked']}, {g[c]['worst_tol_ratio']:.3g}" if g.get(c, {}).get("checked") else "-")
                for c in cov["columns"]) + " |")
        lines.append("")
    return lines


def markdown(title: str, summary: dict, cells: list[dict], env: dict, coverage: dict | None = None,
             models: dict | None = None, threads=None, peaks: list[dict] | None = None) -> str:
    lines = [f"# {title}", "",
             f"{summary['cells']} cells: **{summary['passed']} pass**, **{summary['failed']} fail**, "
             f"{summary['not_run']} not run (unavailable/unsupported/failed to export or infer)"
             f"{extra_totals(summary)}.", ""]
    lines += md_table(HEADER, cell_rows(cells)) + [""]
    for c in cells:
        m = c["metrics"]
        if settings_text(c.get("settings")):
            lines.append(f"- `{c['key']}` settings: {settings_text(c.get('settings'))}")
        if shapes_text(m):
            lines.append(f"- `{c['key']}` shapes: {shapes_text(m)}")
        if precision_text(m):
            lines.append(f"- `{c['key']}` precision: {precision_text(m)}")
        if metric(m, "baseline"):
            lines.append(f"- `{c['key']}` {verdict(c)}: {metric(m, 'baseline')}")
        if verdict(c) != Status.FAIL:
            if metric(m, "reason"):
                lines.append(f"- `{c['key']}` {verdict(c)}: {metric(m, 'reason')}")
            continue
        where = metric(m, "drift_origin_where") or metric(m, "drift_origin")
        lines += [f"## {c['key']}: FAIL ({metric(m, 'verdict_mode')}), drift starts at `{where}`", "",
                  tolerance_legend(c), ""]
        lines += md_table(*failing_rows(c)) + [""]
    lines.append("")
    for c in cells:
        if c["layers"]:
            lines += [f"<details><summary>{c['key']}: every layer ({verdict(c)})</summary>", "",
                      tolerance_legend(c), ""] + md_table(*layer_rows(c)) + ["", "</details>", ""]
    plans = [c for c in cells if c.get("plan")]
    if plans:
        lines += ["## Mixed-precision plans (keep these layers in float32)", ""]
        lines += [f"- `{c['key']}`: {c['plan'].get('summary', c['plan'].get('outcome'))}" for c in plans] + [""]
    lines += reduce_markdown(cells)
    if models:
        lines += ["## Models: op inventory", ""] + md_table(*model_rows(models)) + [""]
    lines += coverage_markdown(coverage or {})
    if peaks:
        lines += ["## Memory: peak RSS per stage", "", MEMORY_NOTE, ""] + md_table(*memory_rows(peaks)) + [""]
    lines += ["## Environment", ""]
    lines += [f"- **{name}**: {value}" for name, value in environment_rows(env, threads)]
    return "\n".join(lines) + "\n"


def curve_series(c: dict) -> tuple[list[tuple[str, str, list]], float, str]:
    """What a cell's curve plots: in oracle mode the accumulated excess (error vs fp64 over the
    trusted backend's) and each layer's own excess, against the limit k; in tolerance mode tol_ratio
    and max_abs against tol_ratio = 1."""
    layers = c["layers"]
    if metric(c["metrics"], "verdict_mode") == "oracle":
        own = {r["layer"]: r["excess"] for r in c.get("own") or [] if r["kind"] == "leaf"}
        # excess over k (dtypes.<d>.oracle.k, parity.pipeline.report.cell_entry): the one scale, 1 the limit
        series = [(f"{svg.RATIO} (accumulated)", "#0969da",
                   [per_limit(c, (d.get("oracle") or {}).get("excess")) for d in layers])]
        if own:
            series.append((f"own {svg.RATIO}", "#1a7f37", [per_limit(c, own.get(d["name"])) for d in layers]))
        return series, 1.0, f"limit: {svg.RATIO} = 1 (excess = k = {c['k']:g})"
    return ([(f"{svg.RATIO} (tol_ratio)", "#0969da", [d["tol_ratio"] for d in layers]),
             ("max_abs", "#8250df", [d["max_abs"] for d in layers])], 1.0, f"limit: {svg.RATIO} = 1 (atol/rtol)")


def origin_index(c: dict) -> int | None:
    """Index in c["layers"] of the drift origin (for ops between leaves: the leaf they feed)."""
    name = metric(c["metrics"], "drift_origin") or ""
    leaf = name.split(":", 1)[1] if name.startswith("between:") else name
    return next((i for i, d in enumerate(c["layers"]) if d["name"] == leaf), None)


def cell_curve(c: dict) -> svg.Curve:
    series, limit, label = curve_series(c)
    layers = c["layers"]
    failed = [not d["passed"] for d in layers]
    return svg.Curve(names=[d["name"] for d in layers],
                     series=[svg.Series(lab, col, vs, failed=failed if i == 0 else [])
                             for i, (lab, col, vs) in enumerate(series)],
                     limit=limit, limit_label=label, origin=origin_index(c),
                     origin_label=metric(c["metrics"], "drift_origin_where") or metric(c["metrics"], "drift_origin") or "",
                     tips=[f"rel_l2 vs fp32 {fmt(_num(d['rel_l2']))}, mismatched {mismatch(d)}"
                           + ("" if d["passed"] else " (fails)") for d in layers])


def svg_curve(c: dict) -> str:
    """Per-layer error on a log scale, layer names on x, the pass limit dashed, the drift origin
    marked, every point with a tooltip."""
    return svg.curve_svg(cell_curve(c)) if c["layers"] else ""


def hist_groups(c: dict) -> list[tuple[str, str, list[int]]]:
    """The layers whose element errors a failing cell's histogram shows: the drift origin, the layer
    furthest past its tolerance, and the model output (each once)."""
    layers = c["layers"]
    picks = []
    i = origin_index(c)
    if i is not None:
        picks.append(("drift origin", layers[i]))
    worst = max((d for d in layers if d.get("hist")), key=lambda d: _num(d["tol_ratio"]), default=None)
    if worst is not None:
        picks.append(("furthest past its atol/rtol", worst))
    out = next((d for d in layers if is_model_output(d["name"]) and not d["name"].startswith("plain:")), None)
    if out is not None:
        picks.append(("model output", out))
    seen, groups = set(), []
    for (role, d), colour in zip(picks, ("#9a6700", "#cf222e", "#0969da")):
        if d["name"] in seen or not d.get("hist"):
            continue
        seen.add(d["name"])
        groups.append((f"{d['name']} ({role})", colour, d["hist"]))
    return groups


def svg_histogram(c: dict) -> str:
    edges = c.get("hist_edges")
    return svg.histogram_svg(hist_groups(c), edges) if edges else ""


def matrix_html(cells: list[dict]) -> str:
    """Models as rows, provider x dtype as columns; each cell coloured by verdict, with its drift
    origin and latency ratio, linked to its section."""
    e = html.escape
    models = list(dict.fromkeys(c["model"] for c in cells))
    providers = list(dict.fromkeys(c["provider"] for c in cells))
    dtypes = list(dict.fromkeys(c["dtype"] for c in cells))
    by = {(c["model"], c["provider"], c["dtype"]): c for c in cells}
    h = ["<table id='matrix' class='matrix'><tr><th rowspan='2'>model</th>"]
    h += [f"<th colspan='{len(dtypes)}'>{e(p)}</th>" for p in providers]
    h.append("</tr><tr>" + "".join(f"<th>{e(d)}</th>" for _ in providers for d in dtypes) + "</tr>")
    for m in models:
        h.append(f"<tr><th>{e(m)}</th>")
        for p in providers:
            for d in dtypes:
                c = by.get((m, p, d))
                if c is None:
                    h.append("<td></td>")
                    continue
                met = c["metrics"]
                v = verdict(c)
                lines = [f"<b>{e(v)}</b>"]
                if metric(met, "drift_origin"):
                    lines.append(f"from <code>{e(metric(met, 'drift_origin'))}</code>")
                if c.get("latency_ratio"):
                    lines.append(f"{c['latency_ratio']:.2f}x latency")
                tip = metric(met, "reason") or (counts(met) if metric(met, "layers") is not None else v)
                h.append(f"<td class='m' data-verdict='{e(v)}' style='background:{VERDICT_COLOURS.get(v, '#6e7781')}' "
                         f"title='{e(c['key'])}: {e(str(tip))}'><a href='#{e(c['key'])}'>{'<br>'.join(lines)}</a></td>")
        h.append("</tr>")
    latency = ("Latency: median of the plain graph relative to torch_cpu fp32 of the same model. "
               if any(c.get("latency_ratio") for c in cells) else "")  # none measured: no caption about it
    h.append(f"</table><p><small>{latency}Hover a cell for the reason or the failing-layer count.</small></p>")
    return "".join(h)


def reduce_markdown(cells: list) -> list[str]:
    """The reduce stage's results (analysis.reduce): per reduced cell its nodes and a link to repro.py."""
    done = [c for c in cells if (c.get("reduce") or {}).get("status") == "REDUCED"]
    if not done:
        return []
    lines = ["## Reduced repros (a vendor can run these with numpy + onnxruntime only)", ""]
    for c in done:
        r = c["reduce"]
        lines.append(f"- `{c['key']}`: {len(r['nodes'])} of {r['graph_nodes']} nodes "
                     f"({', '.join(f'`{n}` {t}' for n, t in zip(r['nodes'], r['op_types']))}), worst output "
                     f"`{(r.get('worst') or {}).get('output')}` rel_l2 {(r.get('worst') or {}).get('rel_l2', 0):.2e}: "
                     f"[repro.py]({r['repro_link']})")
    return lines + [""]


def plan_html(plan: dict) -> str:
    """A cell's mixed-precision plan: the outcome, the keep-list, and the output error and latency
    of fp32, the full reduced model and the mixed one (plan.json, stages/plan.py)."""
    e = html.escape
    h = [f"<div class='plan'><h3>Mixed-precision plan</h3><p>{e(str(plan.get('summary') or plan.get('outcome')))}</p>"]
    if plan.get("keep"):
        h.append("<p>Keep in float32: " + ", ".join(f"<code>{e(str(k))}</code>" for k in plan["keep"])
                 + " <small>(keep.yaml beside plan.json says how to apply it)</small></p>")
    outs = plan.get("outputs") or {}
    rows = [(k, v) for k, v in outs.items() if isinstance(v, dict)]
    if rows:
        keys = sorted({kk for _, v in rows for kk in v if isinstance(v[kk], (int, float))})[:6]
        h.append("<table><tr><th>run</th>" + "".join(f"<th>{e(k)}</th>" for k in keys) + "</tr>")
        for k, v in rows:
            h.append(f"<tr><td>{e(k)}</td>" + "".join(f"<td>{fmt(v.get(kk))}</td>" for kk in keys) + "</tr>")
        h.append("</table>")
    lat = plan.get("latency_ratio") or {}
    if lat:
        h.append("<p>Latency: " + ", ".join(f"{e(k.replace('_', ' '))} {v:.2f}x" for k, v in lat.items()
                                            if isinstance(v, (int, float))) + "</p>")
    h.append("</div>")
    return "".join(h)


CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1f2328;max-width:1280px}
table{border-collapse:collapse;margin:8px 0 16px}td,th{border:1px solid #d0d7de;padding:3px 8px;text-align:left}
th{background:#f6f8fa}.v{color:#fff;font-weight:600;border-radius:3px;padding:1px 6px}
code{font-size:12px}section{margin:20px 0;border-top:1px solid #d0d7de}small{color:#59636e}
.matrix td.m{color:#fff;text-align:center;min-width:92px;font-size:12px}.matrix td.m a{color:#fff;text-decoration:none}
.matrix td.m code{color:#fff}table.layers td,table.failing td{font-size:12px;white-space:nowrap}
table.failing td.worst{background:#fff8c5}p.tol{color:#59636e}details{margin:6px 0 12px}
summary{cursor:pointer;color:#0969da}tr.fail td{background:#ffebe9}"""


def verdict_badge(v: str) -> str:
    return f"<span class='v' style='background:{VERDICT_COLOURS.get(v, '#6e7781')}'>{html.escape(v)}</span>"


def html_table(head: list[str], rows: list[list[str]], css: str, code_col: int = 1, mark=None) -> str:
    """A table of plain strings (escaped here); column `code_col` in <code>; `mark(row)` -> a row class.
    Columns named in WORST_HEAD are highlighted (the worst element)."""
    e = html.escape
    worst = {i for i, x in enumerate(head) if x in WORST_HEAD}
    h = [f"<table class='{css}'><tr>" + "".join(f"<th>{e(x)}</th>" for x in head) + "</tr>"]
    for r in rows:
        cls = mark(r) if mark else ""
        tds = [f"<td{' class=worst' if i in worst else ''}>{f'<code>{e(x)}</code>' if i == code_col else e(x)}</td>"
               for i, x in enumerate(r)]
        h.append(f"<tr{f' class={cls}' if cls else ''}>" + "".join(tds) + "</tr>")
    return "".join(h) + "</table>"


def counts(m: dict) -> str:
    """The layer and output counts of a cell's metrics (status.layer_counts), read through `metric`."""
    return layer_counts({k: metric(m, k) for k in ("layers", "layers_failed", "output", "plain_output")})


def verdict_prose(c: dict) -> str:
    """The cell's verdict line (HTML): the mode, the layer counts, its worst excess/limit, and the drift
    origin and worst layer only where there are some (a passing cell has neither: no "drift origin -")."""
    e, m = html.escape, c["metrics"]
    mode, why = metric(m, "verdict_mode") or "tolerance", metric(m, "verdict_mode_reason")
    parts = [f"Verdict by <b>{e(mode)}</b>{' (' + e(why) + ')' if why else ''}: {e(counts(m))}"]
    if results_ratio(m) is not None:
        parts.append(f"worst {svg.RATIO} {e(fmt(results_ratio(m)))} (1 is the limit)")
    origin = metric(m, "drift_origin_where") or metric(m, "drift_origin")
    if origin:
        cause = (metric(m, "drift_origin_cause") or {}).get("summary")
        parts.append(f"drift origin <code>{e(origin)}</code>{' (cause: ' + e(cause) + ')' if cause else ''}")
    if metric(m, "worst_layer"):
        parts.append(f"worst layer <code>{e(metric(m, 'worst_layer'))}</code>")
    return "; ".join(parts) + "."


def identical_text(c: dict) -> str:
    """A cell whose every layer equals the reference's bit for bit (a baseline cell: the reference's own
    backend). Its bits lost are measured against fp64, not the reference: said, so "bit-identical"
    beside "output bits lost 2.7" is no contradiction."""
    lost = (metric(c["metrics"], "output") or {}).get("bits_lost")
    return ("Bit-identical to the reference: every layer's max_abs against it is 0." + (
        f" The output bits lost ({fmt(lost, 2)}) are against fp64: this backend's own rounding at "
        f"{c['dtype']}, the yardstick the other cells are judged by." if lost is not None else ""))


def cell_html(c: dict) -> str:
    """One cell's section: verdict, tolerance legend, curve, histogram (failing), failing layers
    with mismatch counts and worst elements, every layer in a collapsible table, the plan."""
    e, m = html.escape, c["metrics"]
    h = [f"<section id='{e(c['key'])}' class='cell'><h2>{e(c['key'])} {verdict_badge(verdict(c))}</h2>"]
    if metric(m, "reason"):
        h.append(f"<p>{e(metric(m, 'reason'))}</p>")
    if settings_text(c.get("settings")):
        h.append(f"<p class='settings'>Settings: {e(settings_text(c.get('settings')))}</p>")
    if precision_text(m):
        h.append(f"<p class='precision'>Precision: {e(precision_text(m))}</p>")
    if metric(m, "baseline"):
        h.append(f"<p class='baseline'>Baseline: {e(metric(m, 'baseline'))}</p>")
    if shapes_text(m):
        h.append(f"<p class='shapes'>Shapes (each a sample set of this cell; the layers below are "
                 f"<code>{e(str(metric(m, 'shape')))}</code>'s): {e(shapes_text(m))}</p>")
    if c["layers"]:
        h.append(f"<p>{verdict_prose(c)} <small>Per-layer values come from the instrumented graph (every layer "
                 f"an output){'; latency from the plain graph' if c.get('latency_ratio') else ''}.</small></p>")
        h.append(f"<p class='tol'>{e(tolerance_legend(c))}</p>")
        if all(_num(d["max_abs"]) == 0.0 for d in c["layers"]):
            h.append(f"<p class='exact'>{e(identical_text(c))}</p>")
        else:
            h.append(svg_curve(c))
        head, rows = failing_rows(c)
        if verdict(c) == Status.FAIL:
            hist = svg_histogram(c)
            if hist:
                h.append("<h3>Element errors</h3>" + hist)
        if rows:
            h.append("<h3>Failing layers</h3>" + html_table(head, rows, "failing"))
        head, rows = layer_rows(c)
        h.append(f"<details class='layers'><summary>Every layer ({len(rows)})</summary>"
                 + html_table(head, rows, "layers", mark=lambda r: "fail" if r[3] != "pass" else "") + "</details>")
    if c.get("plan"):
        h.append(plan_html(c["plan"]))
    r = c.get("reduce") or {}
    if r.get("repro_link"):
        h.append(f"<p class='reduce'>Reduced repro: {len(r['nodes'])} node(s) ({e(', '.join(r['op_types']))}) "
                 f"<a href='{e(r['repro_link'])}'>repro.py</a> (reduce.json, reduced.onnx beside it)</p>")
    h.append("</section>")
    return "".join(h)


def html_page(title: str, summary: dict, cells: list[dict], env: dict, coverage: dict | None = None,
              models: dict | None = None, threads=None, peaks: list[dict] | None = None) -> str:
    e = html.escape
    h = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{CSS}</style></head><body>",
         f"<h1>{e(title)}</h1><p id='summary'>{summary['cells']} cells: <b>{summary['passed']} pass</b>, "
         f"<b>{summary['failed']} fail</b>, {summary['not_run']} not run{extra_totals(summary)}.</p>",
         matrix_html(cells),
         "<h2>Cells</h2><table id='cells'><tr>" + "".join(f"<th>{e(x)}</th>" for x in HEADER) + "</tr>"]
    for c, r in zip(cells, cell_rows(cells)):
        r = [e(x) for x in r]
        r[3] = verdict_badge(verdict(c))
        r[0] = f"<a href='#{e(c['key'])}'>{r[0]}</a>"
        h.append("<tr>" + "".join(f"<td>{x}</td>" for x in r) + "</tr>")
    h.append("</table>")
    h += [cell_html(c) for c in cells]
    if models:
        h.append("<section id='models'><h2>Models: op inventory</h2>" + html_table(*model_rows(models), "ops", code_col=-1)
                 + "<p><small>Uncalled modules are leaf modules never called in the forward pass: they have no "
                   "captured output.</small></p></section>")
    for suite, cov in (coverage or {}).items():
        h.append(f"<section id='coverage-{e(suite)}' class='coverage'><h2>Op coverage: suite {e(suite)}</h2>")
        if cov is None:
            h.append("<p>No coverage file: run <code>dvc repro</code>.</p>")
        else:
            h.append(render_coverage_html(cov))
        h.append("</section>")
    if peaks:
        h.append("<section id='memory'><h2>Memory: peak RSS per stage</h2>" + html_table(*memory_rows(peaks), "memory")
                 + f"<p><small>{e(MEMORY_NOTE)}</small></p></section>")
    h.append("<section id='environment'><h2>Environment</h2><table>")
    h += [f"<tr><th>{e(name)}</th><td>{e(value)}</td></tr>" for name, value in environment_rows(env, threads)]
    h.append("</table></section></body></html>\n")
    return "\n".join(h)
