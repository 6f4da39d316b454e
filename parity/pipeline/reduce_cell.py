"""reduce@model-dtype-provider as a library function (stages/reduce.py is its entry): decide whether
the cell is reduced (verdict FAIL, a runner that runs ONNX graphs); first check the exported graphs
themselves against torch (parity.analysis.torch_reduce: an exporter bug, which the provider shares
with ORT) and reduce there when they disagree; else run parity.analysis.reduce on the plain graph
(the provider against ORT with optimisation off). Writes the vendor's bundle (parity.analysis.repro,
or torch_reduce's) and reduce.json under `out`."""

from __future__ import annotations

import shutil
from pathlib import Path

from parity.analysis import reduce, repro, torch_reduce
from parity.core import oracle
from parity.backends import load_runner
from parity.backends.runner import CaptureJob
from parity.backends.ort_cpu import OrtCpuRunner
from parity.config import params as config
from parity.core import modelfiles, store
from parity.core.status import Status
from parity.core.io import read_json, write_json
from parity.models.onnx_weights import load_with_data
import onnx
from parity.config import schema

NOOPT = {"runner": "parity.backends.ort_cpu:OrtCpuRunner", "dtypes": ["fp32"],
         "options": {"graph_optimization_level": "disabled"}}


def first_sample(path: Path) -> dict:
    """The inputs stage's sample 0, {input name: array}."""
    return {t.name: t.array for t in store.read(path) if t.sample == 0}


def against_torch(p: dict, model: str, key: str, dtype: str, model_dir: Path, inputs: Path, reference: Path | None,
                  baseline: Path | None, origin: str | None, out: Path) -> dict:
    """The exported graphs against torch (parity.analysis.torch_reduce): {status: REDUCED (bundle
    written under `out`) | AGREES | NOT_REPRODUCED | NOT_CHECKED, reason, ...}."""
    dcfg = p["dtypes"][dtype]
    why = None
    if modelfiles.is_onnx_file(p["models"][model]):
        why = "an ONNX-file model: there is no torch to check the graph against"
    elif not oracle.has_baseline(dcfg):
        why = f"dtypes.{dtype}.mode {dcfg.get('mode')!r} has no torch baseline"
    elif reference is None or not (reference / "fp64.parquet").exists():
        why = "no fp64 reference (reference.fp64: false): no torch input recorded per layer"
    elif baseline is None or not (baseline / "own.parquet").exists():
        why = "the baseline measured no own error (own.parquet): no torch floor per layer"
    if why:
        return {"status": "NOT_CHECKED", "against": "torch", "reason": why}
    c = schema.of(p)
    k, slack = float(c.dtypes[dtype].oracle.k), float(c.dtypes[dtype].oracle.slack)
    samples, gold, base_own = torch_reduce.load(inputs, reference, baseline)
    threads = c.capture.threads
    res = torch_reduce.reduce_against_torch(model_dir, samples, base_own, gold, k, slack,
                                            lambda: torch_reduce.noopt_runner(model_dir, threads), prefer=origin)
    summary = torch_reduce.summary(key, res)
    if res.status == "REDUCED":
        torch_reduce.write_bundle(out, key, res, k)
        summary["repro"] = "repro.py"
    return summary


def reduce_cell(p: dict, model: str, dtype: str, provider: str, model_dir: Path, inputs: Path,
                diff_dir: Path, out: Path, reference: Path | None = None, baseline: Path | None = None) -> dict:
    """reduce.json's content, after writing it (and the bundle when REDUCED) under `out`."""
    key = config.cell_key(model, dtype, provider)
    shutil.rmtree(out, ignore_errors=True)  # a re-run never keeps an earlier bundle
    c = schema.of(p)
    limit = float(c.analysis.reduce_rel_l2)
    metrics = read_json(diff_dir / "metrics.json")
    verdict = metrics.get("verdict")
    pc = p["providers"][provider]
    try:
        cls = load_runner(pc["runner"], pc.get("import"))
    except ValueError as e:  # the runner cannot be imported here (UNAVAILABLE in the capture too)
        cls, verdict = None, f"UNAVAILABLE ({e})"

    def job(dt, prov, pcfg):
        return CaptureJob(model=model, model_cfg=p["models"][model], dtype=dt, dtype_cfg=p["dtypes"].get(dt, {}),
                          provider=prov, provider_cfg=pcfg, model_dir=model_dir, seed=c.seed,
                          threads=c.capture.threads)

    if verdict != Status.FAIL:
        res = {"cell": key, "status": "SKIPPED", "reason": f"verdict {verdict}: only FAIL cells are reduced"}
    elif cls is None or not hasattr(cls, "run_graph"):
        res = {"cell": key, "status": "SKIPPED",
               "reason": f"provider {provider} runs no ONNX graphs (its runner has no run_graph hook)"}
    else:
        exporter = against_torch(p, model, key, dtype, model_dir, inputs, reference, baseline,
                                 metrics.get("drift_origin"), out)
        if exporter["status"] == "REDUCED":
            write_json(out / "reduce.json", exporter, sort_keys=False)
            return exporter

        runner = cls(job(dtype, provider, pc))
        trusted = OrtCpuRunner(job("fp32", "ort_cpu_noopt", NOOPT))
        red = reduce.reduce(load_with_data(model_dir / "model.onnx"), first_sample(inputs), runner, trusted, limit)
        res = repro.summary(key, red, limit)
        if red.status == "REDUCED":
            prepared = runner.prepared(onnx.ModelProto.FromString(red.model.SerializeToString()))
            repro.write_repro(out, key, red, prepared, runner.repro_settings(), limit)
            res["repro"] = "repro.py"
        res["torch"] = {k: exporter[k] for k in ("status", "reason", "checked") if k in exporter}
    write_json(out / "reduce.json", res, sort_keys=False)
    return res
