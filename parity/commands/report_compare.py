"""`parity compare REV_A [REV_B] --html OUT`: one self-contained page (inline SVG, no scripts, nothing
fetched) with, per cell, both revisions' per-layer curves on one chart (REV_A dashed, REV_B solid, REV_B's
failing layers and drift origin marked), under a table of the verdict and drift-origin changes.

The verdicts come from parity.commands.history (DVC's metrics of both revisions: the same checks, the same
errors when a revision's metrics are not in the local cache); the per-layer values from each cell's
diff output layers.json beside its metrics.json, read at the revision through DVC's file system (from
the local cache) and from the workspace when REV_B is not given. A cell whose layers cannot be read at
one revision is drawn with the other revision's curve only, and says why.
"""

from __future__ import annotations

import html
import json
import subprocess
from pathlib import Path

import yaml
from dvc.exceptions import DvcException
from dvc.repo import Repo

from parity.commands import history
from parity.core import paths
from parity.pipeline import report_render as report
from parity.core import svg
from parity.config import schema
from parity.core.io import write_text

COLOURS = ("#8c959f", "#0969da")  # REV_A, REV_B


def read_layers(rev: str | None, cells: list[str], root: Path) -> dict:
    """{cell: layers.json content, or the reason it cannot be read} at `rev` (None: the workspace)."""
    out = {}
    if rev is None:
        for cell in cells:
            f = root / paths.cell_layers(cell)
            out[cell] = json.loads(f.read_text()) if f.exists() else f"{f} not found (run the pipeline)"
        return out

    with Repo.open(str(root), rev=rev, uninitialized=True) as repo:
        for cell in cells:
            try:
                with repo.dvcfs.open(paths.cell_layers(cell), mode="r") as f:
                    out[cell] = json.load(f)
            except (OSError, DvcException) as e:  # not in the cache, or not an output at that revision
                out[cell] = f"{paths.cell_layers(cell)} at {rev}: {history._first_line(e)}"
    return out


def read_params(rev: str | None, root: Path) -> dict:
    if rev is None:
        f = root / "params.yaml"
        return yaml.safe_load(f.read_text()) if f.exists() else {}
    p = subprocess.run(["git", "show", f"{rev}:./params.yaml"], cwd=root, capture_output=True, text=True)
    return (yaml.safe_load(p.stdout) or {}) if p.returncode == 0 else {}


def _metric_of(lj: dict, params: dict, dtype: str) -> tuple[str, list, float, str]:
    """(label, per-layer values, limit, limit label) of the curve a revision's cell draws, on the report's
    one scale (svg.RATIO, 1 the limit): its accumulated excess over k in oracle mode, tol_ratio otherwise."""
    layers = lj.get("layers") or []
    if lj.get("verdict_mode") == "oracle":
        dc = (params.get("dtypes") or {}).get(dtype)
        # that revision's dtypes.<d>.oracle.k; 4 (conf/dtypes' value) only when its params.yaml is unreadable
        k = float(schema.section(schema.Oracle, dc["oracle"]).k) if dc else 4.0
        ex = [(d.get("oracle") or {}).get("excess") for d in layers]
        return (f"{svg.RATIO} (excess / k = {k:g})", [svg.num(x) / k if svg.num(x) is not None and k else None for x in ex],
                1.0, f"limit: {svg.RATIO} = 1")
    return f"{svg.RATIO} (tol_ratio)", [d.get("tol_ratio") for d in layers], 1.0, f"limit: {svg.RATIO} = 1"


