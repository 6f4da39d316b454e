"""`parity compare REV_A [REV_B]`: what changed per cell between two revisions, built on the diff
stages' artifacts/diff/<cell>/metrics.json of the cells each revision's summary.json (the DVC metric)
names, read per revision through DVC's API as `dvc metrics show` targets, and DVC's params diff. Light: no torch, no numpy.

Never passes silently: `dvc metrics diff` only warns ("failed to load some metrics") when a
revision's metrics are not in the local cache, and every cell then looks "new". Here a revision
whose cell metrics cannot be loaded is an error (exit 2, MetricsUnavailable: why, and what can get them), and so
is a revision with no cell metrics at all. A cell is "new" only when the baseline does not declare
it. A tolerance change between the revisions (dtypes.<d>.tol, models.<m>.tolerances,
diff.max_mismatch, a cell's verdict_mode or tolerance keys in its metrics) is printed, and a verdict
flip of a cell whose tolerance changed is labelled "(tolerance changed)".

A regression is a cell that passed in REV_A and does not in REV_B (FAIL, NOT_EXERCISED: the
precision asked for is no longer computed, or a status such as INFER_FAIL), or a cell that ran in
REV_A and no longer runs. PASS <-> BASELINE (a baseline cell named as such) is neither a regression
nor a fix. `--fail-on-regression` makes it the
exit code, so CI can gate on it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml
from dvc.exceptions import DvcException
from dvc.repo import Repo
from dvc.utils.serialize import ParseError

from parity.core import metrics, status
from parity.core.io import corrupt
from parity.core.ui import dump_json, table as ui_table

CELL_METRICS = metrics.CELL_METRICS_PATH
RAN = metrics.RAN
PASSING = status.PASSING  # PASS -> BASELINE is no regression; PASS -> NOT_EXERCISED is one


@dataclass
class Change:
    cell: str
    old: dict
    new: dict
    tolerance: bool = False  # a tolerance of this cell changed between the revisions

    def get(self, side: str, key: str):
        return (self.old if side == "old" else self.new).get(key)

    @property
    def verdicts(self) -> tuple[str | None, str | None]:
        return self.old.get("verdict"), self.new.get("verdict")

    @property
    def kind(self) -> str:
        a, b = self.verdicts
        if a is None:
            return "new"
        if b is None:
            return "removed"
        if a != b:
            return f"{a.lower()}->{b.lower()}" if a in RAN and b in RAN else f"{a}->{b}"
        return "changed" if self.old != self.new else "same"

    @property
    def regression(self) -> bool:
        a, b = self.verdicts
        return (a in PASSING and b not in PASSING and b is not None) or (a in RAN and b is not None and b not in RAN)

    @property
    def fixed(self) -> bool:
        a, b = self.verdicts
        return a is not None and a not in PASSING and b in PASSING


class MetricsUnavailable(RuntimeError):
    """A revision's cell metrics cannot be loaded (not in the local cache, or not produced)."""


WORKSPACE = "workspace"
TOLERANCE_PARAM = re.compile(r"^(dtypes\.[^.]+\.(tol\.|mode$)|models\.[^.]+\.tolerances|diff\.max_mismatch$)")
# a cell's own verdict settings in its metrics.json (verdict_mode, atol/rtol keys): not tol_ratio,
# which is a measurement (error / tolerance)
TOLERANCE_METRIC = re.compile(r"^(verdict_mode|(.*\.)?(atol|rtol))$|^(tol|tolerance)\.")


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _first_line(e) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


def _locked_outputs(rev: str, root: str) -> dict[str, str | None]:
    """{path: md5} of the outputs recorded in dvc.lock at `rev` (what DVC can restore from a cache)."""
    p = subprocess.run(["git", "show", f"{rev}:./dvc.lock"], cwd=root, capture_output=True, text=True)
    lock = (yaml.safe_load(p.stdout) or {}) if p.returncode == 0 else {}
    return {o["path"]: o.get("md5") for st in (lock.get("stages") or {}).values()
            for o in (st.get("outs") or []) if isinstance(o, dict) and "path" in o}


def _in_local_remote(url: str | None, md5s: list) -> bool | None:
    """Whether a directory remote (no scheme) holds every object; None when that cannot be told
    without the network (a cloud or SSH remote, no md5 recorded)."""
    if not url or "://" in url or not all(md5s):
        return None
    base = Path(url)
    return all((base / "files" / "md5" / m[:2] / m[2:]).exists() for m in md5s)


