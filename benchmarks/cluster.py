"""Issue 12: the same matrix with `parity repro --cluster` on a local Ray cluster vs `parity repro -j 2`
vs a sequential `dvc repro`, and what the cluster adds per cell (checkout + pull + push) vs the cell's
own `dvc repro`.

A scratch project (tests/conftest.py's make_repo: the project's files, the tests' tiny_mlp) in a temp
dir with a local directory DVC remote, and a Ray cluster of three one-CPU nodes on this machine (as
tests/test_cluster.py: the head advertises torch_cpu and ort_cpu, one node torch_compile, one ort_int8).
Each round makes every cell stale with new values of capture.warmup and diff.max_mismatch (committed:
the cluster runs the commit) and runs the three sides in turn; the run-caches are emptied first
(the driver's, the remote's and the nodes'), so every capture and diff really runs. Medians of
--runs rounds after one warm-up round; ratios are per round (same round), then summarized.

    .venv/bin/python benchmarks/cluster.py --runs 3 [--models tiny_mlp,mlp] [--providers ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from tests.conftest import BIN, env, make_repo  # noqa: E402

PHASE = re.compile(r"^parity: \d+/\d+\s+(\S+): .* on \S+: checkout ([\d.]+)s, pull ([\d.]+)s, run ([\d.]+)s, "
                   r"push ([\d.]+)s", re.M)


def timed(cmd: list[str], cwd: Path) -> tuple[float, str]:
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    dt = time.perf_counter() - t
    if r.returncode:
        sys.exit(f"bench: {' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-4000:]}")
    return dt, r.stdout


def stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="rounds run first and discarded (default 1)")
    ap.add_argument("--models", default="tiny_mlp,mlp")
    ap.add_argument("--dtypes", default="fp32,fp16")
    ap.add_argument("--providers", default="torch_cpu,ort_cpu,torch_compile,ort_int8")
    ap.add_argument("--json", help="write the raw figures here")
    a = ap.parse_args()
    from ray.cluster_utils import Cluster  # optional: Ray is the parity[cluster] extra

    tmp = Path(tempfile.mkdtemp(prefix="parity-cluster-bench-"))
    repo = make_repo(tmp / "repo", models=a.models.split(","), dtypes=a.dtypes.split(","),
                     providers=a.providers.split(","))
    (tmp / "remote").mkdir()
    repo.run(["dvc", "remote", "add", "-d", "--local", "store", str(tmp / "remote")])
    provs = a.providers.split(",")
    per_node = [[p for p in provs if p not in ("torch_compile", "ort_int8")],
                [p for p in provs if p == "torch_compile"], [p for p in provs if p == "ort_int8"]]
    per_node = [per_node[0]] + [n for n in per_node[1:] if n]
    node = dict(num_cpus=1, object_store_memory=80 * 2**20)
    work = [tmp / f"node{i}" for i in range(len(per_node))]
    args = [dict(node, resources={f"provider:{p}": 1.0 for p in ps}, env_vars={"PARITY_WORKDIR": str(w)})
            for ps, w in zip(per_node, work)]
    cl = Cluster(initialize_head=True, head_node_args=dict(args[0], include_dashboard=False))
    for x in args[1:]:
        cl.add_node(**x)
    params = repo.path / "params.yaml"
    original = params.read_text()
    n = [0]

    def stale() -> None:
        n[0] += 1
        params.write_text(original.replace("  warmup: 3\n", f"  warmup: {3 + n[0]}\n")
                          .replace("  max_mismatch: 0.0\n", f"  max_mismatch: {n[0]}.0e-12\n"))
        for runs in [repo.path / ".dvc/cache/runs", tmp / "remote/runs",
                     *(w / "slot-0/.dvc/cache/runs" for w in work)]:
            shutil.rmtree(runs, ignore_errors=True)
        repo.commit(f"bench round {n[0]}")

    sides = {"dvc repro (sequential)": ["dvc", "repro"],
             "parity repro -j 2": [f"{BIN}/parity", "repro", "-j", "2"],
             "parity repro --cluster (3 nodes)": [f"{BIN}/parity", "repro", "--cluster", cl.address]}
    vals: dict[str, list[float]] = {k: [] for k in sides}
    phases: list[dict] = []
    load_before = os.getloadavg()
    try:
        stale()
        timed(["dvc", "repro"], repo.path)  # upstream (export, reference, baseline) once, outside the rounds
        for rnd in range(1 - a.warmup, a.runs + 1):
            for name, cmd in sides.items():
                stale()
                dt, out = timed(cmd, repo.path)
                if rnd > 0:
                    vals[name].append(dt)
                    if "--cluster" in cmd:
                        phases += [dict(cell=m[0], checkout=float(m[1]), pull=float(m[2]), run=float(m[3]),
                                        push=float(m[4])) for m in PHASE.findall(out)]
                print(f"bench: round {rnd}{' (warm-up)' if rnd <= 0 else ''}: {name}: {dt:.1f}s", flush=True)
    finally:
        cl.shutdown()
    load_after = os.getloadavg()
    base = vals["dvc repro (sequential)"]
    res = {k: dict(stats(v), ratio=stats([x / y for x, y in zip(v, base)])) for k, v in vals.items()}
    res["cluster vs -j 2"] = stats([x / y for x, y in zip(vals["parity repro --cluster (3 nodes)"],
                                                          vals["parity repro -j 2"])])
    over = [(p["checkout"] + p["pull"] + p["push"]) for p in phases]
    res["per cell"] = {k: stats([p[k] for p in phases]) for k in ("checkout", "pull", "run", "push")}
    res["per cell"]["overhead (checkout+pull+push)"] = stats(over)
    res["per cell"]["overhead / run"] = stats([o / p["run"] for o, p in zip(over, phases)])
    res["load"] = {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in load_after]}
    res["cells"] = len(phases) // max(a.runs, 1)
    for k in sides:
        s = res[k]
        print(f"{k:34} median {s['median']:7.1f}s [{s['min']:.1f}-{s['max']:.1f}]  "
              f"x sequential {s['ratio']['median']:.2f} [{s['ratio']['min']:.2f}-{s['ratio']['max']:.2f}]")
    c = res["cluster vs -j 2"]
    print(f"{'cluster / -j 2':34} {c['median']:.2f} [{c['min']:.2f}-{c['max']:.2f}]")
    for k, s in res["per cell"].items():
        unit = "x" if "/" in k else "s"
        print(f"per cell {k:30} median {s['median']:.2f}{unit} [{s['min']:.2f}-{s['max']:.2f}]")
    print(f"load average before {res['load']['before']}, after {res['load']['after']}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
