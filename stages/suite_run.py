"""suite_run@suite-dtype-provider: run every case of a suite on one provider at one dtype, in a pool
of isolated long-lived workers (parity.suites.pool), next to its fp32 reference.

Writes, under --out: outputs.parquet (every case's provider outputs and gradients, named
`<case>/<tensor>`), reference.parquet (the same names from the fp32 reference on the dtype-rounded
inputs), results.json (one row per case: status, reason, ONNX ops, gradcheck); --timing gets the
latencies (measured, so kept apart: no diff reads them). This process never imports torch.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

from parity import config, store
from parity.io import exit_now, write_json
from parity.suites import features, pool, spec


def run_cell(p: dict, suite: str, dtype: str, provider: str, workers: int | None = None, progress=None):
    """(rows, outputs, references, timing) for one cell."""
    sr = p.get("suites_run") or {}
    cases = spec.expand(suite, p["suites"][suite], default_timeout=float(sr.get("timeout_s", 60)))
    prov = p["providers"][provider]
    rows, outs, refs, timing = [], [], [], {}
    mode = p["dtypes"][dtype].get("mode", "cast")
    if mode != "cast":
        results = [{"status": "UNSUPPORTED", "reason": f"suites run cast precisions only; dtypes.{dtype}.mode is "
                                                       f"{mode!r}"} for _ in cases]
        stats = None
    elif dtype not in prov.get("dtypes", []):
        why = (f"provider {provider} supports dtypes {prov.get('dtypes')}, not {dtype} "
               f"(conf/providers/{provider}.yaml)")
        results = [{"status": "UNSUPPORTED", "reason": why} for _ in cases]
        stats = None
    else:
        cell = {"provider": provider, "torch_dtype": p["dtypes"][dtype]["torch"], "seed": int(p.get("seed", 0)),
                "repeats": int(sr.get("repeats", 3)), "threads": int(sr.get("threads", 1)),
                "onnx_opset": int(sr.get("onnx_opset", 17)), "options": prov.get("options") or {},
                "grad": bool(sr.get("grad", True))}
        limits = [c["timeout_s"] or float(sr.get("timeout_s", 60)) for c in cases]
        skips = [features.skip_reason(c, provider, dtype) for c in cases]  # skip_on: never sent to a worker
        todo = [i for i, why in enumerate(skips) if not why]
        results = [{"status": "SKIPPED", "reason": why} if why else None for why in skips]
        with pool.Pool(workers or int(sr.get("workers", 2)), threads=cell["threads"]) as pl:
            for i, r in zip(todo, pl.run([cases[i] for i in todo], cell, [limits[i] for i in todo], progress=progress)
                            if todo else []):
                results[i] = r
            stats = {"restarts": pl.restarts, "crashes": pl.crashes, "timeouts": pl.timeouts}
    for idx, (c, r) in enumerate(zip(cases, results)):
        names = [n for n, _ in r.get("outputs", [])]
        rows.append({"id": c["id"], "label": c["label"], "kind": c["kind"], "status": r["status"],
                     "reason": r.get("reason", ""), "outputs": names, "onnx_ops": r.get("onnx_ops"),
                     "gradcheck": r.get("gradcheck"),
                     **{k: r[k] for k in ("note", "drawn") if r.get(k) is not None}})
        for k, (n, a) in enumerate(r.get("outputs", [])):
            outs.append(store.Tensor(idx, f"{c['id']}/{n}", k, a))
        for k, (n, a) in enumerate(r.get("reference", [])):
            refs.append(store.Tensor(idx, f"{c['id']}/{n}", k, a))
        if "latency_ms" in r:
            timing[c["id"]] = {"latency_ms": r["latency_ms"], "ref_latency_ms": r.get("ref_latency_ms")}
    return rows, outs, refs, timing, stats


def main(argv=None) -> int:
    ap = config.stage_parser("stages.suite_run", __doc__)
    for k in ("suite", "dtype", "provider", "out", "timing"):
        ap.add_argument(f"--{k}", required=True)
    ap.add_argument("--workers", type=int, default=None)
    a = ap.parse_args(argv)
    p = config.load_or_die(a.params)
    key = f"{a.suite}-{a.dtype}-{a.provider}"
    t0 = time.perf_counter()
    try:
        rows, outs, refs, timing, stats = run_cell(p, a.suite, a.dtype, a.provider, a.workers)
    except spec.SuiteError as e:
        config.die(e)
    out = Path(a.out)
    md = {"suite": a.suite, "dtype": a.dtype, "provider": a.provider}
    store.write(out / "outputs.parquet", outs, md)
    store.write(out / "reference.parquet", refs, md)
    write_json(out / "results.json", {"suite": a.suite, "dtype": a.dtype, "provider": a.provider, "cases": rows},
               sort_keys=False)
    wall = time.perf_counter() - t0
    write_json(a.timing, {"cases": timing, "wall_s": wall, "pool": stats})
    counts = Counter(r["status"] for r in rows)
    print(f"suite_run@{key}: {len(rows)} cases in {wall:.1f} s ({len(rows) / max(wall, 1e-9):.1f}/s): "
          + ", ".join(f"{s}={n}" for s, n in sorted(counts.items())), file=sys.stdout)
    exit_now(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
