"""Per-layer capture: forward hooks on leaf modules, shared by the reference, the torch runners
and the per-layer ONNX export, so every side names layers identically.

- Each captured tensor is `clone()`d in the hook: in-place ops after a layer (resnet's
  `ReLU(inplace=True)` on a BatchNorm output, `out += identity`) would otherwise overwrite the
  captured value (17 of resnet18's 60 values), identically in the exported ONNX graph, so a
  torch-vs-ORT compare would not notice.
- A module called more than once is named `name`, `name#1`, `name#2`, ... in call order.
- Tuple outputs give `name`, `name:1`, ...; non-float outputs are skipped.
"""

from __future__ import annotations

import torch
from torch import nn

OUTPUT = "output"


def leaf_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if n and next(m.children(), None) is None]


def output_names(out) -> list[str]:
    n = len(flatten(out))
    return [OUTPUT] if n == 1 else [f"{OUTPUT}:{i}" for i in range(n)]


def flatten(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in flatten(o)]
    if isinstance(out, dict):
        return [t for k in sorted(out) for t in flatten(out[k])]
    return []


class LayerRecorder(nn.Module):
    """Wraps a model; forward returns (*model outputs, *leaf outputs in execution order).

    `names` holds the matching names after each call; `recording = False` runs the bare model.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model.eval()
        self.recording = True
        self.names: list[str] = []
        self._buf: list[tuple[str, torch.Tensor]] | None = None
        self._calls: dict[str, int] = {}
        self._handles = [m.register_forward_hook(self._hook(n)) for n, m in leaf_modules(model)]

    def _hook(self, name: str):
        def hook(module, args, out):
            if self._buf is None:
                return
            k = self._calls.get(name, 0)
            self._calls[name] = k + 1
            base = name if k == 0 else f"{name}#{k}"
            if base == OUTPUT or base.startswith(OUTPUT + ":"):
                base = f"{base}(module)"
            tensors = [t for t in flatten(out) if t.is_floating_point()]
            for i, t in enumerate(tensors):
                self._buf.append((base if i == 0 else f"{base}:{i}", t.clone()))
        return hook

    def forward(self, *inputs):
        if not self.recording:
            return self.model(*inputs)
        self._buf, self._calls = [], {}
        try:
            out = self.model(*inputs)
            outs = flatten(out)
            self.names = output_names(out) + [n for n, _ in self._buf]
            return tuple(outs) + tuple(t for _, t in self._buf)
        finally:
            self._buf = None


def module_types(model: nn.Module) -> dict[str, str]:
    return {n: type(m).__name__ for n, m in leaf_modules(model)}
