"""`parity exp`: `dvc exp show`, narrowed to what a person compares across experiments.

`dvc exp show` prints every param leaf of params.yaml (58 columns for the CPU default: each model's
arch and inputs, each dtype's tolerances, each provider's options), every metric and the hash of
every dependency (~70: each stage's exact code deps). Its own flags do not get that under one screen: `--only-changed` drops every column equal across the rows
shown, but a group option present in one experiment and absent in another (`dtypes.bf16.tol.atol`
after `-S 'dtypes=fp32,fp16,bf16'`) counts as changed, so a 3-dtype sweep still shows each
dtype's ~6 leaves; `--drop`/`--keep` need regexes the user must write. This view, over DVC's own
experiment data (the same rows and order as `dvc exp show`):

  Experiment, Created   as in dvc exp show (State too while one is queued, running or failed)
  params                only those whose value differs between the rows shown; a multi-select group
                        (models, dtypes, providers, suites) is ONE column listing its selected options
                        (`fp32,fp16`), plus the leaves inside an option that differ between rows that
                        both select it (`dtypes.fp16.tol.atol`); derived keys are never shown
  passed failed not_run the report's totals (summary.json, parity.core.metrics)
  one column per cell   its verdict, with the drift origin when it fails (`FAIL @fc1`); --worst adds
                        the worst error ratio (1 is the limit)

`--all-params` shows every param leaf (groups still collapsed); `-T` transposes (one column per
experiment: narrow however many cells there are). Formats: a plain table (default),
`--md` (GitHub Markdown, as `dvc exp show --md`), `--csv`, `--json` (a list of row objects).
Rows: `-n N` commits back from HEAD (`--rev REV` to start elsewhere), `-A` every commit.
"""

from __future__ import annotations

import csv
import json
import sys
from datetime import datetime

from parity.core import metrics as layout
from parity.core.status import Status
from parity.core.ui import at_least, plain_table

GROUPS = ("models", "dtypes", "providers", "suites")  # conf/<group>/ multi-select: {option: {...}}
# computed at compose time from the groups and other params (hydra_plugins): never a choice of its own
DERIVED = ("capture_providers", "engine_providers", "torch_models", "onnx_models", "plan_dtypes", "validated",
           "report")
PARAMS_FILE = "params.yaml"
MISSING = "-"


def add_arguments(ap) -> None:
    ap.add_argument("-n", "--num", type=at_least(1), default=1, help="commits back from --rev whose experiments to show")
    ap.add_argument("--rev", help="show experiments derived from this commit (default HEAD)")
    ap.add_argument("-A", "--all-commits", action="store_true", help="experiments of every commit")
    ap.add_argument("--all-params", action="store_true", help="every param, not only those that differ")
    ap.add_argument("--worst", action="store_true", help="a worst-error-ratio column per cell (1 is the limit)")
    ap.add_argument("-T", "--transpose", action="store_true",
                    help="one column per experiment, one row per param/total/cell (narrow for many cells)")
    fmt = ap.add_mutually_exclusive_group()
    fmt.add_argument("--md", action="store_true", help="GitHub Markdown, as dvc exp show --md")
    fmt.add_argument("--csv", action="store_true")
    fmt.add_argument("--json", action="store_true", help="a list of row objects")


def run_from_args(args) -> int:
    try:
        states = load(".", rev=args.rev, num=args.num, all_commits=args.all_commits)
    except RuntimeError as e:
        print(f"parity exp: {e}", file=sys.stderr)
        return 2
    head, rows = view(rows_of(states), all_params=args.all_params, worst=args.worst)
    if args.transpose:
        head, rows = transpose(head, rows)
    out = sys.stdout
    if args.json:
        out.write(json.dumps([dict(zip(head, r)) for r in rows], indent=2) + "\n")
    elif args.csv:
        w = csv.writer(out, lineterminator="\n")
        w.writerows([head, *rows])
    else:
        out.write((markdown(head, rows) if args.md else plain_table(head, rows)) + "\n")
    return 0


def load(cwd: str = ".", rev: str | None = None, num: int = 1, all_commits: bool = False) -> list[dict]:
    """DVC's experiment states (as `dvc exp show --json` prints them)."""
    # lazy: dvc.repo +0.29 s (BENCHMARKS 22); `parity --help` builds this module's parser
    from dvc.exceptions import DvcException
    from dvc.repo import Repo  # lazy: dvc.repo +0.29 s (BENCHMARKS 22); `parity --help` builds this module's parser

    try:
        with Repo(cwd) as repo:
            states = repo.experiments.show(revs=[rev] if rev else None, num=num, all_commits=all_commits)
            return [s.dumpd() for s in states]
    except DvcException as e:
        raise RuntimeError(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__) from None


# -- rows ---------------------------------------------------------------------------------------------

