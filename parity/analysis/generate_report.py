"""The report's generation-drift sections (generate@model-dtype-provider, parity/pipeline/generate.py):
per cell a line (verdict, top-1 agreement, first diverging and first failing step, drift origin), an
inline SVG of the logits' oracle excess over its limit (excess/limit, the report's one scale) and rel_l2 per decode step on a log scale with the limit, the
first divergence and first failure marked and a strip of top-1 agreement under it; the drift origin's
per-layer numbers. Markdown lines too, and the compact entries summary.json carries. Light (stdlib).

The cells are read from params (generate.models x dtypes x providers), never globbed; a missing file
shows as "not run". No generate cell: every function returns nothing, and the report is unchanged.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

from parity.config import params as config
from parity.config import schema
from parity.core import paths
from parity.core.svg import FAIL_COLOUR, ORIGIN_COLOUR, PASS_COLOUR, RATIO, num, short

DIVERGE_COLOUR = "#8250df"


def _decades(values: list, limit: float) -> tuple[int, int]:
    """The log10 axis range (whole decades) holding every finite positive value and the limit."""
    vals = [max(v, 1e-12) for v in values if v is not None and math.isfinite(v)] + [limit]
    lo, hi = math.floor(math.log10(min(vals))), math.ceil(math.log10(max(vals)))
    return lo, max(hi, lo + 1)


def load(p: dict, art: Path) -> dict:
    """{cell key: steps.json or None} for every generate cell in params (none: {})."""
    g = schema.of(p).generate
    out = {}
    for m in g.models:
        for d in g.dtypes:
            for pr in g.providers:
                key = config.cell_key(m, d, pr)
                f = art / Path(paths.GENERATE).name / key / "steps.json"
                out[key] = json.loads(f.read_text()) if f.exists() else None
    return out


def entry(c: dict | None) -> dict:
    """summary.json's compact entry of one cell."""
    if c is None:
        return {"verdict": "NOT_RUN"}
    e = {"verdict": c.get("verdict"), "agreement": c.get("agreement"), "steps": c.get("steps")}
    if c.get("first_fail") is not None:
        e["first_fail"] = c["first_fail"]
        e["origin"] = (c.get("origin") or {}).get("origin")
    return e


def line(key: str, c: dict | None) -> str:
    if c is None:
        return f"{key}: not run (dvc repro)"
    if c.get("status") != "OK":
        return f"{key}: {c.get('status')} ({c.get('reason')})"
    o = c.get("origin") or {}
    return (f"{key}: {c['verdict']}, top-1 agreement {c['agreement']}/{c['steps']} with fp64, first divergence "
            f"{_opt(c.get('first_divergence'))}, first failing step {_opt(c.get('first_fail'))}, worst logits {RATIO} "
            f"{short(_per_limit(c.get('worst_excess'), _limit(c)))} (1 is the limit: excess = k = {_limit(c):g})"
            + (f", drift origin {o.get('origin')} at step {o.get('step')}" if o else "")
            + (f" ({o['cause']})" if o.get("cause") else ""))


def _opt(v) -> str:
    return "none" if v is None else f"step {v}"


def _per_limit(excess, k: float):
    """An oracle excess on the report's one scale (RATIO: 1 is the limit)."""
    x = num(excess)
    return x / k if x is not None and k else None


def _limit(c: dict) -> float:
    rows = c.get("steps_detail") or []
    return float(rows[0]["limit"]) if rows else 4.0


def markdown(cells: dict) -> list[str]:
    if not cells:
        return []
    out = ["", "## Generation drift", ""]
    for key, c in cells.items():
        out.append(f"- {line(key, c)}")
    return out + [""]


