"""generate@model-dtype-provider: generation drift (parity.pipeline.generate). Greedy decoding of
`generate.steps` tokens with a KV cache on the provider (ort_cpu: generate_export's decoder.onnx;
torch_cpu: the model's cache) against torch fp64, teacher-forced on the fp64 tokens.

Writes --out/steps.json (every step's logits error, oracle excess, top-1 of each side; the first
diverging and first failing step; at the first failing step the drift origin: by own error, by the
prefix re-run without the cache, else with it, present.<i>.key/value being values too, e.g.
`model.layers.1 cache (present.1.value)`, its cause saying "cache") and --out/metrics.json (the
summary, drift origin and cause included); --timing (seconds, peak RSS: kept apart from the values).
"""

from __future__ import annotations

import resource
import time
from pathlib import Path

from parity.config import params as config
from parity.core.io import exit_now, write_json
from parity.pipeline.generate import run_cell

SUMMARY = ("model", "dtype", "provider", "status", "reason", "verdict", "steps", "agreement", "first_divergence",
           "first_fail", "worst_excess")


def summary(res: dict) -> dict:
    out = {k: res[k] for k in SUMMARY if k in res}
    o = res.get("origin") or {}
    out.update(drift_origin=o.get("origin"), origin_step=o.get("step"), drift_cause=o.get("cause"))
    return out


def main(argv=None) -> int:
    ap = config.stage_parser("stages.generate", __doc__, cell=True)
    ap.add_argument("--export-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--timing", required=True)
    a = ap.parse_args(argv)
    p = config.load_or_die(a.params)

    t0 = time.perf_counter()
    res = run_cell(p, a.model, a.dtype, a.provider, Path(a.export_dir))
    s = summary(res)
    out = Path(a.out)
    write_json(out / "steps.json", res, sort_keys=False)
    write_json(out / "metrics.json", s, sort_keys=False)
    write_json(a.timing, {"seconds": round(time.perf_counter() - t0, 3),
                          "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)})
    key = config.cell_key(a.model, a.dtype, a.provider)
    if res["status"] != "OK":
        print(f"generate@{key}: {res['status']} ({res['reason']})")
    else:
        print(f"generate@{key}: {res['verdict']}, top-1 agreement {res['agreement']}/{res['steps']}, first "
              f"divergence {s['first_divergence']}, first failing step {s['first_fail']}, worst excess "
              f"{res['worst_excess']:.3g}, drift origin {s['drift_origin']}"
              + (f" ({s['drift_cause']})" if s["drift_cause"] else ""))
    for side, why in (("prompt", ""), ("reference", " (torch fp64, greedy)"),  # a checkpoint's tokenizer: the text
                      (a.provider, " (its top-1 at each step on the reference's prefix)")) if res.get("text") else ():
        print(f"generate@{key}: {side:<9} {res['text'][side if side in ('prompt', 'reference') else 'provider']!r}{why}")
    exit_now(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