def _not_cached(rev: str, some: str, missing: list, locked: dict, remote: str | None, url: str | None) -> str:
    """What is true of a revision whose metrics this clone lacks (issue 36 item 9: the hint to fetch every
    commit walked 527 commits for > 10 min where no remote held them, and `dvc metrics diff REV` shows
    '-' for every value of REV for the same reason). Never suggests --all-commits."""
    held = _in_local_remote(url, [locked.get(path) for path, _ in missing if path in locked])
    own_run = ("run the pipeline here and commit its results (`make run`, then `git commit dvc.lock env/dvc.lock`), "
               "then compare against that commit")
    dash = f"`dvc metrics diff {rev}` shows '-' for every value of {rev} for the same reason"
    head = f"metrics of {rev} are not in the local cache ({some})"
    if remote is None:
        return (f"{head} and no DVC remote is configured to fetch them from: its dvc.lock records outputs made "
                f"on another machine. To compare, {own_run} ({dash})")
    if held is False:
        return (f"{head} nor in the remote '{remote}' ({url}): they were made on another machine and never "
                f"pushed where this clone can reach. To compare, {own_run} ({dash})")
    return (f"{head}: if they were pushed to the remote '{remote}', `git checkout {rev}` then `dvc fetch -r "
            f"{remote}` fetches that commit's outputs; otherwise {own_run} ({dash})")


def _cells_of(rev: str, res: dict) -> tuple[dict, list[str] | None]:
    """From one revision of `dvc metrics show`: ({cell: its file result} already there (revisions from
    before parity.core.metrics' layout, when every cell's metrics.json was a DVC metric), the cells its
    summary.json names (None when it has none))."""
    if res.get("error"):
        raise RuntimeError(f"cannot read revision '{rev}': {_first_line(res['error'])}")
    cells, named = {}, None
    for path, d in sorted((res.get("data") or {}).items()):
        path = path.replace("\\", "/")
        m = CELL_METRICS.match(path)
        if m:
            cells[m.group("cell")] = d
        elif path.endswith("/" + metrics.SUMMARY):
            if "error" in d:
                cells[path] = d  # not loadable: reported with the cells below
            else:
                named = sorted(metrics.cells_of(d.get("data") or {}))
    return cells, named


def _rev_metrics(rev: str, files: dict, root: str, remote: str | None, url: str | None = None) -> dict:
    """{cell: flat metrics} from {cell (or a path): DVC file result}; MetricsUnavailable when its cell
    metrics cannot be loaded or it has none."""
    cells, missing = {}, []
    for cell, d in sorted(files.items()):
        path = cell if "/" in cell else metrics.cell_path(cell)
        if "error" in d and _corrupt(d["error"]):
            raise MetricsUnavailable(_corrupt_message(rev, path, d["error"]))
        if "error" in d:
            missing.append((path, path if "/" in cell else cell))  # a summary.json: its path, not "report"
        else:
            cells[cell] = _flatten(d.get("data") or {})
    if missing:
        some = ", ".join(c for _, c in missing[:3]) + (f", ... ({len(missing)} files)" if len(missing) > 3 else "")
        if rev == WORKSPACE:
            raise MetricsUnavailable(f"metrics of the workspace are missing ({some}): run the pipeline "
                                     f"(`dvc repro` or `parity repro`), or give a second revision")
        locked = _locked_outputs(rev, root)
        if not any(path in locked for path, _ in missing):
            raise MetricsUnavailable(f"no cell metrics at {rev} ({some}): its dvc.lock records no diff "
                                     f"results (the pipeline was not run and committed there)")
        raise MetricsUnavailable(_not_cached(rev, some, missing, locked, remote, url))
    if not cells:
        raise MetricsUnavailable(f"no cell metrics at {rev} (artifacts/diff/*/metrics.json): it declares "
                                 f"no diff stage")
    return cells


def _corrupt(err) -> bool:
    """A metrics file DVC found but could not parse (not a missing one)."""
    return isinstance(err, ParseError)


def _corrupt_message(rev: str, path: str, err) -> str:
    if rev != WORKSPACE:
        return (f"corrupt: {path} at {rev}: {_first_line(err.__cause__ or err)}; the cached copy does not "
                f"parse: remove it from the cache and re-fetch it (`git checkout {rev}`, then "
                f"`dvc fetch -r <remote>`), or re-run that revision's pipeline")
    try:  # the parser's own words (DVC's error says only "structure is corrupted")
        json.loads(Path(path).read_text())
    except (ValueError, OSError) as e:
        return str(corrupt(path, e))
    return str(corrupt(path, err))


def _dvc_repo(cwd: str):
    return Repo(cwd)


def _shown(shown: dict, rev: str) -> dict:
    # DVC keys its result by the names given, comma-joined when several name one commit
    key = next((k for k in shown if rev in k.split(",")), None)
    if key is None:
        raise RuntimeError(f"unknown revision '{rev}' (git cannot resolve it)")
    return shown[key]


