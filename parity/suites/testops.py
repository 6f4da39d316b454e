"""Test ops for the `selftest` suite: kernels that misbehave on purpose, so the isolation, timeout
and status logic is tested on real processes. Also the seed MLP and custom autograd functions for
the gradient checks. Imported only inside suite workers (torch)."""

from __future__ import annotations

import os
import signal
import time

import torch
from torch import nn


def abort(x):
    """Kills its worker with SIGABRT (a C++ assertion in a kernel does this)."""
    os.abort()


def segfault(x):
    """Kills its worker with SIGSEGV (a bad kernel does this)."""
    os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(5)


def exit3(x):
    """The worker process exits with code 3 (a library calling exit())."""
    os._exit(3)


def sleep(x, seconds: float = 3600.0):
    """Sleeps past any per-case limit."""
    time.sleep(seconds)
    return x


def raises(x):
    """Fails everywhere, on the reference too: an invalid case."""
    raise ValueError("this op always fails")


def nan_below_fp32(x):
    """NaN where the dtype is not float32: a provider-only NaN."""
    return x * float("nan") if x.dtype != torch.float32 else x * 2


def nan_at_fp32(x):
    """NaN on the fp32 reference only: the reference cannot judge this case."""
    return x * float("nan") if x.dtype == torch.float32 else x * 2


def off_by_a_bit(x):
    """Right at fp32 (and at fp64, the oracle's), off by 1% below it: a MISMATCH on fp16/bf16."""
    return x if x.dtype in (torch.float32, torch.float64) else x * 1.01


def no_onnx(x):
    """Runs eagerly, refuses ONNX export."""
    if torch.onnx.is_in_onnx_export():
        raise RuntimeError("no ONNX symbolic for parity.suites.testops.no_onnx")
    return x + 1


class SeedMLP(nn.Module):
    """The seed MLP of the gradient-check acceptance line: Linear -> GELU -> Linear -> LayerNorm."""

    def __init__(self, d_in: int = 64, hidden: int = 256, d_out: int = 64):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, d_out)
        self.norm = nn.LayerNorm(d_out)

    def forward(self, x):
        return self.norm(self.fc2(self.act(self.fc1(x))))


class ScaledTanh(torch.autograd.Function):
    """y = 2 tanh(x), with a hand-written backward (correct)."""

    @staticmethod
    def forward(ctx, x):
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return 2 * y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * 2 * (1 - y * y)


class BadScaledTanh(ScaledTanh):
    """The same function with a wrong backward (forgets the factor 2): gradcheck must catch it."""

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * (1 - y * y)
