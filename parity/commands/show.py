"""`parity show CELL [--json] [--all]`: one cell in the terminal, from its diff results.

Verdict (and how it was decided), drift origin and its cause, then every failing layer in
torch.testing's terms: mismatched elements n / N (%), the worst element (sample, index) with its
actual and expected values and what the tolerance allowed there (atol + rtol |expected|), the
tolerance key that applied, and the oracle's excess (error vs fp64 over the trusted backend's).
Own-error failures (a layer, or the ops between two leaves, adding more error than the trusted
backend) are listed beside them. Under the oracle verdict a passing cell can still have elements
outside atol/rtol: those layers are listed too, marked as accepted, the worst first (`--all`: all).
Reads metrics.json and layers.json of the cell's diff stage and, for the worst elements' values,
the capture and the fp32 reference (Parquet). Light: no torch.
"""

from __future__ import annotations

import sys
from typing import TextIO

from dvc.exceptions import DvcException

from parity.commands import results
from parity.core.io import Corrupt, read_json
from parity.core.ui import dump_json, num, table

SHOWN = 10  # accepted out-of-tolerance layers shown without --all


class ShowError(RuntimeError):
    pass


def collect(cell: str, root: str = ".", all_layers: bool = False) -> dict:
    """The cell's view as a dict (the --json document; docs/cli-json.md "show")."""
    try:
        files = results.cell_files(root)
    except DvcException as e:  # not a DVC repository, a broken dvc.yaml
        raise ShowError(str(e).strip().splitlines()[0]) from None
    if cell not in files:
        raise ShowError(f"unknown cell {cell!r}: dvc.yaml's diff stages (params.yaml) have "
                        f"{', '.join(sorted(files)) or 'none'}")
    f = files[cell]
    if not f.metrics.exists():
        raise ShowError(f"{cell}: {f.metrics} does not exist: run the pipeline (`parity repro` or "
                        f"`dvc repro diff@{cell}`), or `dvc pull` it")
    m = read_json(f.metrics)
    doc = read_json(f.layers) if f.layers.exists() else {}
    bad, bad_own = results.failing(doc)
    fail_rows = [results.mismatch(d) for d in bad]
    failing_names = {r["layer"] for r in fail_rows}
    accepted = nearest_first([results.mismatch(d) for d in results.outside_tolerance(doc)
                              if d["name"] not in failing_names])
    n_accepted = len(accepted)
    if not all_layers:
        accepted = accepted[:SHOWN]
    results.worst_values(f, fail_rows + accepted)
    n, n_failed = results.layer_counts(m)
    return {
        "cell": cell, "verdict": results.verdict(m), "verdict_mode": results.verdict_mode(m),
        "reason": results.reason(m), "layers": n, "layers_failed": n_failed,
        "drift_origin": results.drift_origin(m), "drift_origin_where": results.drift_where(m),
        "cause": results.cause(m), "worst_layer": results.worst_layer(m),
        "output": {k: (m.get("output") or {}).get(k) for k in ("max_abs", "rel_l2", "tol_ratio")},
        "failing_layers": fail_rows,
        "failing_own": [{k: r.get(k) for k in ("name", "layer", "kind", "excess", "err_rmse", "floor_rmse")}
                        for r in bad_own],
        "outside_tolerance": accepted, "outside_tolerance_total": n_accepted,
        "precision": results.precision(m), "baseline": results.baseline(m),
    }


def nearest_first(rows: list[dict]) -> list[dict]:
    """Mismatch rows nearest the verdict's limit first: by the excess the table shows (oracle verdict),
    else by tol_ratio (tolerance verdict, where excess is None)."""
    return sorted(rows, key=lambda r: -(r["excess"] if r["excess"] is not None else r["tol_ratio"] or 0.0))


