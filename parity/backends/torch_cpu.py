"""PyTorch eager (CPU here; torch_cuda reuses it on a GPU). Precision modes (conf/dtypes `mode:`):
  cast      the model and floating inputs are cast with `.to(dtypes.<d>.torch)` (fp32, fp16, bf16)
  tf32      fp32 with TensorFloat-32 matmul/conv allowed (CUDA only; `fp32` keeps TF32 off)
  autocast  the model stays fp32 and runs under torch.autocast(dtype=dtypes.<d>.torch) (AMP)
Captured values are upcast to float32 (exact) for storage.

Own error (infer_own): two eager passes of the LayerRecorder at the cell's dtype and mode (autocast
context included). Pass A feeds each leaf call's first floating input from the reference
(`pre:<call>`, cast to the cell's dtype, a fresh tensor per pass since in-place modules overwrite it)
and records the leaf outputs (`<leaf>`: what this backend makes of the exact input). Pass B replaces
each leaf call's output by the reference's and records only each leaf's input (`between:<leaf>`: what
the ops between leaves make of exact leaf outputs; `between:output` for ops after the last leaf).
Both reuse LayerRecorder's call naming."""

from __future__ import annotations

import contextlib
import copy

import numpy as np
import torch

from parity.backends import ops
from parity.config import schema
from parity.core import store
from parity.backends.runner import Runner, interleave
from parity.models import build
from parity.models.layers import LayerRecorder, flatten, leaf_modules, output_names

TORCH_MODES = ("cast", "tf32", "autocast")


def set_tf32(torch, on: bool) -> None:
    """TF32 for matmul and cuDNN convolutions, on or off, through whichever API this torch has
    (torch >= 2.9: fp32_precision "tf32"/"ieee"; older: allow_tf32 flags). cuDNN's default is on,
    so fp32 cells must switch it off explicitly."""
    prec = "tf32" if on else "ieee"
    try:
        torch.backends.cuda.matmul.fp32_precision = prec
        torch.backends.cudnn.conv.fp32_precision = prec
    except (AttributeError, RuntimeError):
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on