def steps_svg(c: dict, width: int = 900, height: int = 260) -> str:
    """Excess and rel_l2 per step (log), the limit dashed, first divergence / failure marked, and a
    strip of top-1 agreement (green: agrees with fp64, red: differs) under the axis."""
    rows = c.get("steps_detail") or []
    if not rows:
        return ""
    k, limit = _limit(c), 1.0  # the excess over k: 1 is the limit, as on every other chart of the report
    ex, rel = [_per_limit(r["excess"], k) for r in rows], [num(r["rel_l2"]) for r in rows]
    lo, hi = _decades(ex + rel, limit)
    L, R, T, B = 56, 12, 22, 52
    slot = (width - L - R) / len(rows)  # one slot per step: its point at the middle, its agreement box below
    x = lambda i: L + slot * (i + 0.5)  # noqa: E731
    y = lambda v: T + (height - T - B) * (hi - math.log10(min(max(v, 1e-12), 10 ** hi))) / (hi - lo)  # noqa: E731
    e = html.escape
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" class="gen" role="img" '
           f'aria-label="logits error and top-1 agreement per decode step">',
           f'<rect x="{L}" y="{T}" width="{width - L - R}" height="{height - T - B}" fill="#fff" stroke="#d0d7de"/>']
    for k in range(lo, hi + 1):
        out.append(f'<line x1="{L}" x2="{width - R}" y1="{y(10 ** k):.1f}" y2="{y(10 ** k):.1f}" stroke="#eee"/>'
                   f'<text x="{L - 4}" y="{y(10 ** k) + 4:.1f}" font-size="10" text-anchor="end">1e{k}</text>')
    out.append(f'<line x1="{L}" x2="{width - R}" y1="{y(limit):.1f}" y2="{y(limit):.1f}" stroke="{FAIL_COLOUR}" '
               f'stroke-dasharray="4 3"/><text x="{width - R - 2}" y="{y(limit) - 3:.1f}" font-size="10" '
               f'text-anchor="end" fill="{FAIL_COLOUR}">limit: {RATIO} = 1 (excess = k = {k:g})</text>')
    for step, colour, label in ((c.get("first_divergence"), DIVERGE_COLOUR, "first divergence"),
                                (c.get("first_fail"), ORIGIN_COLOUR, "first failing step")):
        if step is not None:
            out.append(f'<line class="mark" x1="{x(step):.1f}" x2="{x(step):.1f}" y1="{T}" y2="{height - B}" '
                       f'stroke="{colour}"/><text x="{x(step) + 3:.1f}" y="{T + 11 + (12 if colour == ORIGIN_COLOUR else 0)}" '
                       f'font-size="10" fill="{colour}">{label}: step {step}</text>')
    for label, colour, vals in ((f"logits {RATIO}", "#0969da", ex), ("rel_l2 vs fp64", "#57606a", rel)):
        pts = [(i, v) for i, v in enumerate(vals) if v is not None and math.isfinite(v)]
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="'
                   + " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in pts) + f'"><title>{e(label)}</title></polyline>')
        for i, v in pts:
            bad = label == f"logits {RATIO}" and not rows[i]["passed"]
            out.append(f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="{2.6 if bad else 1.8}" '
                       f'fill="{FAIL_COLOUR if bad else colour}"><title>step {i}: {e(label)} {short(v)}</title></circle>')
    bw = max(1.0, slot - 1)
    for i, r in enumerate(rows):
        tip = f"step {i}: token {r['token']} vs fp64 {r['token_ref']} (fp64 top-1 margin {short(r['margin_ref'])})"
        out.append(f'<rect class="agree" x="{x(i) - bw / 2:.1f}" y="{height - B + 8}" width="{bw:.1f}" height="10" '
                   f'fill="{PASS_COLOUR if r["agree"] else FAIL_COLOUR}"><title>{e(tip)}</title></rect>')
    out.append(f'<text x="{L - 4}" y="{height - B + 17}" font-size="9" text-anchor="end">top-1</text>'
               f'<text x="{(L + width) / 2:.0f}" y="{height - 8}" font-size="10" text-anchor="middle">decode step '
               f'(0: the prompt\'s prefill; then one token each, with the KV cache)</text>'
               f'<text x="{L}" y="{T - 6}" font-size="10"><tspan fill="#0969da">logits {RATIO}</tspan> · '
               f'<tspan fill="#57606a">rel_l2 vs fp64</tspan> (log)</text></svg>')
    return "".join(out)


def _origin_table(o: dict, k: float) -> str:
    e = html.escape
    rows = "".join(f"<tr{'' if r['passed'] else ' class=fail'}><td>{e(r['name'])}</td><td>{short(_per_limit(r['excess'], k))}</td>"
                   f"<td>{short(r['err_rmse'])}</td><td>{short(r['floor_rmse'])}</td><td>{short(r['rel_l2'])}</td>"
                   f"<td>{'pass' if r['passed'] else 'FAIL'}</td></tr>" for r in o.get("layers") or [])
    if o.get("kind") == "cache":  # the search with the cache: the rows of the step where a value first fails
        t = o.get("cache_step")
        past = next((c["past_len"] for c in o.get("cache_steps") or [] if c["step"] == t), None)
        where = (f"with the KV cache at step {t} ({past} cached tokens; the steps after it read what it "
                 f"wrote), present key/value rows being the layer's cache")
    else:
        where = f"at step {o.get('step')} (full prefix of {o.get('prefix_len')} tokens, no cache)"
    return (f"<details open><summary>Per-layer oracle {e(where)}: drift origin <b>{e(str(o.get('origin')))}</b>"
            f"{'' if not o.get('cause') else ' - ' + e(o['cause'])}</summary><table class='cells'><tr>"
            f"<th>layer</th><th>{RATIO}</th><th>RMSE vs fp64</th><th>baseline RMSE</th><th>rel_l2</th><th></th></tr>"
            f"{rows}</table></details>")


def html_sections(cells: dict) -> str:
    if not cells:
        return ""
    e, h = html.escape, ["<section id='generate' class='generate'><h2>Generation drift</h2>"]
    for key, c in cells.items():
        h.append(f"<h3 id='generate-{e(key)}'>{e(key)}</h3><p>{e(line(key, c))}</p>")
        if c and c.get("status") == "OK":
            h.append(steps_svg(c))
            if c.get("origin"):
                h.append(_origin_table(c["origin"], _limit(c)))
    return "".join(h) + "</section>"
