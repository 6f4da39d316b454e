"""One suite cell (suite x dtype x provider): every case run in a pool of isolated long-lived workers
(parity.suites.pool) through the provider's runner (Runner.run_op), next to its fp32 reference.
Light: this process never imports torch (the workers do)."""

from __future__ import annotations

from parity.config import params as config
from parity.config import schema
from parity.core import store
from parity.suites import features, pool, spec
from parity.suites.cells import cell_of


def _not_run(p: dict, dtype: str, provider: str) -> str | None:
    """Why no case of this cell runs (UNSUPPORTED), or None."""
    mode = schema.of(p).dtypes[dtype].mode
    if mode != "cast":
        return f"suites run cast precisions only; dtypes.{dtype}.mode is {mode!r}"
    return config.unsupported_dtype(provider, p["providers"][provider], dtype)


def run_cell(p: dict, suite: str, dtype: str, provider: str, workers: int | None = None):
    """(rows, outputs, references, timing, pool stats) for one cell; references is {"reference": the
    fp32 reference, "gold": the fp64 oracle's values, "floor": its trusted backend at the cell's dtype
    (where run apart: parity.suites.execute)}, each a list of store.Tensor."""
    sr = schema.of(p).suites_run
    cases = spec.expand(suite, p["suites"][suite], default_timeout=float(sr.timeout_s))
    why = _not_run(p, dtype, provider)
    if why:
        results, stats = [{"status": "UNSUPPORTED", "reason": why} for _ in cases], None
    else:
        cell = cell_of(p, dtype, provider)
        limits = [c["timeout_s"] or float(sr.timeout_s) for c in cases]
        skips = [features.skip_reason(c, provider, dtype) for c in cases]  # skip_on: never sent to a worker
        todo = [i for i, why in enumerate(skips) if not why]
        results = [{"status": "SKIPPED", "reason": why} if why else None for why in skips]
        with pool.Pool(workers or int(sr.workers), threads=cell["threads"]) as pl:
            ran = pl.run([cases[i] for i in todo], cell, [limits[i] for i in todo]) if todo else []
            for i, r in zip(todo, ran):
                results[i] = r
            stats = {"restarts": pl.restarts, "crashes": pl.crashes, "timeouts": pl.timeouts}
    rows, outs, timing = [], [], {}
    refs: dict = {"reference": [], "gold": [], "floor": []}
    for idx, (c, r) in enumerate(zip(cases, results)):
        names = [n for n, _ in r.get("outputs", [])]
        rows.append({"id": c["id"], "label": c["label"], "kind": c["kind"], "status": r["status"],
                     "reason": r.get("reason", ""), "outputs": names, "onnx_ops": r.get("onnx_ops"),
                     "gradcheck": r.get("gradcheck"),
                     **{k: r[k] for k in ("note", "drawn", "floor_from", "oracle_note", "exercised") if r.get(k) is not None}})
        for k, (n, a) in enumerate(r.get("outputs", [])):
            outs.append(store.Tensor(idx, f"{c['id']}/{n}", k, a))
        for what, ts in refs.items():
            ts += [store.Tensor(idx, f"{c['id']}/{n}", k, a) for k, (n, a) in enumerate(r.get(what, []))]
        if "latency_ms" in r:
            timing[c["id"]] = {"latency_ms": r["latency_ms"], "ref_latency_ms": r.get("ref_latency_ms")}
    return rows, outs, refs, timing, stats
