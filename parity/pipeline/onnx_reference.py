"""reference@model and the oracle's trusted baseline for a model given as an ONNX file: the per-node
graph (parity.models.onnx_source.instrument) on ORT CPU with graph optimisation disabled, through the
same OrtCpuRunner as the providers, and the fp64 golden run from the ONNX reference evaluator on the
graph cast to float64 (onnxruntime has no float64 Conv), node by node with fallbacks
(parity.pipeline.onnx_fp64). Why this reference: onnx_source's docstring.

What the oracle is measured against, written as fp64.parquet (its metadata says which; the diff's
verdict reason repeats it, parity.pipeline.diff.verdict_mode):
- the fp64 golden run, every node in float64 (metadata: by onnx-reference-evaluator);
- the same, with the nodes the evaluator could not run in float64 run alone in float32 (or on
  onnxruntime in float64): `fallback_nodes` (JSON) and `note` name each, and why;
- when no node-by-node run works at all, the unfused fp32 onnxruntime run (the reference itself) as
  the yardstick (`yardstick: fp32`, `note`): reduced-precision cells (fp16, bf16) are judged by the
  oracle against it, fp32 cells by tolerance. Never fp32's fixed tolerance for a reduced-precision cell.
A model whose output is ~0 is refused, as a torch model's is (parity.pipeline.tiny_output)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from parity.backends.capture_driver import run_capture
from parity.backends.runner import CaptureJob
from parity.backends.ort_cpu import OrtCpuRunner
from parity.core import store
from parity.models.onnx_weights import with_data
from parity.config import schema
from parity.pipeline import onnx_fp64
from parity.models.onnx_source import (NOOPT, ORT_RUNNER, OnnxSourceError, arch_path, instrument, load_checked,
                                         to_float64, write_graphs)
from parity.pipeline.tiny_output import TinyOutput, refusal, tiny_outputs


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
    # a zero-element value computes nothing that could be wrong: never a layer (nor a drift origin)
    return [t for k, named in enumerate(res.samples) for t in store.rows_from(k, named)
            if not t.name.startswith(store.PLAIN) and (t.array.size or store.is_output(t.name))]


def golden_rows(p: dict, model: str, feeds: list, ref: list | None = None) -> tuple[list, str, list]:
    """(fp64 rows, "", [nodes that fell back]) from the ONNX reference evaluator on the graph cast to
    float64, node by node (onnx_fp64.Golden), or ([], why not, []). `ref`: the fp32 reference rows,
    each node's outputs are checked against (onnx_fp64.Golden.run), and whose names are the rows kept."""
    return golden_run(p, model, feeds, ref)[:3]


def golden_run(p: dict, model: str, feeds: list, ref: list | None = None) -> tuple[list, str, list, dict]:
    """golden_rows(), and {value: kappa} of the nodes that sum products (onnx_fp64.Golden.conditions:
    the summations' condition numbers, which the diff reads to name a cancellation)."""
    path = arch_path(p["models"][model])
    # the evaluator runs a whole in-memory model (numpy): the fp64 golden run is for small graphs
    layers, _, _, _ = instrument(with_data(load_checked(path, f"models.{model}.arch.path"), path.parent))
    names = [o.name for o in layers.graph.output]
    expect: dict[int, dict] = {}
    for t in ref or []:
        expect.setdefault(t.sample, {})[t.name] = t.array
    rows = []
    try:
        golden = onnx_fp64.Golden(layers, to_float64(layers), conditions=True)
        for k, f in enumerate(feeds):
            f64 = {n: (v.astype(np.float64) if v.dtype.kind == "f" else v) for n, v in f.items()}
            got = golden.run(f64, expect.get(k))
            keep = [n for n in names if n in expect[k]] if k in expect else names
            rows += store.rows_from(k, [(n, np.asarray(got[n])) for n in keep])
    except onnx_fp64.GoldenError as e:  # a node no way runs: the message names it and every way tried
        return [], f"GoldenError: {e}", [], {}
    except Exception as e:  # noqa: BLE001  the graph itself (the evaluator cannot load it): no golden run
        return [], onnx_fp64.one_line(e), [], {}
    kept = {t.name for t in rows}
    conds = {n: c for n, c in golden.conditions().items() if n in kept}
    return rows, "", [golden.fell[i] for i in sorted(golden.fell)], conds


