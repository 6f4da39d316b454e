"""The capture driver: one model cell through a Runner (parity.backends.runner), every failure a status.

run_capture checks what the cell asks against what the runner declares (an ONNX-file model, the
provider's dtypes, the runner's precision modes, availability), then activates it, runs the plain
graph on every sample (and its latency), the per-layer graph sample by sample into a CaptureSink, and
the own-error hook, and deactivates it whatever happened. Exceptions become statuses (runner.py lists
them): the runner raises, the driver decides what it means.

Own error (optional): with `CaptureJob.reference` (the fp64 reference, fp64.parquet, with the leaf
inputs `pre:<call>`), run_capture also calls `infer_own` per sample: each leaf run on the reference's
input to it (`<leaf>`), and the ops between leaves run on the reference's leaf outputs
(`between:<leaf>`). A runner without it (`own_unsupported` says why) has no own values: the diff falls
back to accumulated error. An own-error failure never fails the cell (CaptureResult.own_reason).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from parity.backends.loader import lazy_gold_samples, reference_samples
from parity.backends.runner import (CaptureJob, CaptureResult, CompileError, Runner, SessionError, Unavailable,
                                    error_reason)
from parity.config import params as config
from parity.config import schema
from parity.core import modelfiles, store
from parity.core.store import PLAIN

def _cause(e: CompileError) -> str:
    """The compiler's own exception (the CompileError's __cause__) when there is one."""
    inner = e.__cause__
    return f"{e}: {error_reason(inner)}" if inner is not None else error_reason(e)


def run_capture(cls: type[Runner], job: CaptureJob, feeds: list[dict[str, np.ndarray]],
                warmup: int, repeats: int, sink: "CaptureSink | None" = None) -> CaptureResult:
    """Run one cell. The values go to `sink` sample by sample (parity.pipeline.sink streams them to
    Parquet); without one they are kept in the result (CaptureResult.samples / .own)."""
    if modelfiles.is_onnx_file(job.model_cfg) and not (cls.onnx_based or cls.engine_build):
        return CaptureResult("UNSUPPORTED", onnx_file_unsupported(job))
    why = config.unsupported_dtype(job.provider, job.provider_cfg, job.dtype)
    mode = schema.mode(job.dtype_cfg)
    if not why and mode not in cls.precision_modes:
        why = (f"{cls.__name__} runs precision modes {list(cls.precision_modes)}, not {mode!r} "
               f"(dtypes.{job.dtype}.mode; Runner.precision_modes)")
    if why:
        return CaptureResult("UNSUPPORTED", why)
    try:
        why = cls.availability(job)
    except Exception as e:  # an availability probe that raises means: not available
        why = error_reason(e)
    if why:
        return CaptureResult("UNAVAILABLE", why)
    runner = cls(job)
    try:
        runner.activate()
    except Unavailable as e:
        return CaptureResult("UNAVAILABLE", str(e))
    except CompileError as e:
        return CaptureResult("COMPILE_FAIL", _cause(e))
    except SessionError as e:
        return CaptureResult("INFER_FAIL", str(e))
    except Exception as e:
        return CaptureResult("EXPORT_FAIL", error_reason(e))
    keep = KeepSink() if sink is None else None
    sink = sink or keep
    try:
        res = _samples(runner, job, feeds, sink, warmup, repeats)
        if res.status == "OK":
            _own(runner, job, feeds, res, sink)
        if keep is not None:
            res.samples = keep.kept
            res.own = keep.kept_own if res.status == "OK" and not res.own_reason else None
        return res
    finally:
        runner.deactivate()


def onnx_file_unsupported(job: CaptureJob) -> str:
    """Why a runner of torch models (neither onnx_based nor engine_build) cannot take an ONNX-file model."""
    return (f"models.{job.model} is an ONNX file (arch.source: onnx) and provider {job.provider} runs torch "
            "models only")


class CaptureSink:
    """Where run_capture hands each sample's values as soon as they are made, so a stage holds one
    sample at a time (parity.pipeline.sink writes them to Parquet as they come). `gold` is that
    sample's fp64 reference ({name: array}) when the job has one, else None."""

    wants_gold = False  # read the fp64 reference sample by sample for `sample()` too (oracle sums)

    def sample(self, k: int, named: list[tuple[str, np.ndarray]], gold: dict | None) -> None:
        """Sample k's values: model outputs first, then layers in execution order, then `plain:`."""

    def own(self, k: int, named: list[tuple[str, np.ndarray]], gold: dict) -> None:
        """Sample k's own values (`<leaf>`, `between:<leaf>`) in execution order. The list is the
        sink's: it may empty it as it goes (StoreSink.own does)."""

    def extra_gold(self, k: int, gold: dict) -> None:
        """A sample of the fp64 reference beyond the inputs' samples (its names only matter)."""


