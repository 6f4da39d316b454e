"""Run fuzz campaigns, replay one case, minimise a failure (parity.analysis.fuzz makes the cases).
Light: cases run in the suite worker pool (parity.suites.pool: a crash costs one case, a hang its
limit) and are diffed with the suite diff (parity.suites.diff), so a fuzz case is judged exactly as
a suite case, with the suite's tolerances for its base case.

Artifacts of a campaign (write_campaign, deterministic: no timings):
  campaign.json     settings, counts per status and per base case, every case's row
                    (id, seed, status, reason, values, layout, dims)
  failures.parquet  one row per failure: id, base, seed, index, status, reason, max_abs, tol_ratio,
                    template (JSON: the case in suite terms) and case (JSON: the expanded case)
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import hashlib
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from parity.core import io, ui
from parity.config import schema
from parity.analysis import fuzz
from parity.suites import cells, diff, pool, spec

CHUNK = 100  # cases per pool.run call (bounds the outputs held in memory)


def cell_for(p: dict, dtype: str, provider: str) -> dict:
    """The worker cell, as a suite cell builds it (the provider's runner and options, suites_run
    settings), with one timed call per case (fuzzing reports no latency) and no float64 run (fuzz
    verdicts are the fixed tolerance's: parity.suites.execute `oracle`)."""
    return dict(cells.cell_of(p, dtype, provider), repeats=1, oracle=False)


def settings(p: dict) -> dict:
    """A campaign's settings: `fuzz:` (or a settings dict) less what selects the campaigns, defaults
    from parity.config.schema.Fuzz."""
    return schema.section(schema.Fuzz, p.get("fuzz")).settings()


def select(suite: str, section: dict, ops=None) -> list[dict]:
    """Fuzzable templates of a suite whose base id matches one of `ops` (fnmatch patterns; None:
    all); OpInfo cases are converted (parity.analysis.fuzz_opinfo, imports torch) when selected."""
    pats = [ops] if isinstance(ops, str) else (ops or ["*"])
    out = [t for t in fuzz.templates(suite, copy.deepcopy(section))
           if any(fnmatch.fnmatchcase(t["base"], q) for q in pats)]
    if any("opinfo" in t["case"] for t in out):
        # lazy: fuzz_opinfo loads torch (+1.84 s CPU, BENCHMARKS 22), needed for opinfo suites only
        from parity.analysis import fuzz_opinfo

        out = fuzz_opinfo.convert_all(out)
    return [t for t in out if fuzz.fuzzable(t)]


def _opts(f: dict) -> dict:
    return {k: f[k] for k in ("max_numel", "empty", "nonfinite")}


def judge(p: dict, suite: str, dtype: str, case: dict, res: dict) -> dict:
    """The suite diff's verdict on one result, with the tolerances of the case's base id."""
    base = (case.get("fuzz") or {}).get("base", case["id"])
    row = {"id": base, "label": case.get("label", ""), "kind": case.get("kind", ""), "status": res["status"],
           "reason": res.get("reason", ""), "outputs": [n for n, _ in res.get("outputs", [])],
           "gradcheck": res.get("gradcheck")}
    d = diff.diff_case(p, suite, dtype, row, dict(res.get("outputs", [])), dict(res.get("reference", [])))
    d["id"] = case["id"]
    return d


def digest(res: dict) -> str:
    """sha256 over the names, dtypes, shapes and bytes of a result's outputs and reference."""
    h = hashlib.sha256(res["status"].encode())
    for key in ("outputs", "reference"):
        for n, a in res.get(key, []):
            a = np.ascontiguousarray(a)
            h.update(f"{key}/{n}/{a.dtype.str}/{a.shape}".encode())
            h.update(a.tobytes())
    return h.hexdigest()[:16]


class _Tally:
    """Cases done and failed, shown by the one progress helper (parity.core.ui.Progress): a line
    (done/total, cases/s, failures) at most every `every` s and one at the end; a bar on a terminal."""

    def __init__(self, label: str, total: int, every: float = 2.0, stream=sys.stderr):
        self.label, self.failed, self.t0 = label, 0, time.monotonic()
        self.ui = ui.Progress(total, stream, label, every)

    def step(self, failed: bool) -> None:
        self.failed += int(failed)
        u = self.ui
        u.advance()
        text = (f"{self.label}: {u.done}/{u.total} cases, {u.done / max(self.wall, 1e-9):.1f} cases/s, "
                f"{self.failed} failures")
        u.line(text) if u.done == u.total else u.heartbeat(text)

    @property
    def wall(self) -> float:
        return time.monotonic() - self.t0


def campaign(p: dict, suite: str, section: dict, dtype: str, provider: str, f: dict | None = None,
             progress: bool = True) -> tuple[list[dict], list[dict], dict]:
    """(rows, failures, stats): f["cases"] cases round-robin over the suite's fuzzable cases (or
    f["ops"]), case k from seed fuzz.case_seed(f["seed"], k)."""
    f = settings({"fuzz": f or {}})
    p = dict(p, suites=dict(p.get("suites") or {}, **{suite: section}))
    tpls = select(suite, section, f["ops"])
    if not tpls:
        raise spec.SuiteError(suite, None, "ops", f"no case of suite {suite} matches {f['ops']!r}")
    cell = cell_for(p, dtype, provider)
    prog = _Tally(f"fuzz {suite} {dtype} {provider}", int(f["cases"]), every=2.0 if progress else 1e9)
    rows, failures = [], []
    with pool.Pool(int(f["workers"]), threads=cell["threads"]) as pl, contextlib.closing(prog.ui):
        for start in range(0, int(f["cases"]), CHUNK):
            batch = []
            for k in range(start, min(start + CHUNK, int(f["cases"]))):
                t = tpls[k % len(tpls)]
                m = fuzz.mutate(t, fuzz.case_seed(f["seed"], k), cell["torch_dtype"], _opts(f))
                try:
                    batch.append((k, m, fuzz.expand(m)))
                except spec.SuiteError as e:
                    rows.append(_row(k, m, {"status": "INVALID", "reason": f"expanding the fuzz case: {e}"}))
                    prog.step(False)
            cases = [c for _, _, c in batch]
            limits = [c["timeout_s"] or float(f["timeout_s"]) for c in cases]
            results = pl.run(cases, cell, limits) if cases else []
            for (k, m, c), res in zip(batch, results):
                d = judge(p, suite, dtype, c, res)
                row = _row(k, m, d)
                rows.append(row)
                bad = row["status"] in fuzz.FAIL_STATUSES
                if bad:
                    failures.append(dict(row, template=m, case=c))
                prog.step(bad)
        stats = {"wall_s": prog.wall, "cases_per_s": len(rows) / max(prog.wall, 1e-9), "restarts": pl.restarts,
                 "crashes": pl.crashes, "timeouts": pl.timeouts}
    rows.sort(key=lambda r: r["index"])
    failures.sort(key=lambda r: r["index"])
    return rows, failures, stats


def _row(k: int, m: dict, d: dict) -> dict:
    fz = m["fuzz"]
    return {"index": k, "id": m["case"]["id"], "base": fz["base"], "seed": fz["seed"], "status": d["status"],
            "reason": d.get("reason", ""), "max_abs": d.get("max_abs"), "tol_ratio": d.get("tol_ratio"),
            "values": fz["values"], "layout": fz["layout"], "dims": dict(m["spec"].get("dims") or {})}


def summary(suite: str, dtype: str, provider: str, f: dict, rows: list[dict]) -> dict:
    per = {}
    for r in rows:
        per.setdefault(r["base"], Counter())[r["status"]] += 1
    return {"suite": suite, "dtype": dtype, "provider": provider, "settings": settings({"fuzz": f}),
            "cases": len(rows), "counts": dict(sorted(Counter(r["status"] for r in rows).items())),
            "failures": sum(1 for r in rows if r["status"] in fuzz.FAIL_STATUSES),
            "per_case": {b: dict(sorted(c.items())) for b, c in sorted(per.items())}}


def write_campaign(out: Path, suite, dtype, provider, f, rows, failures) -> dict:
    s = summary(suite, dtype, provider, f, rows)
    cols = {"id": [], "base": [], "seed": [], "index": [], "status": [], "reason": [], "max_abs": [],
            "tol_ratio": [], "template": [], "case": []}
    for r in failures:
        for k in ("id", "base", "seed", "index", "status", "reason", "max_abs", "tol_ratio"):
            cols[k].append(r[k])
        cols["template"].append(io.dumps(r["template"]))
        cols["case"].append(io.dumps(r["case"]))
    schema = pa.schema([("id", pa.string()), ("base", pa.string()), ("seed", pa.int64()), ("index", pa.int64()),
                        ("status", pa.string()), ("reason", pa.string()), ("max_abs", pa.float64()),
                        ("tol_ratio", pa.float64()), ("template", pa.string()), ("case", pa.string())])
    table = pa.table(cols, schema=schema)
    with io.atomic_path(Path(out) / "failures.parquet", allow_empty=True) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    io.write_json(Path(out) / "campaign.json", dict(s, rows=rows), sort_keys=False)
    return s


# ------------------------------------------------------------------------------- replay, minimise
def find_case(ident: str, suite: str, section: dict, campaign_dir: Path | None, torch_dtype: str,
              f: dict) -> dict:
    """The fuzz template of a case id (<base>~s<seed>) or of a seed listed in a campaign."""
    rows = []
    if campaign_dir is not None and (Path(campaign_dir) / "campaign.json").exists():
        camp = io.read_json(Path(campaign_dir) / "campaign.json")
        rows = camp["rows"]  # the campaign's generator settings, so the id regenerates its case
        f = dict(f, **{k: camp["settings"][k] for k in ("max_numel", "empty", "nonfinite")})
    if "~s" not in ident and not ident.isdigit():  # a suite case as it stands (a known failure)
        tpls = select(suite, section, [ident])
        if not tpls or tpls[0]["base"] != ident:
            raise KeyError(f"no fuzzable case {ident!r} in suite {suite}")
        return dict(tpls[0], fuzz={"seed": None, "base": ident, "values": "normal", "layout": "contiguous"})
    if "~s" not in ident:
        hit = [r["id"] for r in rows if str(r["seed"]) == ident]
        if not hit:
            raise KeyError(f"seed {ident} is not in {campaign_dir}/campaign.json: give the case id "
                           f"(<case>~s<seed>) instead")
        ident = hit[0]
    base, seed = fuzz.parse_id(ident)
    tpls = {t["base"]: t for t in select(suite, section, [base])}
    if base not in tpls:
        known = sorted({t["base"] for t in fuzz.templates(suite, copy.deepcopy(section))})
        raise KeyError(f"no case {base!r} in suite {suite}. Cases: {', '.join(known) or 'none'}")
    return fuzz.mutate(tpls[base], seed, torch_dtype, _opts(settings({"fuzz": f})))


def run_one(pl: pool.Pool, p: dict, suite: str, dtype: str, provider: str, m: dict, timeout: float):
    """(result, verdict row) of one template on a pool."""
    p = dict(p)
    c = fuzz.expand(m)
    (res,) = pl.run([c], cell_for(p, dtype, provider), [c["timeout_s"] or timeout])
    return res, judge(p, suite, dtype, c, res)


def reproduce(p, suite, section, dtype, provider, m, repeat: int = 2, timeout: float = 30) -> list[tuple]:
    """Replay a case `repeat` times, each in a fresh worker: [(status, reason, digest, verdict)]."""
    p = dict(p, suites=dict(p.get("suites") or {}, **{suite: section}))
    out = []
    for _ in range(repeat):
        with pool.Pool(1) as pl:
            res, d = run_one(pl, p, suite, dtype, provider, m, timeout)
        out.append((d["status"], d.get("reason", ""), digest(res), d))
    return out


def minimise_case(p, suite, section, dtype, provider, m, timeout: float = 30, log=None):
    """(minimal template, status it keeps, candidates run): shrink while the status stays the same."""
    p = dict(p, suites=dict(p.get("suites") or {}, **{suite: section}))
    tpls = {t["base"]: t for t in select(suite, section, [m["fuzz"]["base"]])}
    with pool.Pool(1) as pl:
        _, d0 = run_one(pl, p, suite, dtype, provider, m, timeout)
        want = d0["status"]
        if want not in fuzz.FAIL_STATUSES:
            raise ValueError(f"{m['case']['id']} does not fail on {provider} {dtype} (status {want})")

        def fails(cand) -> bool:
            try:
                _, d = run_one(pl, p, suite, dtype, provider, cand, timeout)
            except spec.SuiteError:
                return False
            return d["status"] == want

        small, runs = fuzz.minimise(m, fails, tpls.get(m["fuzz"]["base"]), log)
    return small, want, runs
