"""Op-level calls shared by the runners' op hooks (Runner.run_op) and the suite harness
(parity.suites.execute). Heavy: imports torch, so only runner methods and suite workers import it.

A side is one callable of a case: (fn, module or None, extra args, extra kwargs).
"""

from __future__ import annotations

import copy
import statistics
import time
import traceback
from pathlib import Path

import numpy as np
import torch

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "float64": torch.float64}


def reason_of(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    msg = str(e).strip().splitlines()
    first = msg[0][:300] if msg else ""
    return f"{type(e).__name__}: {first}{where}"


def tmap(obj, f):
    """Apply f to every tensor leaf of nested lists/tuples/dicts."""
    if isinstance(obj, torch.Tensor):
        return f(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(tmap(v, f) for v in obj)
    if isinstance(obj, dict):
        return {k: tmap(v, f) for k, v in obj.items()}
    return obj


def leaves(obj, prefix="") -> list[tuple[str, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        return [(prefix or "0", obj)]
    out = []
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out += leaves(v, f"{prefix}.{i}" if prefix else str(i))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out += leaves(v, f"{prefix}.{k}" if prefix else str(k))
    return out


def to_dtype(x: torch.Tensor, dt) -> torch.Tensor:
    return x.to(dt) if x.is_floating_point() else x


def as_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.is_floating_point():
        t = t.float()
    return t.contiguous().numpy().copy()


def call(side, args, kwargs):
    fn, mod, ea, ek = side
    if mod is not None:
        return mod(*args, **kwargs)
    return fn(*args, *ea, **kwargs, **ek)


def side_at(side, dt, device=None):
    """A copy of a side whose module parameters (and extra tensors) are at dtype dt (on `device`)."""
    fn, mod, ea, ek = side

    def move(t):
        t = to_dtype(t, dt)
        return t.to(device) if device is not None else t

    if mod is None:
        return (fn, None, tmap(ea, move), tmap(ek, move))
    m = copy.deepcopy(mod).to(dt)
    if device is not None:
        m = m.to(device)
    return (m, m, ea, ek)


def timed(f, repeats: int):
    t0 = time.perf_counter_ns()
    out = f()
    ms = [(time.perf_counter_ns() - t0) / 1e6]
    for _ in range(max(0, repeats - 1)):
        t0 = time.perf_counter_ns()
        f()
        ms.append((time.perf_counter_ns() - t0) / 1e6)
    return out, statistics.median(ms)


def grads(side, args, kwargs, loss: str, seed: int) -> list[tuple[str, torch.Tensor]]:
    """Backward of sum(out * cotangent) (or MSE against a seeded target) w.r.t. float inputs and
    module parameters. The cotangent is float32 and seeded, the same on both sides."""
    ins = []

    def req(t):
        if t.is_floating_point():
            t = t.detach().clone().requires_grad_(True)
            ins.append(t)
        return t

    a, k = tmap(args, req), tmap(kwargs, req)
    names = ([f"in.{n}" for n, t in leaves(args) if t.is_floating_point()]
             + [f"kw.{n}" for n, t in leaves(kwargs) if t.is_floating_point()])
    params = [(n, p) for n, p in side[1].named_parameters()] if side[1] is not None else []
    out = call(side, a, k)
    outs = [t for _, t in leaves(out) if t.is_floating_point() and t.requires_grad]
    if not outs or not (ins or params):
        return []
    g = torch.Generator().manual_seed(seed)
    total = 0
    for o in outs:
        r = torch.randn(o.shape, generator=g, dtype=torch.float32).to(o.device)
        total = total + (((o.float() - r) ** 2).mean() if loss == "mse" else (o.float() * r).sum())
    wrt = ins + [p for _, p in params]
    gs = torch.autograd.grad(total, wrt, allow_unused=True)
    labels = [f"grad:{n}" for n in names] + [f"grad:param.{n}" for n, _ in params]
    return [(lab, gg) for lab, gg in zip(labels, gs) if gg is not None]


class Wrap(torch.nn.Module):
    """A side as a module taking its tensors positionally (what torch.onnx.export traces)."""

    def __init__(self, side, template_args, template_kwargs):
        super().__init__()
        self.side = side
        if side[1] is not None:
            self.mod = side[1]
        self.ta, self.tk = template_args, template_kwargs

    def forward(self, *tensors):
        it = iter(tensors)
        a = tmap(self.ta, lambda t: next(it))
        k = tmap(self.tk, lambda t: next(it))
        return call(self.side, a, k)
