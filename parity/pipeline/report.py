"""The report's assembly: every configured cell's diff, latency, plan and model export, the machine's
fingerprints and the suites' coverage, read from the artifacts, into what parity.pipeline.report_render renders and
the DVC metric (summary.json, parity.core.metrics)."""

from __future__ import annotations

from html import escape
from pathlib import Path

from parity.config import params as config
from parity.config import schema
from parity.core import metrics
from parity.pipeline import report_render as render
from parity.analysis import fuzz_report, generate_report
from parity.core.io import read_json, write_json, write_text

BASELINE = ("fp32", "torch_cpu")  # latency ratios are against torch_cpu fp32 of the same model


def cell_entry(p: dict, art: Path, model: str, dtype: str, provider: str) -> dict:
    """What the report shows of one cell: its diff (metrics, layers, own errors), latency, module
    types and, with analysis.plan, its mixed-precision plan."""
    key = config.cell_key(model, dtype, provider)
    d = art / "diff" / key
    metrics = read_json(d / "metrics.json") if (d / "metrics.json").exists() else {
        "verdict": "MISSING", "reason": f"{d}/metrics.json not found (run dvc repro)"}
    lj_cell = read_json(d / "layers.json") if (d / "layers.json").exists() else {}
    tp = art / "timing" / f"{key}.json"
    lj = art / "models" / model / "layers.json"
    plan = art / "plan" / key / "plan.json"
    return {"key": key, "model": model, "dtype": dtype, "provider": provider, "metrics": metrics,
            "layers": lj_cell.get("layers", []), "own": lj_cell.get("own", []),
            "cause": lj_cell.get("drift_origin_cause"), "hist_edges": lj_cell.get("hist_edges"),
            "settings": lj_cell.get("settings") or {}, "layer_causes": lj_cell.get("layer_causes") or {},
            "k": _k(p, dtype),
            "timing": read_json(tp) if tp.exists() else {},
            "modules": {x["name"]: x["module"] for x in read_json(lj)["layers"]} if lj.exists() else {},
            "plan": _plan(p, plan), "reduce": _reduce(p, art / "reduce" / key / "reduce.json")}


def _k(p: dict, dtype: str) -> float:
    """The oracle's k for a dtype (dtypes.<d>.oracle.k), as oracle.limits reads it."""
    return float(schema.of(p).dtypes[dtype].oracle.k)


def model_entry(art: Path, model: str) -> dict:
    """A model's export as the report shows it: the op inventory (ops.json) and the leaf modules that
    were never called (layers.json)."""
    d = art / "models" / model
    lj = read_json(d / "layers.json") if (d / "layers.json").exists() else {}
    return {"ops": read_json(d / "ops.json") if (d / "ops.json").exists() else {},
            "exporter": lj.get("exporter"), "uncalled": lj.get("uncalled") or []}


def _reduce(p: dict, path: Path) -> dict | None:
    """reduce.json of a cell (analysis.reduce), with the repro's path relative to the report."""
    if not schema.of(p).analysis.reduce or not path.exists():
        return None
    r = read_json(path)
    if r.get("repro"):
        r["repro_link"] = f"../reduce/{path.parent.name}/{r['repro']}"
    return r


def _plan(p: dict, plan: Path) -> dict | None:
    """plan.json with its measured latencies (timing.json beside it), when analysis.plan is on."""
    if not schema.of(p).analysis.plan or not plan.exists():
        return None
    t = plan.parent / "timing.json"
    return {**read_json(plan), "latency_ratio": read_json(t).get("latency_ratio") if t.exists() else None}


def _latency(cells: list[dict]) -> dict:
    """Each cell's latency_ratio (set on the cell) against BASELINE of its model; latency.json."""
    base = {c["model"]: c["timing"].get("median_ms") for c in cells if (c["dtype"], c["provider"]) == BASELINE}
    for c in cells:
        b, t = base.get(c["model"]), c["timing"].get("median_ms")
        c["latency_ratio"] = t / b if b and t else None
    return {"baseline": "-".join(BASELINE),
            "per_cell": {c["key"]: {"median_ms": c["timing"].get("median_ms"), "p90_ms": c["timing"].get("p90_ms"),
                                    "latency_ratio": c["latency_ratio"]} for c in cells}}


def stage_peaks(p: dict, art: Path, cells: list[dict]) -> list[dict]:
    """Every heavy stage run of the configured cells with its timing file (peak RSS, estimate:
    parity.core.memory), in pipeline order; `timing` None when the file is missing (an older run)."""
    def entry(stage: str, path: Path) -> dict:
        return {"stage": stage, "timing": read_json(path) if path.exists() else None}

    t = art / "timing"
    models = list(dict.fromkeys(c["model"] for c in cells))
    pairs = list(dict.fromkeys((c["model"], c["dtype"]) for c in cells))
    rows = [entry(f"{s}@{m}", t / s / f"{m}.json") for m in models for s in ("export", "reference")]
    rows += [entry(f"baseline@{m}-{d}", t / "baseline" / f"{m}-{d}.json") for m, d in pairs]
    rows += [{"stage": f"capture@{c['key']}", "timing": c["timing"] or None} for c in cells]
    rows += [entry(f"diff@{c['key']}", t / "diff" / f"{c['key']}.json") for c in cells]
    return rows


OUTPUT_SIGNATURE = ("rel_l2", "max_abs", "mean_abs", "cosine")


