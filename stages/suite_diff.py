"""suite_diff@suite-dtype-provider: per-case verdicts of a suite cell (parity.suites.diff): the fp64
oracle on the run's float64 values, or a fixed tolerance against its fp32 reference. Reads the run stage's outputs and the suite's tolerances only, so a tolerance
change re-runs only this suite's diffs. Writes results.json (per case) and metrics.json (counts).
numpy only.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from parity.config import params as config, schema
from parity.core import store
from parity.core.io import read_json, write_json
from parity.suites import diff, spec


def diff_cell(p: dict, suite: str, dtype: str, run_dir: Path) -> list[dict]:
    run = read_json(run_dir / "results.json")
    got: dict[str, dict] = {}  # file stem -> case id -> tensor name -> array
    for stem in ("outputs", "reference", "gold", "floor"):  # gold, floor: the fp64 oracle's (absent before)
        f = run_dir / f"{stem}.parquet"
        for t in store.read(f) if f.exists() else ():
            cid, _, name = t.name.partition("/")
            got.setdefault(stem, {}).setdefault(cid, {})[name] = t.array
    by = {stem: got.get(stem, {}) for stem in ("outputs", "reference", "gold", "floor")}
    rule = schema.suite_rule(p, suite, dtype)  # the config: resolved once for the cell's cases
    return [diff.diff_case(p, suite, dtype, row, by["outputs"].get(row["id"], {}), by["reference"].get(row["id"], {}),
                           gold=by["gold"].get(row["id"]), floor=by["floor"].get(row["id"]), rule=rule)
            for row in run["cases"]]


def main(argv=None) -> int:
    ap = config.stage_parser("stages.suite_diff", __doc__)
    for k in ("suite", "dtype", "provider", "run", "out"):
        ap.add_argument(f"--{k}", required=True)
    a = ap.parse_args(argv)
    p = spec.load_or_die(a.params)  # and the selected suites checked
    rows = diff_cell(p, a.suite, a.dtype, Path(a.run))
    out = Path(a.out)
    summary = diff.summarize(rows)
    write_json(out / "results.json", {"suite": a.suite, "dtype": a.dtype, "provider": a.provider, "cases": rows},
               sort_keys=False)
    write_json(out / "metrics.json", summary)
    c = Counter(r["status"] for r in rows)
    print(f"suite_diff@{a.suite}-{a.dtype}-{a.provider}: {len(rows)} cases: "
          + ", ".join(f"{s}={c[s]}" for s in diff.STATUS_ORDER if c[s]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
