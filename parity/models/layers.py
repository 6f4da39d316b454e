"""Per-layer capture: forward hooks on leaf modules, shared by the reference, the torch runners
and the per-layer ONNX export, so every side names layers identically.

- Each captured tensor is `clone()`d in the hook: in-place ops after a layer (resnet's
  `ReLU(inplace=True)` on a BatchNorm output, `out += identity`) would otherwise overwrite the
  captured value (17 of resnet18's 60 values), identically in the exported ONNX graph, so a
  torch-vs-ORT compare would not notice.
- A module called more than once is named `name`, `name#1`, `name#2`, ... in call order.
- Tuple outputs give `name`, `name:1`, ...; non-float outputs are skipped.
- `inputs=True` also records each leaf call's first floating input (forward pre-hook, cloned before
  an in-place module overwrites it) as `pre:<call name>` (the fp64 reference: own error).
- `feed_inputs` / `feed_outputs` ({call name: tensor}) replace a call's first floating input (and
  any positional argument that is the same tensor) / its output by the given tensor: the torch
  runners' own-error passes (parity.backends). Other inputs of a multi-input leaf are not fed. The
  tensors are used as given (an in-place module or `out += identity` may modify them), so pass fresh
  ones for every run.
"""

from __future__ import annotations

import torch
from torch import nn

OUTPUT = "output"
PRE = "pre:"  # = parity.core.store.PRE (store is numpy-only; this module imports torch)


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
    """Wraps a model; forward returns (*model outputs, *leaf outputs in execution order), and with
    `inputs` the recorded leaf inputs (`pre:<call>`) interleaved, each before its call's outputs.

    `names` holds the matching names after each call; `recording = False` runs the bare model.
    """

    def __init__(self, model: nn.Module, inputs: bool = False):
        super().__init__()
        self.model = model.eval()
        self.recording = True
        self.inputs = inputs
        self.outputs = True  # record leaf outputs (off: only inputs, e.g. while outputs are fed)
        self.feed_inputs: dict[str, torch.Tensor] | None = None
        self.feed_outputs: dict[str, torch.Tensor] | None = None
        self.names: list[str] = []
        self._buf: list[tuple[str, torch.Tensor]] | None = None
        self._calls: dict[str, int] = {}
        self._handles = [m.register_forward_hook(self._hook(n)) for n, m in leaf_modules(model)]
        self._pre_handles: list | None = None
        if inputs:
            self.enable_pre_hooks()

    def enable_pre_hooks(self) -> None:
        """Register the forward pre-hooks (input recording, input feeding); off by default so the
        exported and compiled graphs trace exactly the hooks they always did."""
        if self._pre_handles is None:
            self._pre_handles = [m.register_forward_pre_hook(self._pre_hook(n))
                                 for n, m in leaf_modules(self.model)]

    def remove_hooks(self) -> None:
        """Detach this recorder from the model (another recorder may wrap the same model next)."""
        for h in self._handles + (self._pre_handles or []):
            h.remove()
        self._handles, self._pre_handles = [], None

    @staticmethod
    def call_name(name: str, k: int) -> str:
        """The k-th call (from 0) of leaf module `name`: `name`, `name#1`, ..."""
        base = name if k == 0 else f"{name}#{k}"
        if base == OUTPUT or base.startswith(OUTPUT + ":"):
            base = f"{base}(module)"
        return base

    def _pre_hook(self, name: str):
        def hook(module, args):
            if self._buf is None:
                return None
            i = next((j for j, a in enumerate(args)
                      if isinstance(a, torch.Tensor) and a.is_floating_point()), None)
            if i is None:
                return None
            base = self.call_name(name, self._calls.get(name, 0))
            if self.inputs:
                self._buf.append((PRE + base, args[i].clone()))
            if self.feed_inputs is not None and base in self.feed_inputs:
                # every positional argument that *is* that input (self-attention's q, k, v = x, x, x)
                rep = self.feed_inputs[base]
                return tuple(rep if a is args[i] else a for a in args)
            return None
        return hook

    def _hook(self, name: str):
        def hook(module, args, out):
            if self._buf is None:
                return None
            k = self._calls.get(name, 0)
            self._calls[name] = k + 1
            base = self.call_name(name, k)
            if self.outputs:
                tensors = [t for t in flatten(out) if t.is_floating_point()]
                for i, t in enumerate(tensors):
                    self._buf.append((base if i == 0 else f"{base}:{i}", t.clone()))
            if self.feed_outputs is not None:
                return _replaced(out, base, self.feed_outputs)
            return None
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


def _replaced(out, base: str, feed: dict):
    """`out` (a tensor or a tuple/list of tensors) with its floating tensors replaced by
    feed[`base`], feed[`base:1`], ... where given; None (keep) when nothing was replaced."""
    if isinstance(out, torch.Tensor):
        return feed[base] if out.is_floating_point() and base in feed else None
    if not isinstance(out, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in out):
        return None
    new, i, hit = [], 0, False
    for t in out:
        if t.is_floating_point():
            key = base if i == 0 else f"{base}:{i}"
            i += 1
            if key in feed:
                t, hit = feed[key], True
        new.append(t)
    return type(out)(new) if hit else None


def module_types(model: nn.Module) -> dict[str, str]:
    return {n: type(m).__name__ for n, m in leaf_modules(model)}
