"""Render the summary across cells: Markdown, and a self-contained HTML page (inline SVG, no
scripts, no network) with per-layer error curves on a log scale. Light: stdlib only."""

from __future__ import annotations

import html
import math

VERDICT_COLOURS = {"PASS": "#1a7f37", "FAIL": "#cf222e", "UNAVAILABLE": "#6e7781",
                   "UNSUPPORTED": "#6e7781", "EXPORT_FAIL": "#9a6700", "INFER_FAIL": "#9a6700", "COMPILE_FAIL": "#9a6700",
                   "MISSING": "#6e7781"}


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
        return float(v.replace("inf", "inf"))
    return float(v)


def cell_rows(cells: list[dict]) -> list[list[str]]:
    rows = []
    for c in cells:
        m, t = c["metrics"], c.get("timing") or {}
        out = m.get("output") or {}
        ratio = c.get("latency_ratio")
        rows.append([c["model"], c["dtype"], c["provider"], m.get("verdict", "MISSING"), m.get("verdict_mode") or "-",
                     f"{m.get('layers_failed', '-')}/{m.get('layers', '-')}" if m.get("layers") is not None else "-",
                     fmt(m.get("drift_origin_where") or m.get("drift_origin")), fmt(m.get("worst_layer")),
                     fmt(out.get("excess")), fmt(out.get("bits_lost"), 2),
                     fmt(out.get("max_abs")), fmt(out.get("rel_l2")), fmt(out.get("cosine"), 6),
                     fmt(t.get("median_ms")) + (f" ({ratio:.2f}x)" if ratio else "")])
    return rows


