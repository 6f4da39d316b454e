"""Fuzz campaign throughput: `parity fuzz`'s campaign over a suite, N runs per provider (whole
campaigns, worker start-up included), median cases/s, load average around each run, and whether
every run found the same failures (same ids, same statuses).

    .venv/bin/python benchmarks/fuzz_bench.py --suite critical --dtype fp16 --cases 2000 --runs 3 \
        --providers torch_cpu ort_cpu --out /tmp/fuzz_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from parity.commands import fuzz_cli  # noqa: E402
from parity.analysis import fuzz_campaign as fc  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="critical")
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--providers", nargs="+", default=["torch_cpu", "ort_cpu"])
    ap.add_argument("--out", default="/tmp/fuzz_bench.json")
    a = ap.parse_args()
    suite, section = fuzz_cli.load_suite(a.suite)
    res = {}
    for prov in a.providers:
        p = fuzz_cli.params_for(a.dtype, prov)
        runs = []
        for i in range(a.runs):
            load0 = os.getloadavg()[0]
            rows, fails, stats = fc.campaign(p, suite, section, a.dtype, prov,
                                             {"cases": a.cases, "seed": a.seed, "workers": a.workers})
            runs.append({"wall_s": stats["wall_s"], "cases_per_s": stats["cases_per_s"], "load": [load0, os.getloadavg()[0]],
                         "failures": [(r["id"], r["status"]) for r in fails], "crashes": stats["crashes"],
                         "timeouts": stats["timeouts"]})
            print(f"{prov} run {i + 1}: {stats['cases_per_s']:.1f} cases/s, {stats['wall_s']:.1f} s, "
                  f"{len(fails)} failures, load {load0:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
        same = all(r["failures"] == runs[0]["failures"] for r in runs)
        res[prov] = {"median_cases_per_s": statistics.median(r["cases_per_s"] for r in runs),
                     "median_wall_s": statistics.median(r["wall_s"] for r in runs), "same_failures": same,
                     "failures": len(runs[0]["failures"]), "runs": runs}
        print(f"{prov}: median {res[prov]['median_cases_per_s']:.1f} cases/s over {a.runs} runs of {a.cases}; "
              f"same failures every run: {same}", flush=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
