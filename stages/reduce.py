"""reduce@model-dtype-provider (analysis.reduce: true): for a cell whose verdict is FAIL, shrink the
plain graph to the smallest subgraph that still fails on the provider against the reference
(parity.analysis.reduce) and write a vendor's repro bundle (parity.analysis.repro): reduced.onnx,
reduced.source.onnx, inputs.npz, expected.npz, repro.py. Always writes reduce.json (status REDUCED,
NOT_REPRODUCED, or SKIPPED with the reason: the cell passed, or the provider runs no ONNX graphs);
the time it took goes to --timing (measured, so apart from the deterministic folder).
"""

from __future__ import annotations

import time
from pathlib import Path

from parity import config

NOOPT_RUNNER = "parity.backends.ort_cpu:OrtCpuRunner"


def main(argv=None) -> int:
    ap = config.stage_parser("stages.reduce", __doc__, cell=True)
    ap.add_argument("--model-dir", required=True, help="export output (model.onnx: the plain graph)")
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--diff", required=True, help="the cell's diff folder (metrics.json: its verdict)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--timing", required=True)
    a = ap.parse_args(argv)
    p = config.load_or_die(a.params)
    import shutil

    from parity.analysis import reduce, repro
    from parity.backends import load_runner
    from parity.backends.base import CaptureJob
    from parity.io import read_json, write_json
    from stages.inputs import load

    key = config.cell_key(a.model, a.dtype, a.provider)
    out = Path(a.out)
    shutil.rmtree(out, ignore_errors=True)  # a re-run never keeps an earlier bundle
    limit = float((p.get("analysis") or {}).get("reduce_rel_l2", 1e-3))
    t0 = time.perf_counter()
    verdict = read_json(Path(a.diff) / "metrics.json").get("verdict")
    pc = p["providers"][a.provider]
    try:
        cls = load_runner(pc["runner"], pc.get("import"))
    except ValueError as e:  # the runner cannot be imported here (UNAVAILABLE in the capture too)
        cls, verdict = None, f"UNAVAILABLE ({e})"

    def job(dtype, provider, pcfg):
        return CaptureJob(model=a.model, model_cfg=p["models"][a.model], dtype=dtype,
                          dtype_cfg=p["dtypes"].get(dtype, {}), provider=provider, provider_cfg=pcfg,
                          model_dir=Path(a.model_dir), seed=p.get("seed", 0),
                          threads=p.get("capture", {}).get("threads", 0))

    if verdict != "FAIL":
        res = {"cell": key, "status": "SKIPPED", "reason": f"verdict {verdict}: only FAIL cells are reduced"}
    elif cls is None or not hasattr(cls, "run_graph"):
        res = {"cell": key, "status": "SKIPPED",
               "reason": f"provider {a.provider} runs no ONNX graphs (its runner has no run_graph hook)"}
    else:
        import onnx

        from parity.backends.ort_cpu import OrtCpuRunner

        provider = cls(job(a.dtype, a.provider, pc))
        trusted = OrtCpuRunner(job("fp32", "ort_cpu_noopt", {"runner": NOOPT_RUNNER, "dtypes": ["fp32"],
                                                             "options": {"graph_optimization_level": "disabled"}}))
        red = reduce.reduce(onnx.load(str(Path(a.model_dir) / "model.onnx")), load(a.inputs)[0],
                            provider, trusted, limit)
        res = repro.summary(key, red, limit)
        if red.status == "REDUCED":
            prepared = provider.prepared(onnx.ModelProto.FromString(red.model.SerializeToString()))
            repro.write_repro(out, key, red, prepared, provider.repro_settings(), limit)
            res["repro"] = "repro.py"
    write_json(out / "reduce.json", res, sort_keys=False)
    seconds = time.perf_counter() - t0
    write_json(a.timing, {"cell": key, "status": res["status"], "seconds": round(seconds, 3),
                          "trials": res.get("trials", 0)})
    nodes = f": {len(res['nodes'])} node(s) {', '.join(res['nodes'][:3])}" if res.get("nodes") else ""
    print(f"reduce@{key}: {res['status']}{nodes}{' (' + res['reason'] + ')' if res.get('reason') else ''}, "
          f"{res.get('trials', 0)} trials, {seconds:.1f}s -> {out}")
    return 0


if __name__ == "__main__":
    from parity.io import exit_now

    exit_now(main())
