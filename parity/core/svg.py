"""Inline SVG charts for the report and the compare page: per-layer curves on a log scale (layer
names on the x-axis, the pass limit dashed, the drift origin marked, a tooltip on every point) and
element-error histograms. Static markup only: no scripts, no fonts, nothing fetched. Stdlib only."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

FLOOR = 1e-12  # zeros are drawn on the floor of a log axis
LABEL_PITCH = 11  # px between two vertical layer names at font-size 9: closer, they overlap
LABEL_CHARS = 26  # a longer layer name shows its last characters (the whole name in its tooltip)
# the one name and scale of a verdict number wherever one is shown (report, compare page, summary.json's
# `worst`, the diff stage's log, layers.csv's `ratio`): the error over what the verdict allows, 1 the limit
# (oracle: excess / k; tolerance: tol_ratio, |a - b| / (atol + rtol |b|))
RATIO = "excess/limit"
PASS_COLOUR, FAIL_COLOUR, ORIGIN_COLOUR = "#1a7f37", "#cf222e", "#9a6700"


def num(v) -> float | None:
    """A plotted value: layers.json keeps inf/nan as strings ("inf"); None stays None."""
    if v is None or v == "":
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def short(v) -> str:
    x = num(v)
    if x is None:
        return "-"
    if not math.isfinite(x):
        return str(x)
    return f"{x:.3e}" if x and (abs(x) < 1e-2 or abs(x) >= 1e4) else f"{x:.3g}"


@dataclass
class Series:
    label: str
    colour: str
    values: list  # one per layer, None where the layer has no value
    dash: str = ""  # stroke-dasharray: a second revision is drawn dashed
    failed: list = field(default_factory=list)  # per layer: True marks the point red


@dataclass
class Curve:
    names: list[str]  # layer names, execution order
    series: list[Series]
    limit: float
    limit_label: str
    origin: int | None = None  # index of the drift origin in `names`
    origin_label: str = ""
    tips: list[str] = field(default_factory=list)  # per layer, extra tooltip text


def _log_range(values: list[float], limit: float) -> tuple[int, int]:
    vals = [max(FLOOR, v) for v in values if v is not None and math.isfinite(v)] + [limit]
    lo = math.floor(math.log10(min(vals)))
    top = max(vals)
    hi = math.ceil(math.log10(top)) + (1 if top >= 10 ** math.ceil(math.log10(top)) else 0)
    return lo, max(hi, lo + 1)


def label_step(n: int, span: float) -> int:
    """Name every `step`-th of `n` layers on an axis `span` px wide: 1 (every name) while the vertical
    labels are LABEL_PITCH px apart or more, else the least step that keeps them so."""
    gap = span / max(1, n - 1)
    return 1 if gap >= LABEL_PITCH else math.ceil(LABEL_PITCH / gap)


def _xlabels(names: list[str], x, base: float, origin: int | None, step: int) -> list[str]:
    """Every `step`-th layer name (step 1: every name), the last and the drift origin too, vertical under
    the axis; a name closer than LABEL_PITCH px to the drift origin's or the last one's is left out, so
    no two labels overlap. A name over LABEL_CHARS characters keeps its end (the full name in a tooltip)."""
    n = len(names)
    fixed = {n - 1} | ({origin} if origin is not None else set())
    keep = {i for i in range(0, n, step) if all(i == j or abs(x(i) - x(j)) >= LABEL_PITCH for j in fixed)}
    out = []
    for i in sorted(keep | fixed):
        name = names[i]
        text = name if len(name) <= LABEL_CHARS else "…" + name[-(LABEL_CHARS - 1):]
        colour = ORIGIN_COLOUR if i == origin else "#1f2328"
        out.append(f'<text class="xl" x="{x(i) + 3:.1f}" y="{base:.1f}" font-size="9" fill="{colour}" text-anchor="end" '
                   f'transform="rotate(-90 {x(i) + 3:.1f} {base:.1f})">'
                   f'{f"<title>{html.escape(name)}</title>" if text != name else ""}{html.escape(text)}</text>')
    return out


def curve_svg(cv: Curve, width: int = 900, height: int = 360, css: str = "curve") -> str:
    """Per-layer values of every series on one log-scale chart, execution order on x; under the axis every
    layer's name, or every n-th (label_step) with that rule written beside the axis."""
    if not cv.names:
        return ""
    lo, hi = _log_range([num(v) for s in cv.series for v in s.values], cv.limit)
    L, R, T, B = 56, 12, 22, 158
    n = max(1, len(cv.names) - 1)
    x = lambda i: L + (width - L - R) * i / n  # noqa: E731
    y = lambda v: T + (height - T - B) * (hi - math.log10(min(max(v, FLOOR), 10 ** hi))) / (hi - lo)  # noqa: E731
    pt = lambda v: y(v if math.isfinite(v) else 10 ** hi)  # noqa: E731  (inf at the top)
    e = html.escape
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" class="{css}" role="img" '
           f'aria-label="per-layer error, log scale">',
           f'<rect x="{L}" y="{T}" width="{width - L - R}" height="{height - T - B}" fill="#fff" stroke="#d0d7de"/>']
    for k in range(lo, hi + 1):
        yy = y(10 ** k)
        out.append(f'<line x1="{L}" x2="{width - R}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eee"/>'
                   f'<text x="{L - 4}" y="{yy + 4:.1f}" font-size="10" text-anchor="end">1e{k}</text>')
    y1 = y(cv.limit)
    out.append(f'<line x1="{L}" x2="{width - R}" y1="{y1:.1f}" y2="{y1:.1f}" stroke="{FAIL_COLOUR}" stroke-dasharray="4 3"/>'
               f'<text x="{width - R - 2}" y="{y1 - 3:.1f}" font-size="10" text-anchor="end" fill="{FAIL_COLOUR}">'
               f'{e(cv.limit_label)}</text>')
    if cv.origin is not None:
        xo = x(cv.origin)
        out.append(f'<line class="origin" x1="{xo:.1f}" x2="{xo:.1f}" y1="{T}" y2="{height - B}" stroke="{ORIGIN_COLOUR}"/>'
                   f'<text x="{xo + 3:.1f}" y="{T + 11}" font-size="10" fill="{ORIGIN_COLOUR}">drift origin: '
                   f'{e(cv.origin_label)}</text>')
    for s in cv.series:
        pts = [(i, num(v)) for i, v in enumerate(s.values) if num(v) is not None]
        path = " ".join(f"{x(i):.1f},{pt(v):.1f}" for i, v in pts)
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        out.append(f'<polyline fill="none" stroke="{s.colour}" stroke-width="1.5"{dash} points="{path}">'
                   f'<title>{e(s.label)}</title></polyline>')
        for i, v in pts:
            bad = bool(s.failed and s.failed[i])
            tip = f"{cv.names[i]}: {s.label} {short(v)}" + (f", {cv.tips[i]}" if cv.tips and cv.tips[i] else "")
            out.append(f'<circle cx="{x(i):.1f}" cy="{pt(v):.1f}" r="{2.6 if bad else 1.8}" '
                       f'fill="{FAIL_COLOUR if bad else s.colour}"><title>{e(tip)}</title></circle>')
    step = label_step(len(cv.names), width - L - R)
    out += _xlabels(cv.names, x, height - B + 6, cv.origin, step)
    legend, lx = [], L
    for s in cv.series:
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        legend.append(f'<line x1="{lx}" x2="{lx + 18}" y1="{T - 9}" y2="{T - 9}" stroke="{s.colour}" stroke-width="2"{dash}/>'
                      f'<text class="legend" x="{lx + 22}" y="{T - 5}" font-size="10">{e(s.label)}</text>')
        lx += 30 + 6 * len(s.label)
    out += legend
    nth = f"{step}{ {2: 'nd', 3: 'rd'}.get(step, 'th')}"
    rule = "every layer named" if step == 1 else (f"every {nth} of {len(cv.names)} layers named (and the last, "
                                                  f"the drift origin); hover a point for any layer")
    out.append(f'<text x="{width - R}" y="{T - 5}" font-size="10" text-anchor="end" fill="#59636e">'
               f'layers in execution order →</text><text class="xrule" x="{L}" y="{height - 4}" font-size="10" '
               f'fill="#59636e">{e(rule)}</text></svg>')
    return "".join(out)


