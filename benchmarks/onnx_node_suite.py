"""Every ONNX backend node test of the installed onnx as the `import-onnx` suite, on one provider and
dtype, through the suite stages' own code (parity.pipeline.suite_run.run_cell in its worker pool, the
tensor store round trip, parity.suites.diff.diff_case) without DVC. Prints the counts per status, the
non-OK cases grouped by reason, the share accepted, and (with --compare-fp32 at a dtype other than
fp32) which ops really ran at that dtype.

    .venv/bin/python benchmarks/onnx_node_suite.py [--dtype fp32] [--only 'test_conv*' ...] \
        [--work /tmp/onnx_node_suite] [--json out.json] [--workers 2]
    .venv/bin/python benchmarks/onnx_node_suite.py --dvc --dtype fp16   # the same through DVC

The tests are written once under WORK/data/onnx/node/ (parity.suites.onnximport.write_tests) and
reused. Figures: BENCHMARKS.md ("ONNX node tests as a suite").
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from parity.core import store  # noqa: E402
from parity.pipeline import suite_run  # noqa: E402
from parity.suites import coverage, diff, onnximport  # noqa: E402
from tests.conftest import BIN, make_repo  # noqa: E402


def tests(work: Path, only: list[str]) -> dict:
    """The suite section of the node tests under work/data/onnx/node (written on first use)."""
    data = work / "data" / "onnx" / "node"
    if not data.is_dir():
        tmp = data.with_name("node.tmp")
        tmp.mkdir(parents=True)
        onnximport.write_tests(tmp, [])
        tmp.rename(data)
    names = sorted(d.name for d in data.iterdir() if (d / "model.onnx").is_file())
    if only:
        names = [n for n in names if any(fnmatch.fnmatchcase(n, g) for g in only)]
    os.chdir(work)  # suite paths are relative to the repository root: here, work
    doc = onnximport.suite_doc("node", Path("data/onnx/node"), names)
    return doc["node"]


def measure(work: Path, section: dict, dtype: str, provider: str, workers: int) -> tuple[list[dict], dict]:
    """(diff rows, {case id: {tensor name: provider output}}) of one cell, as the suite stages judge it."""
    p = yaml.safe_load((ROOT / "params.yaml").read_text())
    p["suites"] = {"node": section}
    (work / "conf" / "suites").mkdir(parents=True, exist_ok=True)
    rows, outs, refs, _timing, _stats = suite_run.run_cell(p, "node", dtype, provider, workers=workers)
    got: dict[str, dict] = {}
    want: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(dir=work) as td:  # the store round trip the stages make
        for ts, dst, f in ((outs, got, "o.parquet"), (refs, want, "r.parquet")):
            store.write(Path(td) / f, ts)
            for t in store.read(Path(td) / f):
                cid, _, name = t.name.partition("/")
                dst.setdefault(cid, {})[name] = t.array
    judged = [diff.diff_case(p, "node", dtype, r, got.get(r["id"], {}), want.get(r["id"], {})) for r in rows]
    return judged, got


def reason_key(r: dict) -> str:
    """A reason with its case-specific parts (names, numbers, paths) blurred, to group cases."""
    s = re.sub(r"'[^']*'", "'…'", r["reason"])
    s = re.sub(r"\b\d+(\.\d+)?(e[-+]?\d+)?\b", "N", s)
    s = re.sub(r"\S*/\S*", "…", s)
    return f"{r['status']}: {s[:150]}"


RUNTIME_LIMITS = ("SKIPPED", "UNSUPPORTED", "UNAVAILABLE")  # the runtime's own limit, with its reason


def report(rows: list[dict], dtype: str) -> dict:
    counts = Counter(r["status"] for r in rows)
    n, ok = len(rows), counts.get("OK", 0)
    limits = sum(counts.get(s, 0) for s in RUNTIME_LIMITS)
    ran = n - limits  # loaded and run by the runtime: OK, MISMATCH, NAN_*, INFER_FAIL, CRASH, TIMEOUT
    print(f"{n} node tests at {dtype}: " + ", ".join(f"{k} {v}" for k, v in counts.most_common()))
    print(f"OK / loaded and run: {ok}/{ran} = {ok / max(ran, 1):.1%}; OK / not SKIPPED: "
          f"{ok}/{n - counts.get('SKIPPED', 0)} = {ok / max(n - counts.get('SKIPPED', 0), 1):.1%}; "
          f"OK or the runtime's own limit with its reason ({'/'.join(RUNTIME_LIMITS)}): "
          f"{ok + limits}/{n} = {(ok + limits) / n:.1%}; OK / all: {ok / n:.1%}")
    groups: dict[str, list[str]] = {}
    for r in rows:
        if r["status"] != "OK":
            groups.setdefault(reason_key(r), []).append(r["id"])
    for k, ids in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        print(f"  {len(ids):4d}  {k}\n        e.g. {', '.join(ids[:4])}")
    return {"counts": dict(counts), "ran": ran, "ok": ok, "runtime_limits": limits,
            "groups": {k: ids for k, ids in groups.items()}}


def precision(rows: list[dict], dtype: str) -> dict:
    """Per op: the ONNX cases that ran at `dtype` with float outputs, and how many computed at it
    (parity.suites.onnxcase.exercised)."""
    ops: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("exercised") and r["status"] in ("OK", "MISMATCH"):
            ops.setdefault(r["label"].removeprefix("onnx::"), []).append(r)
    kinds = Counter(r["exercised"]["evidence"].split(":")[0].split(" (")[0] for rs in ops.values() for r in rs)
    def n(rs, v):
        return sum(r["exercised"]["exercised"] is v for r in rs)

    yes = sorted(op for op, rs in ops.items() if n(rs, True) == len(rs))
    no = sorted(op for op, rs in ops.items() if n(rs, False) == len(rs))
    unsure = sorted(op for op, rs in ops.items() if n(rs, None) == len(rs))
    some = sorted(f"{op} ({n(rs, True)}/{n(rs, False)}/{n(rs, None)})" for op, rs in ops.items()
                  if op not in yes + no + unsure)
    print(f"\n{dtype}: {sum(map(len, ops.values()))} cases with float outputs ran, {len(ops)} ops; evidence: "
          + ", ".join(f"{k} {v}" for k, v in kinds.most_common()))
    print(f"  computed at {dtype} in every case ({len(yes)}): {' '.join(yes)}")
    print(f"  fp32 kernels in every case ({len(no)}): {' '.join(no)}")
    print(f"  cannot tell (only the storage rounding shows) ({len(unsure)}): {' '.join(unsure)}")
    print(f"  mixed (computed/fp32/cannot tell) ({len(some)}): {' '.join(some)}")
    return {"computed": yes, "fp32": no, "cannot_tell": unsure, "mixed": some, "evidence": dict(kinds)}


def matrix(work: Path, rows: list[dict], dtype: str, provider: str) -> None:
    """The suite coverage matrix (parity.suites.coverage, a row per op) over the cells measured so far
    in `work`: WORK/diff/<dtype>-<provider>/results.json, WORK/coverage.{json,csv}."""
    d = work / "diff" / f"{dtype}-{provider}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "results.json").write_text(json.dumps({"cases": rows}, default=str))
    cells = [(dt, provider) for dt in ("fp32", "fp16", "bf16") if (work / "diff" / f"{dt}-{provider}").is_dir()]
    cov = coverage.build("node", cells, work / "diff")
    (work / "coverage.json").write_text(json.dumps(cov, indent=1, default=str))
    (work / "coverage.csv").write_text(coverage.to_csv(cov))
    print(f"\ncoverage matrix: {len(cov['ops'])} op rows x {cov['columns']} -> {work}/coverage.json, coverage.csv")


def through_dvc(work: Path, dtypes: list[str], provider: str) -> None:
    """The same through DVC: a scratch repository (tests/conftest.make_repo), `parity suite
    import-onnx` (every node test), then `dvc repro suite_coverage@onnx_node`; prints each cell's counts."""
    shutil.rmtree(work / "dvc", ignore_errors=True)
    r = make_repo(work / "dvc", dtypes=tuple(dtypes), providers=(provider,), compose=False)
    t0 = time.monotonic()
    print(r.run([f"{BIN}/parity", "suite", "import-onnx"]).stdout.strip(), f"({time.monotonic() - t0:.0f} s)")
    r.edit("conf/config.yaml", "  - suites: []", "  - suites: [onnx_node]")
    r.run([f"{BIN}/parity", "compose"])
    r.commit("onnx node tests")
    t0 = time.monotonic()
    ran = r.repro("suite_coverage@onnx_node")
    print(f"{len(ran)} stages ({time.monotonic() - t0:.0f} s)")
    a = r.path / "artifacts" / "suites"
    for dt in dtypes:
        cases = json.loads((a / "diff" / "onnx_node" / f"{dt}-{provider}" / "results.json").read_text())["cases"]
        print(f"{dt}-{provider}: {len(cases)} cases: {dict(Counter(c['status'] for c in cases).most_common())}")
    cov = json.loads((a / "coverage" / "onnx_node.json").read_text())
    print(f"coverage: {len(cov['ops'])} op rows x {cov['columns']} ({a}/coverage/onnx_node.json)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--provider", default="ort_cpu")
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--work", default="/tmp/onnx_node_suite")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--dvc", action="store_true", help="through DVC instead: import-onnx + suite_coverage "
                                                       "at fp32 and --dtype in a scratch repository")
    a = ap.parse_args()
    work = Path(a.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    if a.dvc:
        through_dvc(work, sorted({"fp32", a.dtype}, key=lambda d: d != "fp32"), a.provider)
        return 0
    section = tests(work, a.only)
    t0 = time.monotonic()
    rows, _ = measure(work, section, a.dtype, a.provider, a.workers)
    print(f"({time.monotonic() - t0:.0f} s)")
    out = report(rows, a.dtype)
    if a.dtype != "fp32":
        out["precision"] = precision(rows, a.dtype)
    matrix(work, rows, a.dtype, a.provider)
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, **out}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