class TorchRunner(Runner):
    device = "cpu"
    precision_modes = TORCH_MODES

    def _device(self) -> str:
        return (self.job.provider_cfg.get("options") or {}).get("device", self.device)

    def mode(self) -> str:
        return schema.mode(self.job.dtype_cfg)

    def _configure(self) -> None:
        """Threads, device, precision mode: what activate() and mixed() both need."""
        if self.job.threads:
            torch.set_num_threads(self.job.threads)
        self.torch = torch
        self.dev = self._device()
        mode = self.mode()
        if mode not in TORCH_MODES:
            raise ValueError(f"{type(self).__name__} has no precision mode '{mode}' "
                             f"(dtypes.{self.job.dtype}.mode). Valid: {', '.join(TORCH_MODES)}")
        if mode == "tf32" and not self.dev.startswith("cuda"):
            raise ValueError("mode tf32 needs a CUDA device (TF32 is an Ampere+ tensor-core format)")
        if self.dev.startswith("cuda"):
            set_tf32(torch, mode == "tf32")
            torch.backends.cudnn.benchmark = False
            torch.backends.cudnn.deterministic = True
        # autocast: weights and inputs stay fp32; the autocast context picks per-op precision
        self.amp = getattr(torch, self.job.dtype_cfg["torch"]) if mode == "autocast" else None
        self.dtype = torch.float32 if mode in ("autocast", "tf32") else getattr(torch, self.job.dtype_cfg["torch"])
        self.input_names = [s["name"] for s in self.job.model_cfg["input"]]

    def activate(self) -> None:
        self._configure()
        model = self.job.net if self.job.net is not None else build(self.job.model_cfg["arch"], self.job.seed)
        model = model.to(device=self.dev, dtype=self.dtype)
        self.rec = LayerRecorder(model).eval()

    # -- mixed precision (Runner.mixed): items are leaf module names --
    plan_items = "modules"

    def mixed(self, reduced, flip=()):
        """cast mode: every leaf module computes at its own dtype (the cell's, or float32 for `flip`
        when reduced; the reverse otherwise) on its floating inputs cast to that dtype, and its outputs
        stay in it (torch's type promotion then joins mixed operands of the ops between leaves). The
        model takes float32 inputs, as ORT's keep_io_types: a chain of float32 leaves, the first one
        included, sees no rounding. autocast mode: the model runs under autocast (reduced) or not; a
        `flip` leaf runs with autocast off on float32 inputs, or on with its outputs cast to float32."""
        if getattr(self, "_fp32_model", None) is None:
            self._configure()
            self._low = self.amp or self.dtype
            self._fp32_model = build(self.job.model_cfg["arch"], self.job.seed).to(device=self.dev)
        t, low, autocast = self.torch, self._low, self.mode() == "autocast"
        if self.mode() not in ("cast", "autocast") or low == t.float32:
            raise ValueError(f"{type(self).__name__}: no mixed precision for dtype {self.job.dtype} "
                             f"(mode {self.mode()}, {self.job.dtype_cfg['torch']})")
        model, flip = copy.deepcopy(self._fp32_model), set(flip)
        self.dtype, self.amp = t.float32, (low if autocast and reduced else None)
        if autocast:
            for name in sorted(flip):
                _run_at(t, model.get_submodule(name), t.float32 if reduced else None, t.float32, self.dev,
                        None if reduced else low)
        elif reduced or flip:  # (else: the plain float32 model)
            base = low if reduced else t.float32
            leaves = dict(leaf_modules(model))
            for m in model.modules():  # parameters of non-leaf modules (a class token) at the base dtype
                if m is not model and m not in leaves.values():
                    m._apply(lambda x: x.to(base) if x.is_floating_point() else x, recurse=False)
            for name, m in leaves.items():  # each leaf cast once from float32: kept ones stay exact
                at = (t.float32 if reduced else low) if name in flip else base
                _run_at(t, m.to(at), at, None, self.dev)
        self.rec = LayerRecorder(model).eval()

    def _ctx(self):
        if self.amp is None:
            return contextlib.nullcontext()
        return self.torch.autocast(device_type=self.dev.split(":")[0], dtype=self.amp)

    def _tensors(self, feeds):
        t = self.torch
        out = []
        for n in self.input_names:
            # parity.core.store hands out read-only views; torch needs a writable buffer (a copy only then)
            x = t.from_numpy(np.require(feeds[n], requirements=["C", "W"])).to(self.dev)
            out.append(x.to(self.dtype) if x.is_floating_point() else x)
        return out

    def _record(self, feeds):
        """(names, tensors) of one per-layer run. torch_compile overrides the callable."""
        self.rec.recording = True
        outs = self.rec(*self._tensors(feeds))
        return self.rec.names, outs

    def _plain(self, feeds):
        self.rec.recording = False
        return self.rec(*self._tensors(feeds))

    def infer(self, feeds):
        with self.torch.no_grad(), self._ctx():
            names, outs = self._record(feeds)
        return [(n, self._np(v)) for n, v in zip(names, outs)]

    def _np(self, v):
        v = v.detach().to("cpu")
        if v.dtype in (self.torch.float16, self.torch.bfloat16):
            v = v.float()
        return v.numpy()

    def infer_plain(self, feeds):
        with self.torch.no_grad(), self._ctx():
            out = self._plain(feeds)
        return [(n, self._np(v)) for n, v in zip(output_names(out), flatten(out))]

    own_unsupported = None

    def _ref(self, ref: dict, prefix: str) -> "_Feed":
        """Reference values whose names start with `prefix` (or, for "", every leaf output), by call
        name, each made a tensor at the model's dtype on its device when a hook asks for it: a fresh
        tensor per use (modules may modify them in place), one at a time (not a copy of the sample)."""
        if prefix:
            names = {n.removeprefix(prefix): n for n in ref if n.startswith(prefix)}
        else:
            names = {n: n for n in ref if not (store.is_pre(n) or store.is_output(n))}
        t = self.torch
        return _Feed(names, lambda n: t.from_numpy(np.array(ref[n])).to(self.dev, self.dtype))

    def infer_own(self, feeds, ref):
        rec = self.rec
        rec.enable_pre_hooks()
        rec.recording = True
        xs = self._tensors(feeds)
        try:
            with self.torch.no_grad(), self._ctx():
                rec.feed_inputs = self._ref(ref, store.PRE)  # pass A: leaves on reference inputs
                outs = rec(*xs)
                own = [(n, self._np(v)) for n, v in zip(rec.names, outs) if not store.is_output(n)]
                rec.feed_inputs, rec.inputs, rec.outputs = None, True, False
                rec.feed_outputs = self._ref(ref, "")  # pass B: between-leaf ops on reference outputs
                outs = rec(*xs)
        finally:
            rec.feed_inputs = rec.feed_outputs = None
            rec.inputs, rec.outputs = False, True
        between = {n.removeprefix(store.PRE): self._np(v) for n, v in zip(rec.names, outs) if store.is_pre(n)}
        between.update((n, self._np(v)) for n, v in zip(rec.names, outs) if store.is_output(n))
        return interleave(own, between)

    def deactivate(self) -> None:
        self.rec = None

    # -- the op-level hook (suites): eager torch at the cell's dtype, on options.device --
    op_grads = True

    def _op_inputs(self, side, args, kwargs):
        """The side and arguments at the cell's dtype on this runner's device."""
        dev = self._device()
        dev = None if dev == "cpu" else dev
        if dev is not None:
            args, kwargs = (ops.tmap(x, lambda t: t.to(dev)) for x in (args, kwargs))
        return ops.side_at(side, ops.TORCH_DTYPES[self.job.dtype], dev), args, kwargs

    def run_op(self, side, args, kwargs, grad=None):
        sd, args, kwargs = self._op_inputs(side, args, kwargs)
        with torch.no_grad():
            out, ms = ops.timed(lambda: ops.call(sd, args, kwargs), self.job.repeats)
        named = [(f"out:{n}", t) for n, t in ops.leaves(out)]
        if grad and self.op_grads:
            named += ops.grads(sd, args, kwargs, grad["loss"], grad["seed"])
        return named, ms, None