def cell_chart(cell: str, sides: list[tuple[str, object, dict]], metrics_b: dict) -> str:
    """Both revisions' curves of one cell on one chart, aligned by layer name (REV_B's order)."""
    dtype = (cell.split("-") + ["", ""])[1]
    ok = [(rev, lj, p) for rev, lj, p in sides if isinstance(lj, dict) and lj.get("layers")]
    notes = [f"{rev}: {lj}" for rev, lj, _ in sides if isinstance(lj, str)]
    if not ok:
        return "<p>" + "; ".join(html.escape(n) for n in notes) + "</p>"
    names = [d["name"] for d in ok[-1][1]["layers"]]
    series, limit, limit_label = [], 1.0, ""
    for rev, lj, p in ok:
        label, values, limit, limit_label = _metric_of(lj, p, dtype)
        by = {d["name"]: v for d, v in zip(lj["layers"], values)}
        colour = COLOURS[1] if rev == sides[-1][0] else COLOURS[0]
        failed = [not d["passed"] for d in lj["layers"]] if rev == sides[-1][0] else []
        series.append(svg.Series(f"{rev}: {label}", colour, [by.get(n) for n in names],
                                 dash="" if rev == sides[-1][0] else "5 3", failed=failed))
    origin_name = (metrics_b.get("drift_origin") or "") if isinstance(sides[-1][1], dict) else ""
    leaf = origin_name.split(":", 1)[1] if origin_name.startswith("between:") else origin_name
    origin = names.index(leaf) if leaf in names else None
    cv = svg.Curve(names=names, series=series, limit=limit, limit_label=limit_label, origin=origin,
                   origin_label=metrics_b.get("drift_origin_where") or origin_name)
    return svg.curve_svg(cv, css="curve compare") + "".join(f"<p><small>{html.escape(n)}</small></p>" for n in notes)


def page(rev_a: str, rev_b: str | None, cwd: str = ".") -> str:
    """The compare page's HTML. Raises what parity.commands.history.load_metrics raises (exit 2 in the CLI)."""
    root = Path(cwd).resolve()
    old, new = history.load_metrics(rev_a, rev_b, str(root))
    params = history.tolerance_changes(rev_a, rev_b, str(root))
    changes = history.changes(old, new)
    cells = [c.cell for c in changes]
    label_b = rev_b or history.WORKSPACE
    layers = {rev_a: read_layers(rev_a, cells, root), label_b: read_layers(rev_b, cells, root)}
    prm = {rev_a: read_params(rev_a, root), label_b: read_params(rev_b, root)}
    e = html.escape
    title = f"parity compare {rev_a}..{label_b}"
    h = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
         f"<style>{report.CSS}</style></head><body><h1>{e(title)}</h1>"]
    if params:
        h.append("<p id='tolerance-changes'>Tolerance changed: " + "; ".join(
            f"<code>{e(k)}</code> {e(str(a))} → {e(str(b))}" for k, (a, b) in params.items()) + "</p>")
    for c in changes:
        c.tolerance = bool(history.tolerance_moved(c, params))
    rows = [[c.cell, c.kind + (" REGRESSION" if c.regression else ""), history._pair(c, "verdict"),
             history._pair(c, "drift_origin"), history._pair(c, "output.max_abs", True)] for c in changes]
    h.append(report.html_table(["cell", "change", "verdict", "drift origin", "output max_abs"], rows, "changes",
                               code_col=0))
    for c in changes:
        a, b = c.verdicts
        h.append(f"<section id='{e(c.cell)}' class='cell'><h2>{e(c.cell)} {report.verdict_badge(a or 'MISSING')} → "
                 f"{report.verdict_badge(b or 'MISSING')}</h2>")
        h.append(f"<p>drift origin: <code>{e(history._pair(c, 'drift_origin'))}</code>; worst layer: "
                 f"<code>{e(history._pair(c, 'worst_layer'))}</code>; output max_abs "
                 f"{e(history._pair(c, 'output.max_abs', True))}</p>")
        sides = [(rev_a, layers[rev_a][c.cell], prm[rev_a]), (label_b, layers[label_b][c.cell], prm[label_b])]
        h.append(cell_chart(c.cell, sides, c.new) + "</section>")
    h.append("</body></html>\n")
    return "\n".join(h)


def write_page(rev_a: str, rev_b: str | None, out: str | Path, cwd: str = ".") -> Path:
    out = Path(out)
    write_text(out, page(rev_a, rev_b, cwd))
    return out
