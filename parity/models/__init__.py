"""Model building: every model is built from its `arch` params and the seed, deterministically.

torch is imported inside the functions, so importing this package stays light.
"""

from __future__ import annotations


def build(arch: dict, seed: int):
    """Return the model in eval mode, fp32, with seeded weights.

    Linear/Conv weights that start all zero (vit_b_16's classification head under weights=None)
    are re-initialised from the same seed, so no output is trivially all zeros.
    """
    import torch

    torch.manual_seed(seed)
    source, name, kwargs = arch["source"], arch["name"], dict(arch.get("kwargs") or {})
    if source == "parity":
        from parity.models import zoo

        model = zoo.BUILDERS[name](**kwargs)
    elif source == "torchvision":
        from parity.models.tv_compat import import_torchvision

        tv = import_torchvision()
        available = tv.models.list_models()
        if name not in available:
            raise ValueError(f"unknown torchvision model '{name}'. Available: {', '.join(available)}")
        model = tv.models.get_model(name, weights=None, **kwargs)
    elif source == "import":
        import importlib

        mod, _, attr = name.partition(":")
        model = getattr(importlib.import_module(mod), attr)(**kwargs)
    else:
        raise ValueError(f"unknown model source '{source}'")
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in model.modules():
            w = getattr(m, "weight", None)
            if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d, torch.nn.Conv1d)) and w is not None \
                    and not torch.count_nonzero(w):
                w.normal_(0.0, 0.02, generator=gen)
    return model.eval()


def example_inputs(input_specs: list[dict], arrays: dict):
    """Torch tensors (in spec order) from the numpy arrays of one sample."""
    import torch

    return tuple(torch.from_numpy(arrays[s["name"]].copy()) for s in input_specs)