def _rows(rows: list[dict]) -> list[list[str]]:
    out = []
    for r in rows:
        pct = 100.0 * r["n_outside"] / r["numel"] if r["numel"] else 0.0
        where = f"{r['worst_sample']}, {tuple(r['worst_index'])}" if r["worst_index"] else "-"
        out.append([r["layer"], f"{r['n_outside']} / {r['numel']} ({pct:.2f}%)", num(r["max_abs"]), where,
                    num(r.get("actual")), num(r.get("expected")), num(r.get("allowed")),
                    num(r["excess"]) if r["excess"] is not None else "-", r["tol_source"] or "-"]
                   + ([r["problem"]] if any(x["problem"] for x in rows) else []))
    return out


HEAD = ["layer", "mismatched", "max_abs", "worst element (sample, index)", "actual", "expected", "allowed",
        "excess", "tolerance"]


def _table(rows: list[dict], out: TextIO, title: str) -> None:
    table(HEAD + (["problem"] if any(r["problem"] for r in rows) else []), _rows(rows), out, title=title)


def _is_output(name: str) -> bool:
    """A model output row (`output`, `output:<name>`, `plain:output...`: parity.core.store.is_output,
    without importing pyarrow), which metrics.json's layer counts leave out."""
    return name.removeprefix("plain:").split(":")[0] == "output"


def render(v: dict, out: TextIO = sys.stdout) -> None:
    how = f"by {v['verdict_mode']}" if v["verdict_mode"] else ""
    counts = f"{v['layers_failed']} of {v['layers']} layers fail" if v["layers"] is not None else ""
    print(f"{v['cell']}: {v['verdict']}" + (f" ({', '.join(x for x in (how, counts) if x)})" if how or counts else "")
          + (f": {v['reason']}" if v["reason"] else ""), file=out)
    if v.get("precision"):
        print(f"precision: {v['precision']['evidence']}", file=out)
    if v.get("baseline"):
        print(f"baseline: {v['baseline']}", file=out)
    if v["drift_origin"]:
        c = v["cause"]
        print(f"drift origin: {v['drift_origin_where']}" + (f"  cause: {c['label']}" if c else "")
              + (f" ({c['summary']})" if c and c.get("summary") else ""), file=out)
    if v["worst_layer"]:
        print(f"worst layer: {v['worst_layer']}", file=out)
    o = v["output"]
    if o.get("max_abs") is not None:
        print(f"output: max_abs {num(o['max_abs'])}, rel_l2 {num(o['rel_l2'])}", file=out)
    if v["failing_layers"]:
        print(file=out)
        n_out = sum(_is_output(r["layer"]) for r in v["failing_layers"])  # the counts above are of layers only
        n = f"{len(v['failing_layers']) - n_out}" + (f", and {n_out} output(s)" if n_out else "")
        _table(v["failing_layers"], out, f"failing layers ({n}): worst element = largest "
                                          "|actual - expected| / allowed, allowed = atol + rtol |expected|")
    if v["failing_own"]:
        print(file=out)
        table(["own error of", "kind", "excess", "err_rmse", "trusted err_rmse"],
              [[r["name"], r["kind"] or "-", num(r["excess"]), num(r["err_rmse"]), num(r["floor_rmse"])]
               for r in v["failing_own"]], out,
              title=f"failing own errors ({len(v['failing_own'])}): more error added here than the trusted backend adds")
    if v["outside_tolerance"]:
        print(file=out)
        shown = len(v["outside_tolerance"])
        more = f", the {shown} worst shown (--all: every one)" if shown < v["outside_tolerance_total"] else ""
        other = " other" if v["failing_layers"] else ""
        _table(v["outside_tolerance"], out, f"elements outside atol/rtol in {v['outside_tolerance_total']}{other} "
                                            f"layer(s), accepted by the {v['verdict_mode']} verdict{more}")


def show(cell: str, root: str = ".", as_json: bool = False, all_layers: bool = False,
         out: TextIO = sys.stdout) -> int:
    try:
        v = collect(cell, root, all_layers)
    except Corrupt as e:  # metrics.json / layers.json / a Parquet file that does not parse
        raise ShowError(str(e)) from None
    if as_json:
        dump_json(v, out)
    else:
        render(v, out)
    return 0
