"""plan@model-dtype-provider: a mixed-precision plan for one reduced-precision cell (analysis.plan).

Writes, under --out: plan.json (target, keep-list, per-layer sensitivity, the search, output error of
the fp32 / full / mixed models, whether the confirming run passes) and keep.yaml (the keep-list as a
user applies it on this backend). Latencies (fp32, full, mixed: median of the plain graph) and the
stage's time go to --timing, apart from plan.json, because they are measured. A cell that cannot get a
plan (UNSUPPORTED, UNAVAILABLE) or fails (FAILED) is a result, not a failed stage. The algorithm:
parity/analysis/plan.py.
"""

from __future__ import annotations

from pathlib import Path

from parity.analysis.plan import Cell, run_plan
from parity.config import params as config
from parity.core.io import write_json, write_text


def main(argv=None) -> int:
    ap = config.stage_parser("stages.plan", __doc__, cell=True)
    ap.add_argument("--model-dir", required=True, help="export stage output (model.onnx, layers.json)")
    ap.add_argument("--inputs", required=True, help="the evaluated input samples (inputs stage)")
    ap.add_argument("--calibration", help="INT8 calibration samples (inputs stage), for int8_static")
    ap.add_argument("--reference", required=True, help="the fp32 torch reference (reference stage fp32.parquet)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--timing", required=True)
    a = ap.parse_args(argv)
    p = config.load_or_die(a.params)

    cell = Cell(a.model, a.dtype, a.provider, Path(a.model_dir), Path(a.inputs), Path(a.reference),
                Path(a.calibration) if a.calibration else None)
    plan, keep, timing = run_plan(p, cell)
    out = Path(a.out)
    write_json(out / "plan.json", plan)
    write_text(out / "keep.yaml", keep)
    write_json(a.timing, timing)
    key = plan["cell"]
    if plan["status"] != "OK":
        print(f"plan@{key}: {plan['status']} ({plan['reason']}), {timing['stage_s']:.1f}s")
        return 0
    lat = timing["latency_ratio"]
    q = "quant_cost" in (plan["sensitivity"] or [{}])[0]  # ranked by parity's own quantisation (plan_cost)
    top = ", ".join(f"{r['layer']} {r['quant_cost']:.2g}/{r['rel_l2']:.2g}{' EXCEEDS' * r['exceeds_cost']}" if q
                    else f"{r['layer']} {r['rel_l2']:.2g}" for r in plan["sensitivity"][:5])
    print(f"plan@{key}: {plan['summary']}")
    if top:
        what = ": parity's expected cost / the provider's" if q else ""
        print(f"plan@{key}: most sensitive (output rel_l2 with only that layer reduced{what}): {top}")
    fmt = lambda v: f"{v:.2f}x" if v else "n/a"  # noqa: E731
    print(f"plan@{key}: latency vs fp32: full {fmt(lat['full_vs_fp32'])}, mixed {fmt(lat['mixed_vs_fp32'])}; "
          f"{plan['runs']} model runs, {timing['stage_s']:.1f}s")
    return 0


if __name__ == "__main__":
    from parity.core.io import exit_now

    exit_now(main())  # outputs are in place; skip torch's interpreter teardown
