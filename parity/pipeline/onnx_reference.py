"""reference@model and the oracle's trusted baseline for a model given as an ONNX file: the per-node
graph (parity.pipeline.onnx_source.instrument) on ORT CPU with graph optimisation disabled, through the
same OrtCpuRunner as the providers, and the fp64 golden run from the ONNX reference evaluator on the
graph cast to float64 (onnxruntime has no float64 Conv). Why this reference: onnx_source's docstring."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
from onnx.reference import ReferenceEvaluator

from parity.backends.base import CaptureJob, run_capture
from parity.backends.ort_cpu import OrtCpuRunner
from parity.core import store
from parity.models.onnx_weights import with_data
from parity.config import schema
from parity.pipeline.onnx_source import (NOOPT, ORT_RUNNER, OnnxSourceError, arch_path, instrument, load_checked,
                                         to_float64, write_graphs)


def ort_capture(p: dict, model: str, feeds: list, dtype: str):
    """The ONNX file's per-node graph on ORT CPU with graph optimisation disabled, at conf dtype
    `dtype` (the reference at fp32, the oracle's trusted baseline at the cell's dtype): a CaptureResult."""
    mc = p["models"][model]
    path = arch_path(mc)
    m = load_checked(path, f"models.{model}.arch.path")
    with tempfile.TemporaryDirectory(prefix="parity-onnx-") as d:
        write_graphs(m, path.parent, Path(d))  # as the export writes them: weights.bin shared
        job = CaptureJob(model=model, model_cfg=mc, dtype=dtype, dtype_cfg=p["dtypes"].get(dtype, {}),
                         provider="ort_cpu_noopt", provider_cfg={"runner": ORT_RUNNER, "dtypes": [dtype],
                                                                 "options": NOOPT},
                         model_dir=Path(d), seed=schema.of(p).seed, threads=schema.of(p).capture.threads)
        return run_capture(OrtCpuRunner, job, feeds, 0, 0)


def reference_rows(p: dict, model: str, feeds: list) -> list:
    """fp32 reference rows (model output, then every node output), per sample."""
    res = ort_capture(p, model, feeds, "fp32")
    if res.status != "OK":
        raise OnnxSourceError(f"reference@{model}: onnxruntime CPU (optimisation disabled) could not run "
                              f"{arch_path(p['models'][model])}: {res.status} {res.reason}")
    return [t for k, named in enumerate(res.samples) for t in store.rows_from(k, named)
            if not t.name.startswith(store.PLAIN)]


def golden_rows(p: dict, model: str, feeds: list) -> tuple[list, str]:
    """(fp64 rows, "") from the ONNX reference evaluator on the graph cast to float64, or ([], why not)."""
    path = arch_path(p["models"][model])
    # the evaluator runs a whole in-memory model (numpy): the fp64 golden run is for small graphs
    layers, _, _, _ = instrument(with_data(load_checked(path, f"models.{model}.arch.path"), path.parent))
    m64 = to_float64(layers)
    names = [o.name for o in m64.graph.output]
    rows = []
    try:
        ev = ReferenceEvaluator(m64)
        for k, f in enumerate(feeds):
            f64 = {n: (v.astype(np.float64) if v.dtype.kind == "f" else v) for n, v in f.items()}
            rows += store.rows_from(k, list(zip(names, (np.asarray(v) for v in ev.run(None, f64)))))
    except Exception as e:  # an op the evaluator lacks or cannot run in float64: no golden run
        return [], f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    return rows, ""


def reference(p: dict, model: str, feeds: list, out: Path) -> int:
    """reference@model for an ONNX file: fp32.parquet (ORT CPU, no optimisation) and, with
    reference.fp64, fp64.parquet from the evaluator when the graph allows it. Returns the exit code."""
    try:
        rows = reference_rows(p, model, feeds)
    except OnnxSourceError as e:
        print(f"reference@{model}: {e}", file=sys.stderr)
        return 1
    msg = f"reference@{model}: {len(rows)} tensors ({len(feeds)} samples) fp32 (onnxruntime CPU, optimisation disabled)"
    (out / "fp64.parquet").unlink(missing_ok=True)
    gold, why = golden_rows(p, model, feeds) if schema.of(p).reference.fp64 else ([], "")
    md = {"model": model, "dtype": "float32", "by": "onnxruntime-cpu-noopt"}
    if why:  # the diff's verdict_mode_reason reads it (parity.analysis.diffcell.verdict_mode)
        md["no_fp64"] = f"the ONNX reference evaluator cannot run the float64 graph ({why})"
    store.write(out / "fp32.parquet", rows, md)
    if gold:
        store.write(out / "fp64.parquet", gold, {"model": model, "dtype": "float64", "by": "onnx-reference-evaluator"})
        msg += " + fp64 golden (ONNX reference evaluator)"
    elif why:
        msg += f"; no fp64 golden: {md['no_fp64']}"
    print(msg + f" -> {out}")
    return 0
