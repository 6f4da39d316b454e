"""reference@model: torch CPU fp32 outputs, whole model and per layer, to Parquet (fp32.parquet);
with `reference.fp64: true` also an fp64 golden run (fp64.parquet), which also holds each leaf call's
first floating input as `pre:<call>` (what the capture stage feeds each layer to measure its own
error; fp32.parquet has leaf outputs only, so the diff's layer names are unchanged)."""

from __future__ import annotations

import sys
from pathlib import Path


MIN_OUTPUT_ABS = 1e-3


def run(p: dict, model_name: str, feeds: list, dtype: str, inputs: bool = False):
    import torch

    from parity import store
    from parity.models import build
    from parity.models.layers import LayerRecorder

    m = p["models"][model_name]
    tdt = getattr(torch, dtype)
    rec = LayerRecorder(build(m["arch"], p.get("seed", 0)).to(tdt), inputs=inputs).eval()
    rows = []
    with torch.no_grad():
        for k, f in enumerate(feeds):
            xs = [torch.from_numpy(f[s["name"]].copy()) for s in m["input"]]
            xs = [x.to(tdt) if x.is_floating_point() else x for x in xs]
            outs = rec(*xs)
            rows += store.rows_from(k, [(n, v.detach().numpy()) for n, v in zip(rec.names, outs)])
    return rows


def main(argv=None) -> int:
    from parity import config

    ap = config.stage_parser("stages.reference", __doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    p = config.load_or_die(a.params)

    from parity import store
    from stages.inputs import load

    feeds = load(a.inputs)
    out = Path(a.out)
    if p["models"][a.model]["arch"]["source"] == "onnx":  # ORT CPU, no optimisation (+ fp64 evaluator)
        from parity.pipeline import onnx_reference

        return onnx_reference.reference(p, a.model, feeds, out)
    rows = run(p, a.model, feeds, "float32")
    outputs = [t for t in rows if store.is_output(t.name)]
    # An output within atol of zero passes any diff, even against an all-zero actual: the default
    # atols are 1e-4 (fp32) and 1e-5 (fp16/bf16), so demand values well above them.
    tiny = {t.name: float(abs(t.array).max()) for t in outputs if not float(abs(t.array).max()) > MIN_OUTPUT_ABS}
    if tiny:
        print(f"reference@{a.model}: model output max |value| {tiny} <= {MIN_OUTPUT_ABS:g}: a diff "
              f"against it proves nothing (any actual within atol of zero passes). Initialise the "
              f"model's head, set models.{a.model}.arch.calibrate for BatchNorm nets, or change its "
              f"inputs.", file=sys.stderr)
        return 1
    store.write(out / "fp32.parquet", rows, {"model": a.model, "dtype": "float32"})
    msg = f"reference@{a.model}: {len(rows)} tensors ({len(feeds)} samples) fp32"
    if p.get("reference", {}).get("fp64"):
        store.write(out / "fp64.parquet", run(p, a.model, feeds, "float64", inputs=True),
                    {"model": a.model, "dtype": "float64"})
        msg += " + fp64 golden"
    print(msg + f" -> {out}")
    return 0


if __name__ == "__main__":
    from parity.io import exit_now

    exit_now(main())  # outputs are in place; skip torch's interpreter teardown
