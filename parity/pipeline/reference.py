"""The torch CPU reference of a model: per-layer outputs at fp32 (and fp64, the golden run, with each
leaf call's first floating input as `pre:<call>`), as Parquet store rows."""

from __future__ import annotations

MIN_OUTPUT_ABS = 1e-3


def run(p: dict, model_name: str, feeds: list, dtype: str, inputs: bool = False):
    """Store rows of one reference run of `model_name` at torch dtype `dtype` on `feeds`."""
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


def tiny_outputs(rows) -> dict:
    """Model outputs whose max |value| is <= MIN_OUTPUT_ABS. An output within atol of zero passes any
    diff, even against an all-zero actual: the default atols are 1e-4 (fp32) and 1e-5 (fp16/bf16), so
    demand values well above them."""
    from parity import store

    outputs = [t for t in rows if store.is_output(t.name)]
    return {t.name: float(abs(t.array).max()) for t in outputs if not float(abs(t.array).max()) > MIN_OUTPUT_ABS}
