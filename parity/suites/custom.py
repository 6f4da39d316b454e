"""User ops against the user's reference, and fuzzed tensor layouts/values. Heavy (torch); imported
only in suite workers, from parity.suites.execute, when a case asks for it.

A case `{op: import:pkg.ops:my_gelu, reference: import:pkg.ref:gelu64, inputs: [x], grad: true}`
runs `my_gelu` on the provider at the cell's dtype and `gelu64` in float64 on the same (dtype-rounded)
inputs. The reference may be torch code (then its gradients come from autograd, in float64) or numpy
code (it receives CPU float64 tensors, which numpy reads as arrays; gradients then come from central
finite differences in float64, at most FD_MAX_ELEMENTS input elements). Outputs and gradients are
named as the built-in reference names them (`out:0`, `grad:in.0`), so the suite diff compares them
with the case's `out`/`grad` tolerances.
"""

from __future__ import annotations

import numpy as np
import torch

from parity.backends import ops
from parity.backends.runner import OpSkip

FD_MAX_ELEMENTS = 4096  # finite differences cost two reference calls per input element
FD_EPS = 1e-6


def put_nonfinite(a: np.ndarray, counts: dict, rng: np.random.Generator) -> None:
    """NaN, +Inf and -Inf (alternating) at seeded distinct positions of a float array, in place."""
    flat = a.reshape(-1)
    n_nan, n_inf = int(counts.get("nan", 0)), int(counts.get("inf", 0))
    k = min(flat.size, n_nan + n_inf)
    pos = rng.choice(flat.size, size=k, replace=False)
    for j, i in enumerate(pos):
        flat[i] = np.nan if j < n_nan else (np.inf if (j - n_nan) % 2 == 0 else -np.inf)


def with_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values with other strides: transposed (last two axes swapped in memory, so the
    tensor is not contiguous) or channels_last (4-D)."""
    if layout == "transposed":
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "channels_last":
        return t.contiguous(memory_format=torch.channels_last)
    return t


def _as_tensor(obj):
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, np.ndarray) or np.isscalar(obj):
        return torch.from_numpy(np.asarray(obj, dtype=np.float64) if np.asarray(obj).dtype.kind == "f"
                                else np.asarray(obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_as_tensor(v) for v in obj)
    if isinstance(obj, dict):
        return {k: _as_tensor(v) for k, v in obj.items()}
    return obj


def run_reference(fn, args, kwargs, gcase) -> tuple[list, float]:
    """(named outputs [+ gradients], median ms) of a case's `reference` callable in float64."""
    a64 = ops.tmap(args, lambda t: t.double() if t.is_floating_point() else t)
    k64 = ops.tmap(kwargs, lambda t: t.double() if t.is_floating_point() else t)
    with torch.no_grad():
        out, ms = ops.timed(lambda: _as_tensor(fn(*a64, **k64)), 1)
    named = [(f"out:{n}", t) for n, t in ops.leaves(out)]
    if gcase:
        g = []
        try:
            g = ops.grads((fn, None, [], {}), a64, k64, gcase["loss"], gcase["seed"])
        except RuntimeError:  # numpy code on tensors that require grad: no autograd path
            g = []
        named += g or _fd_grads(fn, a64, k64, gcase)
    return named, ms


def _objective(fn, args, kwargs, loss: str, seed: int) -> float:
    """The scalar ops.grads differentiates: sum(out x cotangent) or MSE against a seeded target."""
    out = _as_tensor(fn(*args, **kwargs))
    g = torch.Generator().manual_seed(seed)
    total = 0.0
    for _, o in ops.leaves(out):
        if not o.is_floating_point():
            continue
        r = torch.randn(o.shape, generator=g, dtype=torch.float32).double()
        o = o.double()
        total += float(((o - r) ** 2).mean() if loss == "mse" else (o * r).sum())
    return total


def _fd_grads(fn, args, kwargs, gcase) -> list:
    """Central finite differences of _objective w.r.t. every float input element (float64)."""
    leaves = [(f"in.{n}", t) for n, t in ops.leaves(args) if t.is_floating_point()]
    leaves += [(f"kw.{n}", t) for n, t in ops.leaves(kwargs) if t.is_floating_point()]
    if sum(t.numel() for _, t in leaves) > FD_MAX_ELEMENTS:
        raise OpSkip("INVALID", f"finite-difference gradients of a numpy reference are limited to "
                                          f"{FD_MAX_ELEMENTS} input elements (parity.suites.custom)")
    out = []
    with torch.no_grad():
        for name, t in leaves:
            flat = t.view(-1) if t.is_contiguous() else None
            if flat is None:
                raise OpSkip("INVALID", "finite differences need contiguous inputs")
            g = torch.zeros_like(flat)
            for i in range(flat.numel()):
                x0 = float(flat[i])
                h = FD_EPS * max(1.0, abs(x0))
                flat[i] = x0 + h
                fp = _objective(fn, args, kwargs, gcase["loss"], gcase["seed"])
                flat[i] = x0 - h
                fm = _objective(fn, args, kwargs, gcase["loss"], gcase["seed"])
                flat[i] = x0
                g[i] = (fp - fm) / (2 * h)
            out.append((f"grad:{name}", g.view(t.shape)))
    return out

