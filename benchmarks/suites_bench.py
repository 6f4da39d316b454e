"""Throughput of the critical suite: isolated worker pool vs a plain in-process loop.

    python benchmarks/suites_bench.py [--suite critical] [--provider torch_cpu] [--dtype float16] [--runs 3]

Both sides run the same cases through parity.suites.execute.run_case (reference + provider +
gradients). The plain loop imports torch once and loops; the pool pays worker start-up (imports)
once and pickles every case's arrays back. Prints cases/s (median of --runs) and the isolation
overhead as a ratio (plain cases/s / pool cases/s), with and without worker start-up.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from parity.suites import execute, pool, spec  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="critical")
    ap.add_argument("--provider", default="torch_cpu")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    cases = spec.expand(a.suite)

    prov = yaml.safe_load(Path(f"conf/providers/{a.provider}.yaml").read_text())[a.provider]
    cell = {"provider": a.provider, "runner": prov["runner"], "import": prov.get("import"),
            "options": prov.get("options") or {}, "torch_dtype": a.dtype, "seed": 0, "repeats": 3,
            "threads": 1, "onnx_opset": 17, "grad": True}
    n = len(cases)
    pooled, pooled_cold, first_pass = [], [], []
    for _ in range(a.runs):
        t0 = time.perf_counter()
        with pool.Pool(a.workers, threads=1) as p:
            p.run(cases[:1], cell, 60.0)  # start-up + first case
            t1 = time.perf_counter()
            res = p.run(cases, cell, 60.0)
            t2 = time.perf_counter()
            p.run(cases, cell, 60.0)  # second pass: every kernel already used once in its worker
            t3 = time.perf_counter()
        pooled.append(n / (t3 - t2))
        first_pass.append(n / (t2 - t1))
        pooled_cold.append(n / (t2 - t0))  # start-up + first pass
        assert all(r["status"] == "OK" for r in res), [r["status"] for r in res]

    torch.set_num_threads(1)

    t0 = time.perf_counter()
    for c in cases:
        execute.run_case(c, cell)
    plain_first = n / (time.perf_counter() - t0)  # first use of every kernel in this process
    plain = []
    for _ in range(a.runs):
        t0 = time.perf_counter()
        for c in cases:
            execute.run_case(c, cell)
        plain.append(n / (time.perf_counter() - t0))
    mp, mc, ml = statistics.median(pooled), statistics.median(pooled_cold), statistics.median(plain)
    print(f"suite {a.suite}: {n} cases, {a.provider} {a.dtype}, {a.workers} workers x 1 thread, median of {a.runs}")
    print(f"  plain loop, one process (1 thread):   {ml:7.1f} cases/s  ({1000 / ml:.1f} ms/case)")
    print(f"  plain loop, first pass (cold kernels): {plain_first:7.1f} cases/s")
    print(f"  isolated pool, first pass:            {statistics.median(first_pass):7.1f} cases/s")
    print(f"  isolated pool, warm workers:          {mp:7.1f} cases/s  ({1000 / mp:.1f} ms/case)")
    print(f"  isolated pool incl. worker start-up:  {mc:7.1f} cases/s  ({1000 / mc:.1f} ms/case)")
    print(f"  isolation overhead (plain / pool):    warm {ml / mp:.2f}x, with start-up {ml / mc:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
