"""A model sized without allocating it (parity.core.memory's W and SA for the stages that build the model):
built on torch's `meta` device (no weight bytes) and run once on meta inputs through the layer recorder
(every leaf call's output shape). torch is imported inside the functions."""

from __future__ import annotations

import warnings
from pathlib import Path

from parity.config import inputspec
from parity.config import schema
from parity.core import memory, modelfiles
from parity.models import construct


def guard(stage: str, cell: str, p: dict, model: str, sa: int | None = None, like: str | None = None) -> dict | None:
    """guard() for a stage that builds the model itself: W (and SA, unless given, when the stage's
    coefficient uses it) from sizes(); `like`: sized by that stage's coefficients (memory.refusal)."""
    samples = int(schema.of(p).inputs.samples)
    w, meta_sa = sizes(p, model, samples, activations=sa is None and memory.COEFFICIENTS[like or stage][1] != 0)
    return memory.guard(stage, cell, model, w, sa if sa is not None else meta_sa, samples, like)


def sizes(p: dict, model: str, samples: int, activations: bool = True) -> tuple[int | None, int | None]:
    """(W, SA) of a torch model from a build on the meta device and one meta forward through the layer
    recorder per input shape, x `samples`; (None, None) when the model cannot be sized that way. An
    ONNX-file model: W is the file's size, SA unknown."""
    m = p["models"][model]
    if modelfiles.is_onnx_file(m):
        path = Path(str(m["arch"]["path"]))
        return (path.stat().st_size if path.is_file() else None), None
    # lazy: torch +1.84 s (BENCHMARKS 22) for torch models only; reference@ of an ONNX model imports this module
    import torch

    try:
        with torch.device("meta"):
            net = construct(m["arch"])
        w = sum(t.numel() * 4 for t in [*net.parameters(), *net.buffers()] if t.is_floating_point())
        if not activations:
            return w, None
        per = [_meta_outputs(net, inputspec.specs_for(m, lab)) for lab in inputspec.labels(m)]
    except Exception:  # noqa: BLE001 - a model meta cannot run is sized by what the stage records
        return None, None
    return w, sum(per) * samples


def _meta_outputs(net, specs: list[dict]) -> int:
    """fp32 bytes of the model's and every leaf call's floating outputs for one sample, on meta
    tensors. Data-dependent Python branches (`if mask.all():`, in transformers' mask helpers) read
    1 / True from a meta tensor while this runs; the override is removed afterwards."""
    # lazy: torch +1.84 s (BENCHMARKS 22) for torch models only; reference@ of an ONNX model imports this module
    import torch

    # lazy: torch +1.84 s (BENCHMARKS 22) for torch models only; reference@ of an ONNX model imports this module
    from parity.models.layers import LayerRecorder

    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
        lib.impl("_local_scalar_dense", lambda t: True if t.dtype == torch.bool else 1, "Meta")
    try:
        rec = LayerRecorder(net).eval()
        xs = [torch.empty(s["shape"], dtype=getattr(torch, s["dtype"]), device="meta") for s in specs]
        with torch.no_grad():
            outs = rec(*xs)
        for h in rec._handles:
            h.remove()
        return sum(o.numel() * 4 for o in outs if o.is_floating_point())
    finally:
        lib._destroy()