HEADER = ["model", "dtype", "provider", "verdict", "mode", "failed/layers", "drift_origin", "worst layer",
          "output excess", "output bits lost", "output max_abs", "output rel_l2", "output cosine",
          "latency ms (vs torch_cpu fp32)"]


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
    header and rows of plain strings: one builder for the Markdown and the HTML table."""
    layers = [d for d in c["layers"] if not d["passed"]]
    mods = c.get("modules") or {}
    if c["metrics"].get("verdict_mode") == "oracle":
        own = {r["name"]: r for r in c.get("own") or []}
        head = ["#", "layer", "module", "excess (accumulated)", "own excess", "bits lost", "rel_l2 vs fp32",
                "tol_ratio", "cause"]
        rows = [[str(d["order"]), d["name"], mods.get(d["name"], ""), fmt((d.get("oracle") or {}).get("excess")),
                 fmt((own.get(d["name"]) or {}).get("excess")), fmt((d.get("oracle") or {}).get("bits_lost"), 2),
                 fmt(d["rel_l2"]), fmt(d["tol_ratio"]), ""] for d in layers]
        listed = {d["name"] for d in layers}
        rows += [["", r["name"], "ops between leaves" if r["kind"] == "between" else mods.get(r["layer"], ""),
                  "", fmt(r["excess"]), fmt(r["bits_lost"], 2), "", "", ""]
                 for r in c.get("own") or [] if not r["passed"] and r["name"] not in listed]
        cause = c["metrics"].get("drift_origin_cause") or {}
        origin = c["metrics"].get("drift_origin")
        for r in rows:
            if r[1] == origin and cause:
                r[-1] = cause.get("summary") or cause.get("label", "")
            if r[1] in (c.get("layer_causes") or {}):
                r[-1] = c["layer_causes"][r[1]]["summary"]
        return head, rows
    head = ["#", "layer", "module", "max_abs", "max_rel", "rel_l2", "frac outside", "tol_ratio", "tolerance (key)"]
    rows = [[str(d["order"]), d["name"], mods.get(d["name"], ""), fmt(d["max_abs"]), fmt(d["max_rel"]),
             fmt(d["rel_l2"]), fmt(d["frac_outside"]), fmt(d["tol_ratio"]),
             f"atol={d['atol']:g} rtol={d['rtol']:g} {d['tol_source']}"] for d in layers]
    lc = c.get("layer_causes") or {}
    if lc:  # causes the cell's settings explain (int8 saturation)
        head, rows = head + ["cause"], [r + [(lc.get(r[1]) or {}).get("summary", "")] for r in rows]
    return head, rows


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


def markdown(title: str, summary: dict, cells: list[dict], env: dict, coverage: dict | None = None) -> str:
    lines = [f"# {title}", "",
             f"{summary['cells']} cells: **{summary['passed']} pass**, **{summary['failed']} fail**, "
             f"{summary['not_run']} not run (unavailable/unsupported/failed to export or infer).", ""]
    lines += ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in cell_rows(cells):
        lines.append("| " + " | ".join(x.replace("|", "\\|") for x in r) + " |")
    lines.append("")
    for c in cells:
        m = c["metrics"]
        if settings_text(c.get("settings")):
            lines.append(f"- `{c['key']}` settings: {settings_text(c.get('settings'))}")
        if m.get("verdict") != "FAIL":
            if m.get("reason"):
                lines.append(f"- `{c['key']}` {m['verdict']}: {m['reason']}")
            continue
        where = m.get("drift_origin_where") or m.get("drift_origin")
        lines.append(f"## {c['key']}: FAIL ({m.get('verdict_mode')}), drift starts at `{where}`")
        lines.append("")
        head, rows = failing_rows(c)
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for r in rows:
            lines.append("| " + " | ".join(x.replace("|", "\\|") for x in r) + " |")
        lines.append("")
    plans = [c for c in cells if c.get("plan")]
    if plans:
        lines += ["## Mixed-precision plans (keep these layers in float32)", ""]
        lines += [f"- `{c['key']}`: {c['plan'].get('summary', c['plan'].get('outcome'))}" for c in plans] + [""]
    lines += coverage_markdown(coverage or {})
    lines += ["## Environment", ""]
    for name, fp in sorted(env.items()):
        lines.append(f"- **{name}**: " + ", ".join(f"{k}={v}" for k, v in fp.items()))
    return "\n".join(lines) + "\n"


def curve_series(c: dict) -> tuple[list[tuple[str, str, list]], float, str]:
    """What a cell's curve plots: in oracle mode the accumulated excess (error vs fp64 over the
    trusted backend's) and each layer's own excess, against the limit k; in tolerance mode tol_ratio
    and max_abs against tol_ratio = 1."""
    layers = c["layers"]
    if c["metrics"].get("verdict_mode") == "oracle":
        own = {r["layer"]: r["excess"] for r in c.get("own") or [] if r["kind"] == "leaf"}
        k = c.get("k") or 4.0
        series = [("accumulated excess", "#0969da", [(d.get("oracle") or {}).get("excess") for d in layers])]
        if own:
            series.append(("own excess", "#1a7f37", [own.get(d["name"]) for d in layers]))
        return series, k, f"limit k = {k:g}"
    return ([("tol_ratio", "#0969da", [d["tol_ratio"] for d in layers]),
             ("max_abs", "#8250df", [d["max_abs"] for d in layers])], 1.0, "tolerance (tol_ratio = 1)")


def svg_curve(c: dict, width: int = 760, height: int = 220) -> str:
    """Per-layer error on a log scale, execution order on x, the pass limit dashed, the drift
    origin marked, every point with a tooltip."""
    layers = c["layers"]
    if not layers:
        return ""
    series, limit, limit_label = curve_series(c)
    floor = 1e-12
    ok = lambda v: v is not None and math.isfinite(_num(v))  # noqa: E731
    vals = [max(floor, _num(v)) for _, _, vs in series for v in vs if ok(v)] + [limit]
    lo = math.floor(math.log10(min(vals)))
    hi = max(math.ceil(math.log10(max(vals))) + (1 if max(vals) >= 10 ** math.ceil(math.log10(max(vals))) else 0), lo + 1)
    L, R, T, B = 56, 12, 12, 28
    n = max(1, len(layers) - 1)
    x = lambda i: L + (width - L - R) * i / n  # noqa: E731
    y = lambda v: T + (height - T - B) * (hi - math.log10(min(max(v, floor), 10 ** hi))) / (hi - lo)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" class="curve" '
           f'role="img" aria-label="per-layer error, log scale">',
           f'<rect x="{L}" y="{T}" width="{width - L - R}" height="{height - T - B}" fill="#fff" stroke="#d0d7de"/>']
    for e in range(lo, hi + 1):
        yy = y(10 ** e)
        out.append(f'<line x1="{L}" x2="{width - R}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eee"/>'
                   f'<text x="{L - 4}" y="{yy + 4:.1f}" font-size="10" text-anchor="end">1e{e}</text>')
    y1 = y(limit)
    out.append(f'<line x1="{L}" x2="{width - R}" y1="{y1:.1f}" y2="{y1:.1f}" stroke="#cf222e" '
               f'stroke-dasharray="4 3"/><text x="{width - R - 2}" y="{y1 - 3:.1f}" font-size="10" '
               f'text-anchor="end" fill="#cf222e">{html.escape(limit_label)}</text>')
    for label, colour, vs in series:
        path = " ".join(f"{x(i):.1f},{y(max(floor, _num(v)) if ok(v) else 10 ** hi):.1f}"
                        for i, v in enumerate(vs) if v is not None)
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{path}"><title>'
                   f'{html.escape(label)}</title></polyline>')
    first = series[0][2]
    for i, d in enumerate(layers):
        v = first[i]
        if v is None:
            continue
        tip = (f'{html.escape(d["name"])}: ' + ", ".join(f"{lab} {fmt(vs[i])}" for lab, _, vs in series)
               + f', rel_l2 vs fp32 {fmt(_num(d["rel_l2"]))}{"" if d["passed"] else " (fails)"}')
        out.append(f'<circle cx="{x(i):.1f}" cy="{y(_num(v) if ok(v) else 10 ** hi):.1f}" '
                   f'r="{2.5 if not d["passed"] else 1.8}" fill="{"#cf222e" if not d["passed"] else series[0][1]}">'
                   f'<title>{tip}</title></circle>')
    origin_name = c["metrics"].get("drift_origin") or ""
    origin_layer = origin_name.split(":", 1)[1] if origin_name.startswith("between:") else origin_name
    origin = next((i for i, d in enumerate(layers) if d["name"] == origin_layer), None)
    if origin is not None:
        where = c["metrics"].get("drift_origin_where") or origin_name
        out.append(f'<line x1="{x(origin):.1f}" x2="{x(origin):.1f}" y1="{T}" y2="{height - B}" stroke="#9a6700"/>'
                   f'<text x="{x(origin) + 3:.1f}" y="{T + 11}" font-size="10" fill="#9a6700">drift origin: '
                   f'{html.escape(where)}</text>')
    legend = "  ".join(f'<tspan fill="{col}">{html.escape(lab)}</tspan>' for lab, col, _ in series)
    out.append(f'<text x="{L}" y="{height - 8}" font-size="10">{html.escape(layers[0]["name"])}</text>'
               f'<text x="{width - R}" y="{height - 8}" font-size="10" text-anchor="end">'
               f'{html.escape(layers[-1]["name"])}</text>'
               f'<text x="{(L + width) / 2:.0f}" y="{height - 8}" font-size="10" text-anchor="middle">'
               f'{legend} (execution order)</text></svg>')
    return "".join(out)


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
                v = met.get("verdict", "MISSING")
                lines = [f"<b>{e(v)}</b>"]
                if met.get("drift_origin"):
                    lines.append(f"from <code>{e(met['drift_origin'])}</code>")
                if c.get("latency_ratio"):
                    lines.append(f"{c['latency_ratio']:.2f}x latency")
                tip = met.get("reason") or (f"{met.get('layers_failed')}/{met.get('layers')} layers over tolerance"
                                            if met.get("layers") is not None else v)
                h.append(f"<td class='m' data-verdict='{e(v)}' style='background:{VERDICT_COLOURS.get(v, '#6e7781')}' "
                         f"title='{e(c['key'])}: {e(str(tip))}'><a href='#{e(c['key'])}'>{'<br>'.join(lines)}</a></td>")
        h.append("</tr>")
    h.append("</table><p><small>Latency: median of the plain graph relative to torch_cpu fp32 of the same "
             "model. Hover a cell for the reason or the failing-layer count.</small></p>")
    return "".join(h)


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


CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1f2328;max-width:1200px}
table{border-collapse:collapse;margin:8px 0 16px}td,th{border:1px solid #d0d7de;padding:3px 8px;text-align:left}
th{background:#f6f8fa}.v{color:#fff;font-weight:600;border-radius:3px;padding:1px 6px}
code{font-size:12px}section{margin:20px 0;border-top:1px solid #d0d7de}small{color:#59636e}
.matrix td.m{color:#fff;text-align:center;min-width:92px;font-size:12px}.matrix td.m a{color:#fff;text-decoration:none}
.matrix td.m code{color:#fff}"""


