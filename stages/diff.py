"""diff@model-dtype-provider: per-layer comparison of a capture against the torch fp32 reference.

Writes, under --out: metrics.json (DVC metrics: verdict, drift_origin, worst layer, output-level
metrics), layers.json (every layer's metrics and the tolerance key that applied) and layers.csv
(DVC plot data: per-layer error in execution order). numpy only.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from parity import compare, config, store
from parity.io import read_json, write_json, write_text

PLOT_FIELDS = ("order", "layer", "max_abs", "rel_l2", "tol_ratio", "frac_outside", "passed")


def diff_cell(p: dict, model: str, dtype: str, capture_dir: Path, reference_dir: Path):
    status = read_json(capture_dir / "status.json")
    ref = store.read_dict(reference_dir / "fp32.parquet")
    max_mismatch = float(p.get("diff", {}).get("max_mismatch", 0.0))
    if status["status"] != "OK":
        return status, [], {"passed": None}
    act = store.read_dict(capture_dir / "layers.parquet")
    ref_order = {name: t.order for (_, name), t in ref.items()}
    # reference layers in execution order, then the shipped graph's outputs (plain:output), which
    # are compared with the reference outputs too
    names = sorted(ref_order, key=ref_order.get)
    names += sorted({n for _, n in act if n.startswith(store.PLAIN) and store.reference_name(n) in ref_order})
    samples = sorted({s for s, _ in ref})
    layers = []
    for order, name in enumerate(names):
        rname = store.reference_name(name)
        pairs = [(s, act[s, name].array, ref[s, rname].array) for s in samples if (s, name) in act and (s, rname) in ref]
        atol, rtol, src = config.tolerance_for(p, model, dtype, rname)
        if not pairs:
            d = compare.LayerDiff(name=name, order=order, shape=[], numel=0, atol=atol, rtol=rtol,
                                  tol_source=src, passed=False, problem="not captured by this provider")
        else:
            d = compare.compare_layer(name, order, pairs, atol, rtol, src, max_mismatch)
        layers.append(d)
    summary = compare.summarize(layers, {n for n in names if store.is_output(n)})
    golden = reference_dir / "fp64.parquet"
    if golden.exists():
        summary["fp64"] = _vs_golden(store.read_dict(golden), ref, act)
    return status, layers, summary


def _vs_golden(gold, ref, act) -> dict:
    """RMSE of the model output vs the fp64 golden run for both sides (torch._dynamo.utils.same)."""
    import numpy as np

    def rmse(side):
        errs = [np.mean((side[k].array.astype(np.float64) - g.array) ** 2) for k, g in gold.items()
                if store.is_output(k[1]) and k in side]
        return float(np.sqrt(np.mean(errs))) if errs else None

    r, a = rmse(ref), rmse(act)
    closer = None if r is None or a is None else ("reference" if r < a else "actual" if a < r else "tie")
    return {"rmse_reference": r, "rmse_actual": a, "closer": closer}


def _output_metrics(d) -> dict:
    return {k: getattr(d, k) for k in compare.METRICS + ("nan_actual", "inf_actual", "passed")} if d else {}


def main(argv=None) -> int:
    ap = config.stage_parser("stages.diff", __doc__, cell=True)
    ap.add_argument("--capture", required=True)
    ap.add_argument("--reference", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    p = config.load_or_die(a.params)
    key = config.cell_key(a.model, a.dtype, a.provider)
    status, layers, summary = diff_cell(p, a.model, a.dtype, Path(a.capture), Path(a.reference))
    out = Path(a.out)
    outputs = [d for d in layers if store.is_output(d.name)]
    head = next((d for d in outputs if not d.name.startswith(store.PLAIN)), None)
    plain = next((d for d in outputs if d.name.startswith(store.PLAIN)), None)
    verdict = status["status"] if status["status"] != "OK" else ("PASS" if summary["passed"] else "FAIL")
    metrics = {
        "status": status["status"], "verdict": verdict, "reason": status.get("reason", ""),
        "passed": summary["passed"],
        **{k: summary.get(k) for k in ("layers", "layers_failed", "drift_origin", "worst_layer",
                                       "worst_tol_ratio")},
        "output": _output_metrics(head),
        # the same output from the plain graph (model.onnx: what ships, no extra outputs)
        "plain_output": _output_metrics(plain),
    }
    if "fp64" in summary:
        metrics["fp64"] = summary["fp64"]
    write_json(out / "metrics.json", metrics)
    write_json(out / "layers.json", {"cell": key, "layers": [d.as_dict() for d in layers]}, sort_keys=False)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(PLOT_FIELDS)
    for d in layers:
        w.writerow([d.order, d.name, repr(d.max_abs), repr(d.rel_l2), repr(d.tol_ratio),
                    repr(d.frac_outside), int(d.passed)])
    write_text(out / "layers.csv", buf.getvalue())
    extra = ""
    if verdict in ("PASS", "FAIL"):
        extra = (f": {metrics['layers']} layers compared, {metrics['layers_failed']} over tolerance, "
                 f"drift_origin={metrics['drift_origin']}, worst={metrics['worst_layer']} "
                 f"(tol_ratio {metrics['worst_tol_ratio']:.3g}), output max_abs={head.max_abs:.3e}")
    elif status.get("reason"):
        extra = f": {status['reason']}"
    print(f"diff@{key}: {verdict}{extra}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