class TorchCpuRunner(TorchRunner):
    options_schema = {"device": ("cpu",)}
    op_gradcheck = True  # float64 gradcheck cases (suites) run on the CPU


class _Feed:
    """{call name: tensor} for LayerRecorder.feed_inputs / feed_outputs, converted on lookup."""

    def __init__(self, names: dict[str, str], make):
        self._names, self._make = names, make

    def __contains__(self, key) -> bool:
        return key in self._names

    def __getitem__(self, key):
        return self._make(self._names[key])


def _run_at(torch, module, dtype, out_dtype, device: str, amp=None) -> None:
    """Wrap `module.forward` (an instance attribute: nn.Module.__call__ then calls it, hooks stay):
    floating tensor arguments cast to `dtype`, floating outputs to `out_dtype` (None: as they come);
    it runs under torch.autocast(dtype=amp) on `device`, or with autocast off when amp is None."""
    fwd = module.forward

    def cast(x, to):
        if isinstance(x, torch.Tensor):
            return x.to(to) if to is not None and x.is_floating_point() else x
        if isinstance(x, (tuple, list)):
            return type(x)(cast(v, to) for v in x)
        return x

    def forward(*args, **kwargs):
        with torch.autocast(device_type=device.split(":")[0], dtype=amp, enabled=amp is not None):
            out = fwd(*cast(args, dtype), **{k: cast(v, dtype) for k, v in kwargs.items()})
        return cast(out, out_dtype)

    module.forward = forward