def load_metrics(rev_a: str, rev_b: str | None = None, cwd: str = ".") -> tuple[dict, dict]:
    """({cell: metrics} at rev_a, the same at rev_b or the workspace). The cells are those the
    revision's summary.json names (the DVC metric); each cell's metrics.json is read at that
    revision as a `dvc metrics show` target (a plain output since parity.core.metrics' layout)."""
    rev_b = rev_b or WORKSPACE
    out = []
    try:
        with _dvc_repo(cwd) as repo:
            shown = repo.metrics.show(revs=[rev_a, rev_b], hide_workspace=rev_b != WORKSPACE)
            root, remote = repo.root_dir, repo.config["core"].get("remote")
            url = (repo.config.get("remote") or {}).get(remote, {}).get("url") if remote else None
            for rev in (rev_a, rev_b):  # a summary.json that does not parse: said first, whatever else
                for path, d in (_shown(shown, rev).get("data") or {}).items():
                    if "error" in d and _corrupt(d["error"]):
                        raise MetricsUnavailable(_corrupt_message(rev, path, d["error"]))
            for rev in (rev_a, rev_b):
                files, named = _cells_of(rev, _shown(shown, rev))
                if named:
                    res = _shown(repo.metrics.show(targets=[metrics.cell_path(c) for c in named], revs=[rev],
                                                   hide_workspace=rev != WORKSPACE), rev)
                    for p, d in (res.get("data") or {}).items():
                        m = CELL_METRICS.match(p.replace("\\", "/"))
                        if m:
                            files[m.group("cell")] = d
                out.append(_rev_metrics(rev, files, root, remote, url))
    except DvcException as e:
        raise RuntimeError(f"dvc metrics of {rev_a}, {rev_b}: {_first_line(e)}") from None
    return out[0], out[1]


def tolerance_changes(rev_a: str, rev_b: str | None = None, cwd: str = ".") -> dict:
    """{param key: (old, new)} of the params that decide verdicts, changed between the revisions."""
    with _dvc_repo(cwd) as repo:
        d = repo.params.diff(a_rev=rev_a, b_rev=rev_b or WORKSPACE)
    out = {}
    for _file, params in ((d or {}).get("diff") or {}).items():
        for key, v in params.items():
            if TOLERANCE_PARAM.match(key):
                out[key] = (v.get("old"), v.get("new"))
    return dict(sorted(out.items()))


def changes(old: dict, new: dict) -> list[Change]:
    return [Change(cell, old.get(cell, {}), new.get(cell, {})) for cell in sorted(set(old) | set(new))]


def tolerance_moved(c: Change, params: dict) -> list[str]:
    """Why this cell's verdict may have moved without its numbers moving: the tolerance params of
    its dtype and model that changed, and its own tolerance/verdict-mode metrics that changed."""
    model, dtype, _ = (c.cell.split("-") + ["", "", ""])[:3]
    why = [k for k in params if k.startswith((f"dtypes.{dtype}.", f"models.{model}.", "diff."))]
    why += [k for k in sorted(set(c.old) | set(c.new))
            if TOLERANCE_METRIC.match(k) and c.old.get(k) != c.new.get(k) and c.old and c.new]
    return why


def _num(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, (int, float)):
        return f"{v:.4e}"  # 5 significant digits: fp32 errors (1e-7 .. 1e-4) stay readable
    return str(v)


def _pair(c: Change, key: str, num: bool = False) -> str:
    a, b = c.get("old", key), c.get("new", key)
    fa, fb = (_num(a), _num(b)) if num else (str(a if a is not None else "-"), str(b if b is not None else "-"))
    return fa if fa == fb else f"{fa} -> {fb}"


HEAD = ["cell", "change", "verdict", "drift origin", "worst layer", "output max_abs", "output rel_l2"]


def table_rows(rows: list[Change]) -> list[list[str]]:
    return [[c.cell, c.kind + (" REGRESSION" if c.regression else "")
             + (" (tolerance changed)" if c.tolerance and c.verdicts[0] != c.verdicts[1] else ""), _pair(c, "verdict"),
             _pair(c, "drift_origin"), _pair(c, "worst_layer"), _pair(c, "output.max_abs", True),
             _pair(c, "output.rel_l2", True)] for c in rows]


def select(cells: dict, providers=(), models=()) -> dict:
    """Only the cells of these providers/models (empty: all). A cell is model-dtype-provider; model
    and dtype names hold no '-' (conf option names are [A-Za-z0-9_])."""
    def keep(cell: str) -> bool:
        model, _, provider = (cell.split("-", 2) + ["", ""])[:3]
        return (not providers or provider in providers) and (not models or model in models)
    return {c: m for c, m in cells.items() if keep(c)}


def _check_filter(kind: str, wanted, cells: list[str], pos: int) -> None:
    have = sorted({(c.split("-", 2) + ["", ""])[pos] for c in cells})
    bad = [w for w in wanted if w not in have]
    if bad:
        raise RuntimeError(f"unknown {kind} {', '.join(map(repr, bad))}: the revisions' cells have {', '.join(have)}")


