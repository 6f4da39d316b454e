"""torch.compile (TorchInductor by default) on CPU or CUDA (`options.device`), per layer and plain.

Per-layer values come from the LayerRecorder wrapper compiled as a whole (its forward hooks and
clones are traced by Dynamo), so the layer outputs are what the compiled graph computes; the plain
run compiles the bare model (what ships). Two kinds of inconsistency with eager are kept apart:
- behaviour: compiling raises (Dynamo/Inductor/backend error) -> status COMPILE_FAIL with the
  compiler's exception; the compiled code raising at run time -> INFER_FAIL (the eager reference of
  the same model ran, so either one is a compiler inconsistency, not a model bug);
- numerical: the diff's verdict (FAIL/PASS) per layer; with `reference.fp64: true` the diff also
  says which side (eager fp32 reference or compiled) is closer to the fp64 golden run (RMSE, as
  torch._dynamo.utils.same does).
Compilation happens on the first call (and on recompiles), so a compile failure surfaces from infer().
"""

from __future__ import annotations

import getpass
import os
import tempfile

import torch

from parity.backends import ops
from parity.backends.runner import CompileError, OpSkip
from parity.backends.torch_cpu import TorchRunner
from parity.backends.torch_cuda import cuda_availability

# modules whose exceptions mean "the compiler failed", not "the model failed"
COMPILER_MODULES = ("torch._dynamo", "torch._inductor", "torch._functorch", "torch.fx", "torch._subclasses")


def _is_compiler_error(e: BaseException) -> bool:
    for x in (e, e.__cause__, e.__context__):
        if x is not None and type(x).__module__.startswith(COMPILER_MODULES):
            return True
    return False


# the Inductor cache folder in use before isolate_autocast_cache() gave each autocast dtype its own
CACHE_BASE_ENV = "PARITY_INDUCTOR_CACHE_BASE"


def isolate_autocast_cache(amp) -> str:
    """Give each autocast dtype its own Inductor cache folder (a subfolder of the one in use) and return it.
    torch 2.11's AOTAutograd cache key records whether autocast is on, not its dtype (pytorch PR 181564):
    a graph compiled under autocast(float16) is served from the on-disk cache to a process running under
    autocast(bfloat16), so an amp_bf16 cell silently computes in fp16 (seen on an H200 and on the CPU
    with torch 2.11, docs/gpu-verification.md; torch 2.13 keys the dtype)."""
    base = os.environ.get(CACHE_BASE_ENV)
    if not base:
        try:
            # lazy: Inductor's internals, only for autocast cells; the module moved between torch releases
            from torch._inductor.runtime.cache_dir_utils import cache_dir
            base = cache_dir()
        except ImportError:  # an older layout: Inductor's own default
            base = os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
        os.environ[CACHE_BASE_ENV] = base
    folder = os.path.join(base, "autocast-" + str(amp).removeprefix("torch."))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    return folder


class TorchCompileRunner(TorchRunner):
    device = "cpu"
    options_schema = {"device": "torch_device", "backend": "string", "fullgraph": "bool", "dynamic": "bool",
                      "mode": (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")}
    # the own-error passes feed/replace values through module hooks; a compiled graph does not run
    # them per call (Dynamo traces them once, with the values guarded), so no own values here
    own_unsupported = ("torch.compile: own error not measured (the hooks that feed reference values "
                       "to each leaf do not survive compilation); accumulated error only")
    plan_items = None  # no mixed-precision plan (Runner.mixed): the plan runs torch_cpu's eager model

    @classmethod
    def availability(cls, job):
        dev = (job.provider_cfg.get("options") or {}).get("device", cls.device)
        if dev.startswith("cuda"):
            return cuda_availability(dev)
        return None

    op_grads = False  # gradients of suite cases come from eager torch (torch_cpu)
    op_gradcheck = False

    def _compile_kwargs(self) -> dict:
        o = self.job.provider_cfg.get("options") or {}
        kw = {"backend": o.get("backend", "inductor"), "fullgraph": bool(o.get("fullgraph", False)),
              "dynamic": bool(o.get("dynamic", False))}
        if o.get("mode"):
            kw["mode"] = o["mode"]
        return kw

    def activate(self) -> None:
        super().activate()
        if self.amp is not None:
            isolate_autocast_cache(self.amp)
        kw = self._compile_kwargs()
        torch = self.torch
        torch._dynamo.reset()  # no cached graphs from another cell in this process
        try:
            self.compiled_rec = torch.compile(self.rec, **kw)
            self.compiled_plain = torch.compile(self.rec.model, **kw)
        except Exception as e:  # bad options fail here; tracing happens at the first call
            raise CompileError(f"torch.compile({', '.join(f'{k}={v!r}' for k, v in kw.items())})") from e

    def _call(self, which: str, fn, *args):
        try:
            return fn(*args)
        except Exception as e:  # a (re)compilation error is COMPILE_FAIL; anything else INFER_FAIL
            if _is_compiler_error(e):
                raise CompileError(f"compiling the {which} graph failed") from e
            raise

    def _record(self, feeds):
        self.rec.recording = True
        outs = self._call("per-layer", self.compiled_rec, *self._tensors(feeds))
        return self.rec.names, outs

    def _plain(self, feeds):
        return self._call("plain", self.compiled_plain, *self._tensors(feeds))

    def deactivate(self) -> None:
        self.compiled_rec = self.compiled_plain = None
        super().deactivate()

    def run_op(self, side, args, kwargs, grad=None):
        """The op compiled with the provider's options (a compiler error: COMPILE_FAIL)."""
        sd, args, kwargs = self._op_inputs(side, args, kwargs)
        compiled = torch.compile(lambda *a, **k: ops.call(sd, a, k), **self._compile_kwargs())
        try:
            with torch.no_grad():
                out = compiled(*args, **kwargs)
        except Exception as e:
            if _is_compiler_error(e):
                raise OpSkip("COMPILE_FAIL", ops.reason_of(e)) from None
            raise
        with torch.no_grad():
            _, ms = ops.timed(lambda: compiled(*args, **kwargs), self.job.repeats)
        return [(f"out:{n}", t) for n, t in ops.leaves(out)], ms, None