def _flat(d, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _row(state: dict, name: str, kind: str, exec_state: str | None = None) -> dict:
    data = state.get("data") or {}
    params = ((data.get("params") or {}).get(PARAMS_FILE) or {}).get("data") or {}
    summary = next((m.get("data") or {} for p, m in (data.get("metrics") or {}).items()
                    if p.replace("\\", "/").endswith("/" + layout.SUMMARY) and isinstance(m, dict)), {})
    ts = data.get("timestamp")
    if isinstance(ts, str):
        ts = datetime.fromisoformat(ts)
    return {"name": name, "kind": kind, "created": ts.strftime("%b %d %H:%M") if ts else MISSING,
            "state": exec_state, "params": params, "totals": layout.totals(summary),
            "cells": layout.cells_of(summary), "error": bool(state.get("error"))}


def rows_of(states: list[dict]) -> list[dict]:
    """One row per workspace, baseline commit and experiment, in `dvc exp show`'s order."""
    rows = []
    for st in states:
        rev = st.get("rev", "")
        name = "workspace" if rev == "workspace" else (st.get("name") or rev[:7])
        rows.append(_row(st, name, "workspace" if rev == "workspace" else "baseline"))
        for rng in st.get("experiments") or []:
            ex = rng.get("executor") or {}
            for e in rng.get("revs") or []:
                rows.append(_row(e, rng.get("name") or e.get("name") or e.get("rev", "")[:7], "experiment",
                                 ex.get("state") if ex.get("state") not in (None, "success") else None))
    return rows


# -- columns ------------------------------------------------------------------------------------------

def _cell_text(v) -> str:
    if v is None:
        return MISSING
    if isinstance(v, float):
        return f"{v:.5g}"
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v)) or "[]"
    return str(v)


def _param_columns(rows: list[dict], all_params: bool) -> list[tuple[str, list[str]]]:
    """(header, value per row) for the params shown: groups collapsed, only what differs."""
    cols: list[tuple[str, list[str]]] = []
    keys = list(dict.fromkeys(k for r in rows for k in r["params"]))
    for key in keys:
        if key in DERIVED:
            continue
        vals = [r["params"].get(key) for r in rows]
        if key in GROUPS:
            sel = [(",".join(v) or "[]") if isinstance(v, dict) else _cell_text(v) for v in vals]
            if all_params or len(set(sel)) > 1:
                cols.append((key, sel))
            # leaves inside an option: shown when rows selecting that option disagree
            for opt in dict.fromkeys(o for v in vals if isinstance(v, dict) for o in v):
                leaves = [_flat(v[opt]) if isinstance(v, dict) and isinstance(v.get(opt), dict) else None
                          for v in vals]
                for leaf in dict.fromkeys(lk for lv in leaves if lv for lk in lv):
                    got = [_cell_text(lv.get(leaf)) if lv is not None else None for lv in leaves]
                    if all_params or len({g for g in got if g is not None}) > 1:
                        cols.append((f"{key}.{opt}.{leaf}", [g if g is not None else MISSING for g in got]))
            continue
        flat = [_flat({key: v}) if isinstance(v, dict) else {key: v} for v in vals]
        for leaf in dict.fromkeys(lk for f in flat for lk in f):
            got = [_cell_text(f.get(leaf)) for f in flat]
            if all_params or len(set(got)) > 1:
                cols.append((leaf, got))
    return cols


def _verdict(e: dict | None) -> str:
    if not e:
        return MISSING
    v = e.get("verdict") or MISSING
    return f"{v} @{e['origin']}" if v == Status.FAIL and e.get("origin") else v


def view(rows: list[dict], all_params: bool = False, worst: bool = False) -> tuple[list[str], list[list[str]]]:
    """(headers, rows of strings) of the narrowed table."""
    cols: list[tuple[str, list[str]]] = [("Experiment", [r["name"] for r in rows]),
                                         ("Created", [r["created"] for r in rows])]
    if any(r["state"] for r in rows):
        cols.append(("State", [r["state"] or MISSING for r in rows]))
    cols += _param_columns(rows, all_params)
    for t in ("passed", "failed", "not_run"):
        cols.append((t, [_cell_text(r["totals"].get(t)) if not r["error"] else "!" for r in rows]))
    for cell in dict.fromkeys(c for r in rows for c in r["cells"]):
        cols.append((cell, [_verdict(r["cells"].get(cell)) if not r["error"] else "!" for r in rows]))
        if worst:
            cols.append((f"{cell}.worst", [_cell_text((r["cells"].get(cell) or {}).get("worst")) for r in rows]))
    return [h for h, _ in cols], [list(r) for r in zip(*(v for _, v in cols))]


def transpose(head: list[str], rows: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """Experiments as columns: the first column names what each row shows."""
    return [head[0], *(r[0] for r in rows)], [[h, *(r[i] for r in rows)] for i, h in enumerate(head) if i]


# -- rendering ----------------------------------------------------------------------------------------

def markdown(head: list[str], rows: list[list[str]]) -> str:
    esc = lambda x: x.replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(map(esc, head)) + " |", "|" + "|".join("-" * (len(h) + 2) for h in head) + "|"]
    return "\n".join(lines + ["| " + " | ".join(map(esc, r)) + " |" for r in rows])