def evidence(m: dict) -> str | None:
    """Why a (flattened) cell metrics is NOT_EXERCISED or BASELINE (parity.core.oracle.precision)."""
    if m.get("verdict") == status.Status.NOT_EXERCISED:
        return m.get("precision.evidence")
    if m.get("verdict") == status.Status.BASELINE:
        return m.get("baseline")
    return None


def _cell_json(c: Change) -> dict:
    side = lambda d: None if not d else {  # noqa: E731
        "verdict": d.get("verdict"), "drift_origin": d.get("drift_origin"), "worst_layer": d.get("worst_layer"),
        "output_max_abs": d.get("output.max_abs"), "output_rel_l2": d.get("output.rel_l2"),
        "precision_rounded": d.get("precision.rounded"), "precision_layers": d.get("precision.layers"),
        "evidence": evidence(d)}
    return {"cell": c.cell, "change": c.kind, "regression": c.regression, "fixed": c.fixed,
            "tolerance_changed": c.tolerance, "old": side(c.old), "new": side(c.new)}


def document(rev_a: str, rev_b: str | None, cs: list[Change], params: dict) -> dict:
    """The --json document of a comparison (docs/cli-json.md "compare")."""
    return {
        "rev_a": rev_a, "rev_b": rev_b or WORKSPACE,
        "tolerance_changes": [{"key": k, "old": a, "new": b} for k, (a, b) in params.items()],
        "cells": [_cell_json(c) for c in cs],
        "counts": {"cells": len(cs), "regressed": sum(c.regression for c in cs), "fixed": sum(c.fixed for c in cs),
                   "changed": sum(c.kind == "changed" for c in cs), "new": sum(c.kind == "new" for c in cs),
                   "removed": sum(c.kind == "removed" for c in cs), "unchanged": sum(c.kind == "same" for c in cs)},
        "regressions": [c.cell for c in cs if c.regression],
    }


def _fmt(v) -> str:
    return "-" if v is None else str(v)


def compare(rev_a: str, rev_b: str | None = None, show_all: bool = False, fail_on_regression: bool = False,
            cwd: str = ".", out=sys.stdout, as_json: bool = False, providers=(), models=()) -> int:
    """Print the per-cell changes (or the JSON document); 1 on a regression with fail_on_regression.
    providers/models: only those cells. Raises MetricsUnavailable / RuntimeError (the CLI exits 2)
    when a revision's metrics cannot be read or a filter names no cell."""
    old, new = load_metrics(rev_a, rev_b, cwd)
    if providers or models:
        every = sorted(set(old) | set(new))
        _check_filter("provider", providers, every, 2)
        _check_filter("model", models, every, 0)
        old, new = select(old, providers, models), select(new, providers, models)
    params = tolerance_changes(rev_a, rev_b, cwd)
    cs = changes(old, new)
    for c in cs:
        c.tolerance = bool(tolerance_moved(c, params))
    reg = [c for c in cs if c.regression]
    if as_json:
        dump_json(document(rev_a, rev_b, cs, params), out)
    else:
        _print(rev_a, rev_b, cs, params, show_all, out)
    if reg and fail_on_regression:
        print(f"parity compare: regression in {', '.join(c.cell for c in reg)}", file=sys.stderr)
        return 1
    return 0


def _print(rev_a: str, rev_b: str | None, cs: list[Change], params: dict, show_all: bool, out) -> None:
    label = f"{rev_a}..{rev_b or WORKSPACE}"
    for key, (a, b) in params.items():
        print(f"tolerance changed: {key} {_fmt(a)} -> {_fmt(b)}", file=out)
    for c in cs:
        for k in tolerance_moved(c, {}):
            print(f"tolerance changed: {c.cell} {k} {_fmt(c.old.get(k))} -> {_fmt(c.new.get(k))}", file=out)
    moved = [c for c in cs if c.kind != "same"]
    if not moved:
        print(f"parity compare {label}: nothing changed ({len(cs)} cells, identical metrics)", file=out)
        return
    if params:
        print(file=out)
    ui_table(HEAD, table_rows(cs if show_all else moved), out)
    for c in cs if show_all else moved:
        why = evidence(c.new)
        if why:
            print(f"{c.cell}: {c.verdicts[1]}: {why}", file=out)
    print(f"\nparity compare {label}: {len(cs)} cells, {sum(c.regression for c in cs)} regressed, "
          f"{sum(c.fixed for c in cs)} fixed, {sum(c.kind == 'changed' for c in cs)} with moved metrics, "
          f"{sum(c.kind == 'new' for c in cs)} new, {sum(c.kind == 'removed' for c in cs)} removed, "
          f"{sum(c.kind == 'same' for c in cs)} unchanged", file=out)
