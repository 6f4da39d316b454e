"""train_step@model-dtype: one optimizer step of a model in fp32 vs AMP (torch.autocast at --dtype,
float16 or bfloat16) on torch CPU (CUDA when present, `train_step.device`), with a float64 step as the yardstick (parity.analysis.train_step).
Writes --out (JSON): the loss of each run, per-parameter gradient rel_l2 / max_abs / cosine, a verdict.
"""

from __future__ import annotations

from parity.config import params as config
from parity.config import schema
from parity.analysis import train_step
from parity.core.io import exit_now, write_json


def main(argv=None) -> int:
    ap = config.stage_parser("stages.train_step", __doc__)
    for k in ("model", "dtype", "out"):
        ap.add_argument(f"--{k}", required=True)
    a = ap.parse_args(argv)
    p = config.load_or_die(a.params)
    c = schema.of(p)
    t = c.train_step
    res = train_step.check(p["models"][a.model], a.dtype, seed=int(c.seed), lr=float(t.lr), fp64=bool(t.fp64),
                           limit=t.limit, device=t.device, threads=int(c.capture.threads))
    write_json(a.out, dict(res, model=a.model), sort_keys=False)
    w = res["worst"] or {}
    print(f"train_step@{a.model}-{a.dtype}: {res['verdict']} (worst gradient {w.get('name')} rel_l2 "
          f"{w.get('rel_l2', 0):.3g}, limit {res['limit']:g}); loss fp32 {res['loss']['fp32']:.6g} "
          f"amp {res['loss']['amp']:.6g}")
    exit_now(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