def computed_alike(p: dict, cells: list[dict]) -> list[str]:
    """Cells of one model and provider whose outputs match to the last bit (the same error against the
    reference in every output metric) although their precision modes compute in different formats: a
    mode that was not applied. Seen on an H200: torch 2.11's Inductor cache served amp_bf16 cells the
    graph compiled for amp_fp16 (docs/gpu-verification.md); a GPU without TF32 gives tf32 = fp32.
    Modes of one format may legitimately agree (amp_fp16 = fp16 where autocast keeps nothing in fp32
    that matters), so they are not named. One line per group, in matrix order."""
    fmt = {d: (c.get("torch"), schema.mode(c) == "tf32") for d, c in (p.get("dtypes") or {}).items()}
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        o = (c["metrics"] or {}).get("output") or {}
        sig = tuple(o.get(k) for k in OUTPUT_SIGNATURE)
        if o.get("rel_l2") and None not in sig:  # 0: bit-identical to the reference, judged elsewhere
            groups.setdefault((c["model"], c["provider"], sig), []).append(c)
    return [f"{', '.join(c['key'] for c in cs)}: the same output to the last bit at precisions of different "
            f"formats ({', '.join(c['dtype'] for c in cs)}): a precision mode was not applied"
            for cs in groups.values() if len({fmt.get(c["dtype"]) for c in cs}) > 1]


def alike_sections(lines: list[str]) -> tuple[str, str]:
    """The Markdown and HTML sections naming computed_alike's groups ("" when there are none)."""
    if not lines:
        return "", ""
    head = "Precision modes that computed alike"
    md = "\n".join([f"## {head}", ""] + [f"- {x}" for x in lines] + [""])
    page = f"<h2>{head}</h2><ul>" + "".join(f"<li>{escape(x)}</li>" for x in lines) + "</ul>"
    return md, page


def quant_costs(cells: list[dict], top: int = 5) -> list[str]:
    """One line per quantised cell (int4 / int8 judged by the quantised oracle): what the quantisation
    itself costs, apart from the verdict: the output's rel_l2 vs the fp32 reference, the layers it costs
    most (each layer's `quant_cost`, parity.pipeline.diff.quant_summary) and packed weights unlike parity's own."""
    lines = []
    for c in cells:
        q = (c["metrics"] or {}).get("quant")
        if not q:
            continue
        per = sorted(((l["oracle"]["quant_cost"], l["name"]) for l in c["layers"]
                      if (l.get("oracle") or {}).get("quant_cost") is not None), key=lambda x: (-x[0], x[1]))
        most = ", ".join(f"{n} {v:.3g}" for v, n in per[:top])
        differ = q.get("weights_differ") or []
        lines.append(f"{c['key']} ({q['scheme']}, {c['metrics'].get('verdict')}): output rel_l2 "
                     f"{q.get('cost_output') or 0:.3g} vs fp32" + (f"; most costly of {len(per)} layers: {most}" if per else "")
                     + (f"; packed weights differ from parity's quantisation at {', '.join(differ)}" if differ
                        else "; packed weights equal parity's quantisation"))
    return lines


def quant_sections(lines: list[str]) -> tuple[str, str]:
    """The Markdown and HTML sections of quant_costs ("" when no cell is quantised)."""
    if not lines:
        return "", ""
    head = "Quantisation cost (expected, not judged)"
    note = ("The verdict judges each quantised cell against parity's own fp64 quantisation of the same weights "
            "(the quantised oracle); what the quantisation itself costs against the fp32 reference is shown here.")
    md = "\n".join([f"## {head}", "", note, ""] + [f"- {x}" for x in lines] + [""])
    page = f"<h2>{head}</h2><p>{escape(note)}</p><ul>" + "".join(f"<li>{escape(x)}</li>" for x in lines) + "</ul>"
    return md, page


def write_report(p: dict, art: Path, out: Path) -> tuple[dict, list[dict]]:
    """report.md, report.html, summary.json and latency.json under `out`; (summary, cells)."""
    cells = [cell_entry(p, art, model, dtype, provider) for model, dtype, provider in config.cells(p)]
    latency = _latency(cells)
    env = {f.stem: read_json(f) for f in sorted((art / "env").glob("*.json"))
           if not f.stem.startswith(("provider-", "stage-"))}
    coverage = {}
    for suite in schema.of(p).suites:
        f = art / "suites" / "coverage" / f"{suite}.json"
        coverage[suite] = read_json(f) if f.exists() else None
    # the DVC metric: totals + one compact entry per cell and suite cell (layout: parity.core.metrics)
    summary = metrics.summary({c["key"]: metrics.cell_entry(c["metrics"], c["plan"]) for c in cells},
                              metrics.suite_entries(coverage))
    title = "parity report"
    models = {m: model_entry(art, m) for m in dict.fromkeys(c["model"] for c in cells)}
    threads = (p.get("capture") or {}).get("threads")
    camps, steps = fuzz_report.load(p, art)  # fuzz campaigns and training steps, when selected
    gens = generate_report.load(p, art)  # generation drift cells, when selected ({}: nothing added)
    if gens:
        summary["generate"] = {k: generate_report.entry(c) for k, c in gens.items()}
    peaks = stage_peaks(p, art, cells)
    md = render.markdown(title, summary, cells, env, coverage, models, threads, peaks)
    alike_md, alike_html = alike_sections(computed_alike(p, cells))
    quant_md, quant_html = quant_sections(quant_costs(cells))
    md = md + "".join("\n" + x for x in (alike_md, quant_md) if x)
    md = md + "\n".join(fuzz_report.markdown(camps, steps)) if camps or steps else md
    write_text(out / "report.md", md + "\n".join(generate_report.markdown(gens)))
    page = render.html_page(title, summary, cells, env, coverage, models, threads, peaks)
    write_text(out / "report.html", page.replace("</body>", alike_html + quant_html + fuzz_report.html_sections(camps, steps)
                                                 + generate_report.html_sections(gens) + "</body>", 1))
    write_json(out / "summary.json", summary, sort_keys=False)  # totals first, cells in matrix order
    write_json(out / "latency.json", latency)
    return summary, cells