def _peaks(rows: list) -> dict:
    """{model output: max |value| over the samples} of the reference rows."""
    peak: dict[str, float] = {}
    for t in rows:
        if store.is_output(t.name):
            peak[t.name] = max(peak.get(t.name, 0.0), float(np.abs(t.array).max()) if t.array.size else 0.0)
    return peak


def _yardstick(rows: list) -> list:
    """The fp32 reference rows as float64: the yardstick where no fp64 run could be made."""
    return [store.Tensor(t.sample, t.name, t.order, np.asarray(t.array, np.float64)) for t in rows]


def reference(p: dict, model: str, feeds: list, out: Path) -> int:
    """reference@model for an ONNX file: fp32.parquet (ORT CPU, no optimisation) and, with
    reference.fp64, fp64.parquet: the golden run, else the fp32 yardstick (module docstring). A model
    output ~0 is refused (tiny_output), nothing written. Returns the exit code."""
    try:
        rows = reference_rows(p, model, feeds)
        tiny = tiny_outputs(_peaks(rows))
        if tiny:
            raise refusal(model, tiny, f"Check the file's weights ({arch_path(p['models'][model])}) or change "
                                       f"its inputs (models.{model}.input).")
    except (OnnxSourceError, TinyOutput) as e:
        print(f"{e}" if isinstance(e, TinyOutput) else f"reference@{model}: {e}", file=sys.stderr)
        return 1
    gold, why, fell, conds = golden_run(p, model, feeds, rows) if schema.of(p).reference.fp64 else ([], "", [], {})
    msg = write(out, model, rows, gold, why, fell, conds)
    print(f"reference@{model}: {len(rows)} tensors ({len(feeds)} samples) fp32 (onnxruntime CPU, optimisation "
          f"disabled){msg} -> {out}")
    return 0


def write(out: Path, model: str, rows: list, gold: list, why: str, fell: list, conds: dict | None = None) -> str:
    """fp32.parquet of the reference `rows`, and fp64.parquet: the golden rows `gold` (with the
    nodes that `fell` back named in its metadata, and `conds`, the condition numbers of the sums,
    as `sum_conditions`: JSON {value: kappa}), else, when the golden run was asked for and failed
    (`why`), the fp32 rows as the yardstick. What was written, for the stage's line."""
    (out / "fp64.parquet").unlink(missing_ok=True)
    md = {"model": model, "dtype": "float32", "by": "onnxruntime-cpu-noopt"}
    if why:
        md["no_fp64"] = f"the ONNX reference evaluator cannot run the float64 graph ({why})"
    store.write(out / "fp32.parquet", rows, md)
    if gold:
        gmd = {"model": model, "dtype": "float64", "by": "onnx-reference-evaluator"}
        if fell:  # the diff's verdict_mode_reason repeats the note (parity.pipeline.diff.verdict_mode)
            gmd.update(fallback_nodes=json.dumps(fell), note=onnx_fp64.describe(fell))
        if conds:  # read by parity.analysis.cancellation (a cancelling sum at the drift origin)
            gmd["sum_conditions"] = json.dumps({k: round(v, 6) for k, v in sorted(conds.items())})
        store.write(out / "fp64.parquet", gold, gmd)
        return " + fp64 golden (ONNX reference evaluator)" + (f"; {gmd['note']}" if fell else "")
    if not why:
        return ""
    note = (f"no fp64 golden run ({md['no_fp64']}): judged against the unfused fp32 onnxruntime run "
            f"(the reference) as the yardstick")
    store.write(out / "fp64.parquet", _yardstick(rows), {"model": model, "dtype": "float64", "yardstick": "fp32",
                                                         "by": "onnxruntime-cpu-noopt", "note": note})
    return f"; {note}"