class KeepSink(CaptureSink):
    """Values kept in memory (CaptureResult.samples / .own): callers that need them all at once."""

    def __init__(self):
        self.kept: list[list[tuple[str, np.ndarray]]] = []
        self.kept_own: list[list[tuple[str, np.ndarray]]] = []

    def sample(self, k, named, gold):
        self.kept.append(named)

    def own(self, k, named, gold):
        self.kept_own.append(named)


def _samples(runner: Runner, job: CaptureJob, feeds: list, sink: CaptureSink, warmup: int,
             repeats: int) -> CaptureResult:
    """The plain graph on every sample (its outputs are small: kept), its latency, then the
    per-layer run sample by sample, each sample handed to `sink` at once with its plain outputs. One
    graph at a time, in this order, so an ORT runner holds one session's weights at a time
    (OrtRunner._open). A failure is the result (its samples are not kept: a failed cell writes no
    values)."""
    plain = []
    for f in feeds:
        try:
            plain.append([(PLAIN + n, np.asarray(v)) for n, v in runner.infer_plain(f)])
        except CompileError as e:
            return _per_layer_failure(runner, feeds) or CaptureResult(
                "COMPILE_FAIL", "plain-graph compile failed: " + _cause(e))
        except Exception as e:
            return _per_layer_failure(runner, feeds) or CaptureResult(
                "INFER_FAIL", "plain-graph run failed: " + error_reason(e))
    try:
        lat = _latency(runner, feeds[0], warmup, repeats) if feeds else []
    except Exception as e:
        return CaptureResult("INFER_FAIL", "plain-graph run failed: " + error_reason(e))
    gold = lazy_gold_samples(job.reference, job.model_dir) if sink.wants_gold and _has_reference(job) else None
    for k, f in enumerate(feeds):
        try:
            named = [(n, np.asarray(v)) for n, v in runner.infer(f)]
        except CompileError as e:
            return CaptureResult("COMPILE_FAIL", _cause(e))
        except Exception as e:
            return CaptureResult("INFER_FAIL", error_reason(e))
        sink.sample(k, named + plain[k], next(gold, (None, None))[1] if gold is not None else None)
        del named
    if gold is not None:
        for k, g in gold:
            sink.extra_gold(k, g)
    return CaptureResult("OK", "", latency_ms=lat, warmup=warmup)


def _per_layer_failure(runner: Runner, feeds: list) -> CaptureResult | None:
    """After the plain graph failed: the per-layer graph's own failure, if it fails too (it is the
    one a cell reports first, as when the per-layer run came first), else None."""
    for f in feeds:
        try:
            runner.infer(f)
        except CompileError as e:
            return CaptureResult("COMPILE_FAIL", _cause(e))
        except Exception as e:
            return CaptureResult("INFER_FAIL", error_reason(e))
    return None


def _latency(runner: Runner, feed: dict, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        runner.infer_plain(feed)
    lat = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        runner.infer_plain(feed)
        lat.append((time.perf_counter_ns() - t0) / 1e6)
    return lat


def _has_reference(job: CaptureJob) -> bool:
    return job.reference is not None and Path(job.reference).exists()


def _own(runner: Runner, job: CaptureJob, feeds: list[dict[str, np.ndarray]], res: CaptureResult,
         sink: CaptureSink) -> None:
    """The runner's own values, sample by sample into `sink` (or res.own_reason: why not measured;
    a failure at any sample means not measured, and the sink drops what it had)."""
    if not _has_reference(job):
        res.own_reason = (f"no fp64 reference ({Path(job.reference).name}): set reference.fp64: true"
                          if job.reference is not None else "no reference given")
        return
    if runner.own_unsupported:
        res.own_reason = runner.own_unsupported
        return
    try:
        n = reference_samples(Path(job.reference))
        if n != len(feeds):
            res.own_reason = f"{job.reference} has {n} samples, the inputs {len(feeds)}"
            return
        golds = lazy_gold_samples(Path(job.reference), job.model_dir)
        for f in feeds:
            k, gold = next(golds)
            own = runner.infer_own(f, gold)
            if own is None:
                res.own_reason = runner.own_unsupported or "not measured"
                return
            named = [(n, np.asarray(v)) for n, v in own]
            del own  # the sink may drop each value once it is written (StoreSink.own empties `named`)
            sink.own(k, named, gold)
            del gold, named  # one sample's own values at a time, not two
    except Exception as e:
        res.own_reason = "own-error run failed: " + error_reason(e)
        return
    res.own_skipped = runner.own_skipped()


def latency_stats(ms: list[float]) -> dict:
    if not ms:
        return {}
    s = sorted(ms)
    return {"median_ms": statistics.median(s), "p90_ms": s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))],
            "min_ms": s[0], "max_ms": s[-1], "repeats": len(s)}
