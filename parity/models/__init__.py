"""Model building: every model is built from its `arch` params and the seed, deterministically.

torch is imported inside the functions, so importing this package stays light.
"""

from __future__ import annotations

import importlib

from parity.config import schema
from parity.models import hf
from parity.models.tv_compat import import_torchvision


def build(arch: dict, seed: int):
    """Return the model in eval mode, fp32, with seeded weights, or trained ones: a Hugging Face
    checkpoint (`arch.source: hf` with `arch.path`: parity.models.hf.from_checkpoint) or a state-dict
    file (`arch.weights`: parity.models.weights) replaces the seeded init, and then neither the
    re-initialisation nor the BatchNorm calibration below runs over it.

    Linear/Conv weights that start all zero (vit_b_16's classification head under weights=None)
    are re-initialised from the same seed, so no output is trivially all zeros.

    `arch.calibrate: {shape: [N, ...]}` sets every BatchNorm's running stats from one seeded N(0, 1)
    batch (computed in float64, so the stats do not depend on thread count). Untrained convnets
    otherwise run BatchNorm as the identity, and activations vanish (efficientnet_b0 output ~1e-14,
    depthwise convs get kaiming fan_out = C*k*k) or grow with depth (resnet50 layer4 ~1e2).
    """
    # lazy: torch +1.84 s (BENCHMARKS 22) in every stage importing parity.models.onnx_weights/onnx_cut (ORT)
    import torch

    torch.manual_seed(seed)
    if arch["source"] == "hf" and arch.get("path"):
        return hf.from_checkpoint(str(arch["path"]), arch.get("head", schema.Arch.head), arch.get("kwargs"))
    model = construct(arch)
    if arch.get("weights"):
        from parity.models import weights  # lazy: only a model with a weights file reads one

        weights.load_into(model, arch["weights"])
        return model.eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in model.modules():
            w = getattr(m, "weight", None)
            if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d, torch.nn.Conv1d)) and w is not None \
                    and not torch.count_nonzero(w):
                w.normal_(0.0, 0.02, generator=gen)
    calib = arch.get("calibrate")
    if calib:
        _calibrate_bn(model, calib["shape"], seed)
    return model.eval()


def construct(arch: dict):
    """The model of `arch`, as its source builds it (no seeding, no re-initialisation, no calibration,
    no trained weights: a checkpoint's architecture from its config.json): under `torch.device("meta")`
    it allocates nothing (parity.core.memory sizes a model that way)."""
    source, name, kwargs = arch["source"], arch.get("name", ""), dict(arch.get("kwargs") or {})
    if source == "hf" and arch.get("path"):
        return hf.checkpoint_config(str(arch["path"]), arch.get("head", schema.Arch.head), kwargs)
    if source == "parity":
        from parity.models import zoo  # lazy: zoo loads torch (as below); ORT stages import parity.models.onnx_weights

        model = zoo.BUILDERS[name](**kwargs)
    elif source == "torchvision":
        tv = import_torchvision()
        available = tv.models.list_models()
        if name not in available:
            raise ValueError(f"unknown torchvision model '{name}'. Available: {', '.join(available)}")
        model = tv.models.get_model(name, weights=None, **kwargs)
    elif source == "hf":
        model = hf.build(name, kwargs, arch.get("head", schema.Arch.head))
    elif source == "import":
        # lazy: torch +1.84 s (BENCHMARKS 22) in every stage importing parity.models.onnx_weights/onnx_cut (ORT)
        import torch

        mod, _, attr = name.partition(":")
        model = getattr(importlib.import_module(mod), attr)(**kwargs)
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"'{name}' returned a {type(model).__name__}, not a torch.nn.Module")
    else:
        raise ValueError(f"unknown model source '{source}'")
    return model


def _calibrate_bn(model, shape, seed: int) -> None:
    # lazy: torch +1.84 s (BENCHMARKS 22) in every stage importing parity.models.onnx_weights/onnx_cut (ORT)
    import torch

    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed + 2), dtype=torch.float64)
    saved = [m.momentum for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # cumulative average: one batch gives exactly its own mean/var
    model.double().eval()
    for m in bns:
        m.train()  # only BatchNorm: dropout / stochastic depth stay off
    with torch.no_grad():
        model(x)
    for m, mom in zip(bns, saved):
        m.momentum = mom
    model.float().eval()