def hist_labels(edges) -> list[str]:
    """Bin labels for counts per decade of |a - b| / allowed (parity.core.compare.HIST_EDGES)."""
    return [f"≤{edges[0]:g}"] + [f"≤{b:g}" for b in edges[1:]] + [f">{edges[-1]:g}"]


def histogram_svg(groups: list[tuple[str, str, list[int]]], edges, width: int = 900, height: int = 200) -> str:
    """Grouped bars: per group (label, colour, counts), elements per decade of |a - b| / allowed on a
    log count axis; the bins past the tolerance (ratio > 1) on a red background."""
    groups = [g for g in groups if g[2] and sum(g[2])]
    if not groups:
        return ""
    nb = len(groups[0][2])
    labels = hist_labels(edges)
    L, R, T, B = 56, 12, 22, 34
    top = max(max(c) for _, _, c in groups)
    ly = math.log10(1 + top) or 1.0
    bw = (width - L - R) / nb
    e = html.escape
    h = lambda c: (height - T - B) * math.log10(1 + c) / ly  # noqa: E731
    first_out = next(i for i, lab in enumerate(labels) if lab in ("≤10", ">1"))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" class="hist" role="img" '
           f'aria-label="element error histogram">',
           f'<rect x="{L + bw * first_out:.1f}" y="{T}" width="{bw * (nb - first_out):.1f}" height="{height - T - B}" '
           f'fill="#ffebe9"/>',
           f'<text x="{width - R}" y="{T - 5}" font-size="10" text-anchor="end" fill="{FAIL_COLOUR}">'
           f'red background: outside the tolerance (|a-b|/allowed &gt; 1)</text>',
           f'<line x1="{L}" x2="{width - R}" y1="{height - B}" y2="{height - B}" stroke="#d0d7de"/>']
    for k in range(0, int(math.log10(top)) + 1):
        yy = height - B - h(10 ** k)
        out.append(f'<line x1="{L}" x2="{width - R}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eee"/>'
                   f'<text x="{L - 4}" y="{yy + 4:.1f}" font-size="10" text-anchor="end">{10 ** k:g}</text>')
    gw = bw * 0.8 / len(groups)
    for b in range(nb):
        for g, (label, colour, counts) in enumerate(groups):
            c = counts[b]
            hh = h(c)
            out.append(f'<rect x="{L + bw * b + bw * 0.1 + g * gw:.1f}" y="{height - B - hh:.1f}" width="{gw:.1f}" '
                       f'height="{hh:.1f}" fill="{colour}"><title>{e(label)}: {c} elements with |a-b|/allowed '
                       f'{e(labels[b])}</title></rect>')
        out.append(f'<text x="{L + bw * (b + 0.5):.1f}" y="{height - B + 13}" font-size="10" text-anchor="middle">'
                   f'{e(labels[b])}</text>')
    lx = L
    for label, colour, _ in groups:
        out.append(f'<rect x="{lx}" y="{T - 14}" width="10" height="10" fill="{colour}"/>'
                   f'<text class="legend" x="{lx + 14}" y="{T - 5}" font-size="10">{e(label)}</text>')
        lx += 30 + 6 * len(label)
    out.append(f'<text x="{(L + width) / 2:.0f}" y="{height - 4}" font-size="10" text-anchor="middle">'
               f'|actual − expected| / allowed (allowed = atol + rtol·|expected|), elements per decade, log count'
               f'</text></svg>')
    return "".join(out)
