"""The runner interface (after Polygraphy's BaseRunner: activate / infer / deactivate).

The base class owns the lifecycle and turns every failure into a status with a reason, so a
failing cell is a result, not a crashed pipeline:
  OK           ran; the per-layer values were captured
  UNSUPPORTED  the provider does not declare this dtype (conf/providers/<p>.yaml `dtypes:`)
  UNAVAILABLE  the backend cannot run on this machine (library or device missing)
  EXPORT_FAIL  preparing the model for this backend failed (conversion, quantization, session or engine
               build)
  COMPILE_FAIL a compiler (torch.compile / Inductor) raised while compiling a model that runs eagerly:
               a behaviour inconsistency, reported apart from numerical ones (those give verdict FAIL)
  INFER_FAIL   running it failed
A subclass overrides only the hooks it needs.
"""

from __future__ import annotations

import statistics
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Collection

import numpy as np

from parity.store import PLAIN

STATUSES = ("OK", "UNSUPPORTED", "UNAVAILABLE", "EXPORT_FAIL", "COMPILE_FAIL", "INFER_FAIL")


class Unavailable(RuntimeError):
    """Raised from activate() when the backend turns out not to run here after all (e.g. onnxruntime
    lists CUDAExecutionProvider but the session fell back to CPU): status UNAVAILABLE, not a failure."""


class CompileError(RuntimeError):
    """Raised by a runner (from activate or infer) when its compiler, not the model, failed:
    run_capture records COMPILE_FAIL with the compiler's exception as the reason."""


@dataclass
class CaptureJob:
    model: str
    model_cfg: dict
    dtype: str
    dtype_cfg: dict
    provider: str
    provider_cfg: dict
    model_dir: Path          # the export stage's output: model.onnx, layers.onnx, layers.json
    seed: int = 0
    threads: int = 0
    # INT8 calibration samples (inputs stage, --calibration; separate from the evaluated samples)
    calibration: Path | None = None
    # a prebuilt engine (engine stage output) for providers with `engine: true`
    engine_dir: Path | None = None


@dataclass
class CaptureResult:
    status: str
    reason: str = ""
    # per sample: (name, array) with the model outputs first, then layers in execution order, then
    # the plain graph's outputs (plain:output)
    samples: list[list[tuple[str, np.ndarray]]] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)
    warmup: int = 0


class Runner:
    """One backend at one dtype. Lifecycle: availability() -> activate() -> infer()* -> deactivate()."""

    def __init__(self, job: CaptureJob):
        self.job = job
        self.is_active = False

    @classmethod
    def availability(cls, job: CaptureJob) -> str | None:
        """None if this runner can run here, else the reason it cannot."""
        return None

    def activate(self) -> None:
        """Load/convert/build the model for this backend at job.dtype."""

    def infer(self, feeds: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
        """Per-layer run: (name, value) for the model outputs then every captured layer."""
        raise NotImplementedError

    def infer_plain(self, feeds: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
        """The shipped model alone (no extra outputs): its outputs, as (name, value). Timed for
        latency, and compared too, since extra outputs can change what a backend fuses."""
        raise NotImplementedError

    def deactivate(self) -> None:
        """Release sessions/devices."""

    # Mixed precision (the plan stage, parity/analysis/plan.py). `plan_items` says what mixed() takes:
    # "modules" (leaf module names: torch runners), "onnx_nodes" (node names of the plain graph,
    # model.onnx: ORT runners), or None (this backend cannot run a mixed model).
    plan_items: str | None = None

    def mixed(self, reduced: bool, flip: Collection[str] = ()) -> None:
        """Prepare the plain model (what infer_plain runs) with every item at the cell's precision
        (reduced=True) or at float32 (reduced=False), except the items in `flip`, which take the other
        one. mixed(True, keep) applies a keep-in-fp32 list; mixed(False, [layer's items]) runs only
        that layer at the cell's precision (a sensitivity probe); mixed(False) is the plain fp32 model
        on this backend. Called instead of activate(), any number of times; deactivate() after."""
        raise NotImplementedError(f"{type(self).__name__} has no mixed-precision hook (Runner.mixed)")


def _reason(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    return f"{type(e).__name__}: {e}{where}".strip()


def _cause(e: CompileError) -> str:
    """The compiler's own exception (the CompileError's __cause__) when there is one."""
    inner = e.__cause__
    return f"{e}: {_reason(inner)}" if inner is not None else _reason(e)


def run_capture(cls: type[Runner], job: CaptureJob, feeds: list[dict[str, np.ndarray]],
                warmup: int, repeats: int) -> CaptureResult:
    supported = job.provider_cfg.get("dtypes", [])
    if job.dtype not in supported:
        return CaptureResult("UNSUPPORTED", f"provider {job.provider} supports dtypes {supported}, "
                                            f"not {job.dtype} (conf/providers/{job.provider}.yaml)")
    try:
        why = cls.availability(job)
    except Exception as e:  # an availability probe that raises means: not available
        why = _reason(e)
    if why:
        return CaptureResult("UNAVAILABLE", why)
    runner = cls(job)
    try:
        runner.activate()
        runner.is_active = True
    except Unavailable as e:
        return CaptureResult("UNAVAILABLE", str(e))
    except CompileError as e:
        return CaptureResult("COMPILE_FAIL", _cause(e))
    except Exception as e:
        return CaptureResult("EXPORT_FAIL", _reason(e))
    try:
        try:
            samples = [[(n, np.asarray(v)) for n, v in runner.infer(f)] for f in feeds]
        except CompileError as e:
            return CaptureResult("COMPILE_FAIL", _cause(e))
        except Exception as e:
            return CaptureResult("INFER_FAIL", _reason(e))
        try:
            for named, f in zip(samples, feeds):
                named += [(PLAIN + n, np.asarray(v)) for n, v in runner.infer_plain(f)]
        except CompileError as e:
            return CaptureResult("COMPILE_FAIL", "plain-graph compile failed: " + _cause(e), samples)
        except Exception as e:
            return CaptureResult("INFER_FAIL", "plain-graph run failed: " + _reason(e), samples)
        lat = []
        try:
            for _ in range(warmup):
                runner.infer_plain(feeds[0])
            for _ in range(repeats):
                t0 = time.perf_counter_ns()
                runner.infer_plain(feeds[0])
                lat.append((time.perf_counter_ns() - t0) / 1e6)
        except Exception as e:
            return CaptureResult("INFER_FAIL", "plain-graph run failed: " + _reason(e), samples)
        return CaptureResult("OK", "", samples, lat, warmup)
    finally:
        runner.deactivate()
        runner.is_active = False


def latency_stats(ms: list[float]) -> dict:
    if not ms:
        return {}
    s = sorted(ms)
    return {"median_ms": statistics.median(s), "p90_ms": s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))],
            "min_ms": s[0], "max_ms": s[-1], "repeats": len(s)}