def html_page(title: str, summary: dict, cells: list[dict], env: dict, coverage: dict | None = None) -> str:
    e = html.escape
    h = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{CSS}</style></head><body>",
         f"<h1>{e(title)}</h1><p id='summary'>{summary['cells']} cells: <b>{summary['passed']} pass</b>, "
         f"<b>{summary['failed']} fail</b>, {summary['not_run']} not run.</p>",
         matrix_html(cells),
         "<h2>Cells</h2><table id='cells'><tr>" + "".join(f"<th>{e(x)}</th>" for x in HEADER) + "</tr>"]
    for c, r in zip(cells, cell_rows(cells)):
        v = r[3]
        r = [e(x) for x in r]
        r[3] = f"<span class='v' style='background:{VERDICT_COLOURS.get(v, '#6e7781')}'>{e(v)}</span>"
        r[0] = f"<a href='#{e(c['key'])}'>{r[0]}</a>"
        h.append("<tr>" + "".join(f"<td>{x}</td>" for x in r) + "</tr>")
    h.append("</table>")
    for c in cells:
        m = c["metrics"]
        h.append(f"<section id='{e(c['key'])}'><h2>{e(c['key'])} "
                 f"<span class='v' style='background:{VERDICT_COLOURS.get(m.get('verdict'), '#6e7781')}'>"
                 f"{e(m.get('verdict', 'MISSING'))}</span></h2>")
        if m.get("reason"):
            h.append(f"<p>{e(m['reason'])}</p>")
        if settings_text(c.get("settings")):
            h.append(f"<p class='settings'>Settings: {e(settings_text(c.get('settings')))}</p>")
        if c["layers"]:
            mode = m.get("verdict_mode") or "tolerance"
            h.append(f"<p>Verdict by <b>{e(mode)}</b>{' (' + e(m['verdict_mode_reason']) + ')' if m.get('verdict_mode_reason') else ''}: "
                     f"{m.get('layers')} layers compared; {m.get('layers_failed')} failing; drift origin "
                     f"<code>{e(fmt(m.get('drift_origin_where') or m.get('drift_origin')))}</code>"
                     f"{' (cause: ' + e((m.get('drift_origin_cause') or {}).get('summary', '')) + ')' if m.get('drift_origin_cause') else ''}; "
                     f"worst <code>{e(fmt(m.get('worst_layer')))}</code>."
                     f" <small>Per-layer values come from the instrumented graph (every layer an output); "
                     f"latency from the plain graph.</small></p>")
            if all(_num(d["max_abs"]) == 0.0 for d in c["layers"]):
                h.append("<p class='exact'>Bit-identical: every layer matches the reference exactly.</p>")
            else:
                h.append(svg_curve(c))
            head, rows = failing_rows(c)
            if rows:
                h.append("<table class='failing'><tr>" + "".join(f"<th>{e(x)}</th>" for x in head) + "</tr>")
                for r in rows:
                    r = [e(x) for x in r]
                    r[1] = f"<code>{r[1]}</code>"
                    h.append("<tr>" + "".join(f"<td>{x}</td>" for x in r) + "</tr>")
                h.append("</table>")
        if c.get("plan"):
            h.append(plan_html(c["plan"]))
        h.append("</section>")
    for suite, cov in (coverage or {}).items():
        h.append(f"<section id='coverage-{e(suite)}' class='coverage'><h2>Op coverage: suite {e(suite)}</h2>")
        if cov is None:
            h.append("<p>No coverage file: run <code>dvc repro</code>.</p>")
        else:
            from parity.suites.render import render_coverage_html

            h.append(render_coverage_html(cov))
        h.append("</section>")
    h.append("<section><h2>Environment</h2><table>")
    for name, fp in sorted(env.items()):
        h.append(f"<tr><th>{e(name)}</th><td>{e(', '.join(f'{k}={v}' for k, v in fp.items()))}</td></tr>")
    h.append("</table></section></body></html>\n")
    return "\n".join(h)
