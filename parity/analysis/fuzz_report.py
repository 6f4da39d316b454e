"""The report's sections for fuzz campaigns (campaign.json of fuzz@suite-dtype-provider) and training
steps (train_step@model-dtype): markdown lines and an HTML fragment. Light (no torch).

Which artifacts exist is read from params (fuzz.suites x dtypes x providers, train_step.models x
dtypes), never globbed; a missing file shows as "not run".
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from parity.config import schema
from parity.core import paths

SHOW_FAILURES = 25


def load(p: dict, art: Path) -> tuple[dict, dict]:
    """({'suite-dtype-provider': campaign or None}, {'model-dtype': train step or None})."""
    c = schema.of(p)
    f, t = c.fuzz, c.train_step
    camps, steps = {}, {}
    for s in f.suites:
        for d in f.dtypes:
            for pr in f.providers:
                c = art / Path(paths.FUZZ).name / s / f"{d}-{pr}" / "campaign.json"
                camps[f"{s}-{d}-{pr}"] = json.loads(c.read_text()) if c.exists() else None
    for m in t.models:
        for d in t.dtypes:
            c = art / Path(paths.TRAIN_STEP).name / m / f"{d}.json"
            steps[f"{m}-{d}"] = json.loads(c.read_text()) if c.exists() else None
    return camps, steps


def _fmt(v) -> str:
    return "-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))


def _failures(c: dict) -> tuple[list[str], list[list[str]]]:
    # lazy: `stages.report --help` loads no numpy (+0.10 s, BENCHMARKS 22; tests/test_light_stages.py)
    from parity.analysis.fuzz import FAIL_STATUSES as FAIL

    head = ["case id", "seed", "status", "values/layout", "dims", "reason"]
    rows = [[r["id"], str(r["seed"]), r["status"], f"{r['values']}/{r['layout']}",
             " ".join(f"{k}={v}" for k, v in r["dims"].items()), r["reason"][:140]]
            for r in c["rows"] if r["status"] in FAIL][:SHOW_FAILURES]
    return head, rows


def _per_case(c: dict) -> tuple[list[str], list[list[str]]]:
    statuses = sorted({s for v in c["per_case"].values() for s in v})
    return ["case", *statuses], [[b, *[str(v.get(s, 0)) for s in statuses]] for b, v in c["per_case"].items()]


def _step_rows(t: dict) -> tuple[list[str], list[list[str]]]:
    head = ["parameter", "numel", "grad rel_l2", "max_abs", "cosine", "fp32 vs fp64", "amp vs fp64"]
    rows = [[r["name"], str(r["numel"]), _fmt(r["rel_l2"]), _fmt(r["max_abs"]), f"{r['cosine']:.6f}",
             _fmt(r.get("fp32_vs_fp64")), _fmt(r.get("amp_vs_fp64"))]
            for r in sorted(t["params"], key=lambda r: -r["rel_l2"])]
    return head, rows


def _md_table(head, rows) -> list[str]:
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + [
        "| " + " | ".join(esc(x) for x in r) + " |" for r in rows] + [""]


def _camp_line(c: dict) -> str:
    s = c["settings"]
    return (f"{c['cases']} cases from seed {s['seed']}, {c['failures']} failures; "
            + ", ".join(f"{k} {v}" for k, v in c["counts"].items()))


def _step_line(t: dict) -> str:
    lo, w = t["loss"], t["worst"] or {}
    return (f"{t['verdict']}: worst gradient {w.get('name')} rel_l2 {_fmt(w.get('rel_l2'))} (limit {t['limit']:g}); "
            f"loss fp32 {lo['fp32']:.6g}, AMP {lo['amp']:.6g}" + (f", fp64 {lo['fp64']:.6g}" if lo["fp64"] else ""))


def markdown(camps: dict, steps: dict) -> list[str]:
    lines = []
    for key, c in camps.items():
        lines += [f"## Fuzz campaign `{key}`", ""]
        if c is None:
            lines += ["(not run: `dvc repro`)", ""]
            continue
        lines += [_camp_line(c), "", *_md_table(*_per_case(c))]
        head, rows = _failures(c)
        if rows:
            lines += ["Failures (replay: `parity fuzz SUITE --dtype D --provider P --reproduce ID`):", "",
                      *_md_table(head, rows)]
    for key, t in steps.items():
        lines += [f"## Training step `{key}` (fp32 vs AMP)", ""]
        lines += ["(not run: `dvc repro`)", ""] if t is None else [_step_line(t), "", *_md_table(*_step_rows(t))]
    return lines


def _html_table(head, rows) -> str:
    e = html.escape
    return ("<table class='cells'><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{e(str(x))}</td>" for x in r) + "</tr>" for r in rows) + "</table>")


def html_sections(camps: dict, steps: dict) -> str:
    e, h = html.escape, []
    for key, c in camps.items():
        h.append(f"<section id='fuzz-{e(key)}' class='fuzz'><h2>Fuzz campaign {e(key)}</h2>")
        if c is None:
            h.append("<p>Not run: <code>dvc repro</code>.</p></section>")
            continue
        h.append(f"<p>{e(_camp_line(c))}</p>" + _html_table(*_per_case(c)))
        head, rows = _failures(c)
        if rows:
            h.append("<details open><summary>Failures (replay with <code>parity fuzz --reproduce ID</code>)"
                     "</summary>" + _html_table(head, rows) + "</details>")
        h.append("</section>")
    for key, t in steps.items():
        h.append(f"<section id='train-{e(key)}' class='train'><h2>Training step {e(key)} (fp32 vs AMP)</h2>")
        h.append("<p>Not run: <code>dvc repro</code>.</p>" if t is None else
                 f"<p>{e(_step_line(t))}</p><details><summary>Per-parameter gradients</summary>"
                 + _html_table(*_step_rows(t)) + "</details>")
        h.append("</section>")
    return "".join(h)
