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
           "CRASH": "#b71c1c", "TIMEOUT": "#6a1b9a", "UNAVAILABLE": "#f5f5f5", "UNSUPPORTED": "#fafafa", "SKIPPED": "#eeeeee",
           "NOT_RUN": "#ffffff"}
DARK = {"CRASH", "TIMEOUT"}
SHORT = {"OK": "OK", "MISMATCH": "MISM", "NAN_IN_OUTPUT": "NaN out", "NAN_IN_REFERENCE": "NaN ref",
         "INVALID": "inval", "EXPORT_FAIL": "export", "COMPILE_FAIL": "compile", "INFER_FAIL": "infer",
         "CRASH": "CRASH", "TIMEOUT": "TIME", "UNAVAILABLE": "n/a", "UNSUPPORTED": "unsup", "SKIPPED": "skip", "NOT_RUN": "-"}


def _fmt(x, spec=".2g") -> str:
    """A number as `spec`; parity.core.io.write_json stores non-finite numbers as "inf"/"-inf"/"nan" strings."""
    return "" if x is None else x if isinstance(x, str) else format(x, spec)


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


def case_anchor(suite: str, case: str) -> str:
    return "suite-" + "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in f"{suite}-case-{case}")


def _status_td(cell: dict, anchor: str | None, extra: str = "") -> str:
    st = cell["status"]
    tip = f"{st}: {cell.get('reason') or 'within tolerance'}"
    if cell.get("max_abs") is not None:
        tip += f" | max_abs {_fmt(cell['max_abs'], '.3g')}"
    ex = cell.get("exercised")  # ONNX cases at a reduced dtype: an op cell's label, a case's evidence
    if ex:
        tip += f" | precision: {ex.get('label') or ex.get('evidence')}"
    lat = cell.get("latency_ratio")
    fg = "#fff" if st in DARK else "#000"
    label = escape(SHORT.get(st, st)) + (f" <small>{escape(extra)}</small>" if extra else "")
    if anchor:
        label = f'<a href="#{anchor}" style="color:{fg}">{label}</a>'
    return (f'<td class="st" style="background:{COLOURS.get(st, "#fff")};color:{fg}" title="{escape(tip)}">{label}'
            + (f' <span class="lat">{_fmt(lat)}x</span>' if lat is not None else "") + "</td>")


NUMBERS = (("max_abs", ".3g"), ("rel_l2", ".3g"), ("tol_ratio", ".3g"), ("grad_tol_ratio", ".3g"),
           ("verdict", ""), ("excess", ".3g"), ("grad_excess", ".3g"), ("latency_ratio", ".2g"))


def case_details(coverage: dict) -> str:
    """Each case's numbers per provider/dtype (the matrix links here): status, max_abs, rel_l2,
    tol_ratio, grad tol_ratio, the tolerance's config key, latency ratio, reason and notes."""
    suite = str(coverage.get("suite", ""))
    out = ["<h4>Per-case numbers</h4>"]
    for r in coverage["rows"]:
        out.append(f"<details id='{case_anchor(suite, r['case'])}'><summary>{escape(r['case'])} "
                   f"<small>({escape(r['op'])})</small></summary><table><tr><th>cell</th><th>status</th>"
                   + "".join(f"<th>{k}</th>" for k, _ in NUMBERS) + "<th>tolerance</th><th>reason / note</th></tr>")
        for c, cell in r["cells"].items():
            why = " ".join(x for x in (cell.get("reason") or "", cell.get("note") or "",
                                       f"drawn: {cell['drawn']}" if cell.get("drawn") is not None else "",
                                       (cell.get("exercised") or {}).get("evidence", "")) if x)
            out.append(f"<tr><td>{escape(c)}</td><td>{escape(cell['status'])}</td>"
                       + "".join(f"<td>{_fmt(cell.get(k), f)}</td>" for k, f in NUMBERS)
                       + f"<td>{escape(str(cell.get('tol_source') or ''))}</td><td>{escape(why)}</td></tr>")
        out.append("</table></details>")
    return "\n".join(out)


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
           "hover a cell for the reason, click it for the case's numbers. Bold rows: one per op (worst status, cases OK / "
           "cases); below them a row per case. Small number: latency relative to the reference.</p>",
           '<p class="legend">' + "".join(
               f'<span style="background:{c};color:{"#fff" if s in DARK else "#000"}">{escape(s)}</span>'
               for s, c in COLOURS.items()) + "</p>",
           "<table><thead><tr><th>op</th><th>cases</th>"
           f"<th>ONNX ops (opset {escape(str(coverage.get('onnx_opset')))})</th>"
           + "".join(f"<th>{escape(c)}</th>" for c in cols) + "</tr></thead><tbody>"]
    ops = {o["op"]: o for o in coverage.get("ops") or []}
    seen_ops = set()
    for r in coverage["rows"]:
        if r["op"] not in seen_ops and r["op"] in ops:  # the op's header row: worst status over its cases
            seen_ops.add(r["op"])
            o = ops[r["op"]]
            out.append(f"<tr class='op'><th>{escape(r['op'])}</th><td>{o['cases']}</td><td>{escape(o['onnx'] or '')}</td>"
                       + "".join(_status_td(o["cells"].get(c, {"status": "NOT_RUN"}), None,
                                            f"{o['cells'].get(c, {}).get('n_ok', 0)}/{o['cases']}")
                                 for c in cols) + "</tr>")
        anchor = case_anchor(suite, r["case"])
        out.append(f"<tr class='case'><td>&nbsp;&nbsp;<a href='#{anchor}'>{escape(r['case'])}</a></td><td></td>"
                   f"<td>{escape(r['onnx'] or '')}</td>"
                   + "".join(_status_td(r["cells"].get(c, {"status": "NOT_RUN", "reason": ""}), anchor) for c in cols)
                   + "</tr>")
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
    out.append(case_details(coverage))
    sp = coverage.get("support_by_provider") or {}
    out.append("<p>Support per provider: " + escape(", ".join(
        f"{k} {v:.0%}" for k, v in sp.items() if v is not None)) + "</p></section>")
    return "\n".join(out) + "\n"
