"""HTML fragment of a suite's coverage matrix. Light: stdlib only (no numpy, no torch).

    from parity.suites.render import render_coverage_html
    html = render_coverage_html(json.load(open("artifacts/suites/coverage/critical.json")))

Self-contained (inline CSS, no scripts, no external loads): ops as rows, provider/dtype as
columns, cells coloured by status with the reason in a `title=` tooltip; per column a status count,
support rate and a histogram of max_abs buckets (inline SVG); latency per op relative to the
reference (torch_cpu fp32 eager, measured in the same worker call).
"""

from __future__ import annotations

from html import escape

COLOURS = {"OK": "#c8e6c9", "MISMATCH": "#ffcc80", "NAN_IN_OUTPUT": "#ffab91", "NAN_IN_REFERENCE": "#e1bee7",
           "INVALID": "#e0e0e0", "EXPORT_FAIL": "#ef9a9a", "COMPILE_FAIL": "#ef9a9a", "INFER_FAIL": "#e57373",
           "CRASH": "#b71c1c", "TIMEOUT": "#6a1b9a", "UNAVAILABLE": "#f5f5f5", "UNSUPPORTED": "#fafafa",
           "NOT_RUN": "#ffffff"}
DARK = {"CRASH", "TIMEOUT"}
SHORT = {"OK": "OK", "MISMATCH": "MISM", "NAN_IN_OUTPUT": "NaN out", "NAN_IN_REFERENCE": "NaN ref",
         "INVALID": "inval", "EXPORT_FAIL": "export", "COMPILE_FAIL": "compile", "INFER_FAIL": "infer",
         "CRASH": "CRASH", "TIMEOUT": "TIME", "UNAVAILABLE": "n/a", "UNSUPPORTED": "unsup", "NOT_RUN": "-"}


def _fmt(x, spec=".2g") -> str:
    return "" if x is None else format(x, spec)


def _hist_svg(h: dict, buckets: list[str]) -> str:
    total = max(1, max(h.values(), default=0))
    w, bh = 14, 30
    bars = []
    for i, b in enumerate(buckets):
        n = h.get(b, 0)
        y = bh * n / total
        bars.append(f'<rect x="{i * w}" y="{bh - y:.1f}" width="{w - 2}" height="{y:.1f}" fill="#5c6bc0">'
                    f'<title>max_abs {escape(b)}: {n} cases</title></rect>')
    return (f'<svg width="{w * len(buckets)}" height="{bh}" role="img" aria-label="max_abs histogram">'
            + "".join(bars) + "</svg>")


def render_coverage_html(coverage: dict) -> str:
    """One <section> for one suite's coverage dict (stages/suite_coverage.py's <suite>.json)."""
    cols = coverage["columns"]
    suite = escape(str(coverage.get("suite", "")))
    out = [f'<section class="suite-coverage" id="suite-{suite}">',
           "<style>.suite-coverage table{border-collapse:collapse;font:12px sans-serif}"
           ".suite-coverage td,.suite-coverage th{border:1px solid #ddd;padding:2px 5px;white-space:nowrap}"
           ".suite-coverage td.st{text-align:center}.suite-coverage .lat{color:#555;font-size:10px}"
           ".suite-coverage .legend span{display:inline-block;padding:1px 5px;margin:1px;border:1px solid #ccc}</style>",
           f"<h3>Suite coverage: {suite}</h3>",
           f"<p>Reference: {escape(str(coverage.get('reference', '')))}. Cell = worst status over the op's cases; "
           "hover a cell for the reason. Small number: latency relative to the reference.</p>",
           '<p class="legend">' + "".join(
               f'<span style="background:{c};color:{"#fff" if s in DARK else "#000"}">{escape(s)}</span>'
               for s, c in COLOURS.items()) + "</p>",
           "<table><thead><tr><th>op</th><th>cases</th>"
           f"<th>ONNX ops (opset {escape(str(coverage.get('onnx_opset')))})</th>"
           + "".join(f"<th>{escape(c)}</th>" for c in cols) + "</tr></thead><tbody>"]
    for r in coverage["rows"]:
        tds = []
        for c in cols:
            cell = r["cells"].get(c, {"status": "NOT_RUN", "reason": ""})
            st = cell["status"]
            tip = f"{st}: {cell.get('reason') or 'within tolerance'}"
            if cell.get("max_abs") is not None:
                tip += f" | max_abs {cell['max_abs']:.3g}"
            lat = cell.get("latency_ratio")
            fg = "#fff" if st in DARK else "#000"
            tds.append(f'<td class="st" style="background:{COLOURS.get(st, "#fff")};color:{fg}" title="{escape(tip)}">'
                       f"{escape(SHORT.get(st, st))}"
                       + (f' <span class="lat">{lat:.2g}x</span>' if lat is not None else "") + "</td>")
        out.append(f"<tr><td>{escape(r['op'])}</td><td>{r['cases']}</td><td>{escape(r['onnx'] or '')}</td>"
                   + "".join(tds) + "</tr>")
    out.append("</tbody><tfoot>")
    out.append("<tr><th>support rate</th><td></td><td></td>" + "".join(
        f"<td>{_fmt(coverage['support'].get(c), '.0%')}</td>" for c in cols) + "</tr>")
    out.append("<tr><th>pass rate</th><td></td><td></td>" + "".join(
        f"<td>{_fmt(coverage['pass_rate'].get(c), '.0%')}</td>" for c in cols) + "</tr>")
    out.append("<tr><th>status counts</th><td></td><td></td>" + "".join(
        "<td>" + "<br>".join(f"{escape(s)} {n}" for s, n in coverage["counts"].get(c, {}).items()) + "</td>"
        for c in cols) + "</tr>")
    grads = coverage.get("gradients") or {}
    if any(g.get("checked") for g in grads.values()):
        out.append("<tr class='grads'><th>gradient checks<br><small>passing / checked; worst grad tol_ratio</small></th>"
                   "<td></td><td></td>" + "".join(
                       "<td>" + (f"{g['ok']}/{g['checked']}<br>{_fmt(g['worst_tol_ratio'], '.3g')} "
                                 f"({escape(str(g['worst_case']))})" if g.get("checked") else "-") + "</td>"
                       for g in (grads.get(c, {}) for c in cols)) + "</tr>")
    out.append("<tr><th>max_abs histogram<br><small>" + escape(" | ".join(coverage["buckets"])) + "</small></th>"
               "<td></td><td></td>" + "".join(
                   f"<td>{_hist_svg(coverage['histogram'].get(c, {}), coverage['buckets'])}</td>" for c in cols)
               + "</tr></tfoot></table>")
    sp = coverage.get("support_by_provider") or {}
    out.append("<p>Support per provider: " + escape(", ".join(
        f"{k} {v:.0%}" for k, v in sp.items() if v is not None)) + "</p></section>")
    return "\n".join(out) + "\n"
