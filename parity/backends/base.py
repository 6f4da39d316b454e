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

Own error (optional): with `CaptureJob.reference` (the fp64 reference, fp64.parquet, with the leaf
inputs `pre:<call>`), run_capture also calls `infer_own` per sample: each leaf run on the reference's
input to it (`<leaf>`), and the ops between leaves run on the reference's leaf outputs
(`between:<leaf>`). A runner without it (`own_unsupported` says why) has no own values: the diff falls
back to accumulated error. An own-error failure never fails the cell (CaptureResult.own_reason).
"""

from __future__ import annotations

import statistics
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Collection

import numpy as np

from parity import config, status, store
from parity.store import PLAIN

STATUSES = status.RUNNER  # the one vocabulary: parity.status


class Unavailable(RuntimeError):
    """Raised from activate() when the backend turns out not to run here after all (e.g. onnxruntime
    lists CUDAExecutionProvider but the session fell back to CPU): status UNAVAILABLE, not a failure."""


class CompileError(RuntimeError):
    """Raised by a runner (from activate or infer) when its compiler, not the model, failed:
    run_capture records COMPILE_FAIL with the compiler's exception as the reason."""


class OpSkip(Exception):
    """Raised by Runner.run_op (or the suite around it) when a case ends with a status other than OK
    (EXPORT_FAIL, COMPILE_FAIL, INFER_FAIL, INVALID, UNAVAILABLE...) and a reason."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


@dataclass
class OpJob:
    """One suite cell (suite x dtype x provider) as the op-level hook (Runner.run_op) sees it."""
    provider: str
    provider_cfg: dict
    dtype: str               # the torch dtype name of the cell (dtypes.<d>.torch): float32, float16, ...
    seed: int = 0
    repeats: int = 3
    threads: int = 1
    onnx_opset: int = 17
    exporter: str = "legacy"  # ONNX-based runners: legacy (TorchScript) | dynamo (a suite case's `export:`)


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
    # the fp64 reference (reference stage's fp64.parquet): own error is measured when it is given
    reference: Path | None = None


@dataclass
class CaptureResult:
    status: str
    reason: str = ""
    # per sample: (name, array) with the model outputs first, then layers in execution order, then
    # the plain graph's outputs (plain:output)
    samples: list[list[tuple[str, np.ndarray]]] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)
    warmup: int = 0
    # per sample: (name, array) own values (`<leaf>`, `between:<leaf>`); None: not measured (own_reason)
    own: list[list[tuple[str, np.ndarray]]] | None = None
    own_reason: str = ""
    # leaf calls whose input the runner could not feed from the reference (no own value for them)
    own_skipped: list[str] = field(default_factory=list)
    # the fp64 reference per sample ({name: array}), when the own-error run read it
    reference: list[dict[str, np.ndarray]] | None = None


class Runner:
    """One backend at one dtype. Lifecycle: availability() -> activate() -> infer()* -> deactivate().
    The same class runs a model (CaptureJob: activate/infer/infer_plain) and one op of a suite
    (OpJob: run_op), so a provider behaves the same in the model pipeline and in suites."""

    # -- capabilities (class attributes; read by config, env, suites and the engine stage) --
    # runs an exported ONNX graph: the suite coverage's ONNX-export column counts its EXPORT_FAILs
    onnx_based: bool = False
    # conf dtypes `mode:` values it runs (config checks providers x dtypes against it at compose)
    precision_modes: tuple[str, ...] = ("cast",)
    # fingerprint components of its own, beside the built-in ones (parity.fingerprint.PROBES) a conf's
    # `uses:` can name: {component: (distribution, ...)}, fingerprinted as those packages' versions.
    # A literal dict in the class body: compose reads it without importing the module.
    fingerprint_components: dict[str, tuple[str, ...]] = {}
    # builds a serialized engine in a stage of its own (engine@model-dtype-provider) before capture
    engine_build: bool = False
    # run_op also returns gradients (suite cases with `grad: true`); runs float64 gradcheck cases
    op_grads: bool = False
    op_gradcheck: bool = False

    def __init__(self, job: "CaptureJob | OpJob"):
        self.job = job

    @classmethod
    def availability(cls, job: CaptureJob) -> str | None:
        """None if this runner can run here, else the reason it cannot."""
        return None

    @classmethod
    def settings(cls, job: CaptureJob) -> dict:
        """Settings this runner resolves for the cell from the machine it runs on (e.g. ort_int8's
        `reduce_range: auto`), JSON-safe and deterministic: the capture writes them to status.json
        and the report shows them. {} when none."""
        return {}

    def activate(self) -> None:
        """Load/convert/build the model for this backend at job.dtype."""

    def infer(self, feeds: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
        """Per-layer run: (name, value) for the model outputs then every captured layer."""
        raise NotImplementedError

    def infer_plain(self, feeds: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
        """The shipped model alone (no extra outputs): its outputs, as (name, value). Timed for
        latency, and compared too, since extra outputs can change what a backend fuses."""
        raise NotImplementedError

    # why this runner measures no own error (None: it does, through infer_own)
    own_unsupported: str | None = "this runner has no own-error hook"

    def infer_own(self, feeds: dict[str, np.ndarray], ref: dict[str, np.ndarray]
                  ) -> list[tuple[str, np.ndarray]] | None:
        """Own values of one sample from `ref` (fp64 reference values by name, leaf outputs and
        `pre:<call>` inputs): (`<leaf>`, value) per leaf run on the reference input, and
        (`between:<leaf>`, value) per leaf input computed from the reference's leaf outputs, in
        execution order. None: not measured."""
        return None

    def own_skipped(self) -> list[str]:
        """Leaf calls infer_own could not feed from the reference (after a call to it)."""
        return []

    def deactivate(self) -> None:
        """Release sessions/devices."""

    def run_op(self, side, args, kwargs, grad: dict | None = None) -> tuple[list, float, list | None]:
        """The op-level hook (suites; self.job is an OpJob): run one op or module `side`
        (parity.backends.ops.Side) on `args`/`kwargs` (torch tensors at the cell's dtype) on this
        backend. Returns ([(name, tensor)] outputs `out:<leaf>` then `grad:...` when `grad` is given
        and op_grads, median latency in ms, ONNX op types or None). Raise OpSkip for a status."""
        raise OpSkip("UNAVAILABLE", f"{type(self).__name__} has no op-level hook (Runner.run_op): "
                                    "its provider cannot run suites")

    # -- engine build (engine_build = True; the engine@model-dtype-provider stage) --
    @classmethod
    def engine_availability(cls) -> str | None:
        """None if engines can be built here, else why not (before any model is read)."""
        return f"{cls.__name__} builds no engine (Runner.engine_build is false)"

    @classmethod
    def engine_precision(cls, dtype_cfg: dict) -> str:
        """The engine precision of a conf dtype ('int8' needs calibration samples)."""
        return ""

    @classmethod
    def build_engine(cls, model_dir: Path, dtype_cfg: dict, options: dict, calibration: list | None,
                     out: Path, timing_cache: Path, layer_names: list[str]) -> dict:
        """Build the cell's engines under `out`; returns build.json's content (status, reason, ...)."""
        raise NotImplementedError(f"{cls.__name__} has no engine build (Runner.build_engine)")

    # Mixed precision (the plan stage, parity/analysis/plan.py). `plan_items` says what mixed() takes:
    # "modules" (leaf module names: torch runners), "onnx_nodes" (node names of the plain graph,
    # model.onnx: ORT runners), or None (this backend cannot run a mixed model).
    plan_items: str | None = None

    @classmethod
    def plan_units(cls, units: dict[str, list[str]], model_dir: Path, provider_cfg: dict) -> dict[str, list[str]]:
        """The plan's candidates ({leaf: items}) narrowed to what this backend's precision changes
        (ort_int4: a leaf's weight MatMuls only); the others stay as they are."""
        return units

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
    if (job.model_cfg.get("arch") or {}).get("source") == "onnx" and not (cls.onnx_based or cls.engine_build):
        return CaptureResult("UNSUPPORTED", f"models.{job.model} is an ONNX file (arch.source: onnx) and "
                                            f"provider {job.provider} runs torch models only")
    why = config.unsupported_dtype(job.provider, job.provider_cfg, job.dtype)
    mode = job.dtype_cfg.get("mode", "cast")
    if not why and mode not in cls.precision_modes:
        why = (f"{cls.__name__} runs precision modes {list(cls.precision_modes)}, not {mode!r} "
               f"(dtypes.{job.dtype}.mode; Runner.precision_modes)")
    if why:
        return CaptureResult("UNSUPPORTED", why)
    try:
        why = cls.availability(job)
    except Exception as e:  # an availability probe that raises means: not available
        why = _reason(e)
    if why:
        return CaptureResult("UNAVAILABLE", why)
    runner = cls(job)
    try:
        runner.activate()
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
        res = CaptureResult("OK", "", samples, lat, warmup)
        _own(runner, job, feeds, res)
        return res
    finally:
        runner.deactivate()


def interleave(own: list, between: dict) -> list:
    """Own values in execution order: `between:<leaf>` before `<leaf>`; `between:output` last."""
    res, between = [], dict(between)
    for n, v in own:
        if n in between:
            res.append((store.BETWEEN + n, between.pop(n)))
        res.append((n, v))
    return res + [(store.BETWEEN + n, v) for n, v in between.items()]


def reference_values(path: Path) -> list[dict[str, np.ndarray]]:
    """fp64.parquet -> per sample {name: array} (leaf outputs and `pre:` inputs)."""
    by: dict[int, dict[str, np.ndarray]] = {}
    for t in store.read(path):
        by.setdefault(t.sample, {})[t.name] = t.array
    return [by[k] for k in sorted(by)]


def _own(runner: Runner, job: CaptureJob, feeds: list[dict[str, np.ndarray]], res: CaptureResult) -> None:
    """Fill res.own (or res.own_reason): the runner's own values per sample, when measurable."""
    if job.reference is None or not Path(job.reference).exists():
        res.own_reason = (f"no fp64 reference ({job.reference}): set reference.fp64: true"
                          if job.reference is not None else "no reference given")
        return
    if runner.own_unsupported:
        res.own_reason = runner.own_unsupported
        return
    try:
        refs = res.reference = reference_values(Path(job.reference))
        if len(refs) != len(feeds):
            res.own_reason = f"{job.reference} has {len(refs)} samples, the inputs {len(feeds)}"
            return
        own = [runner.infer_own(f, r) for f, r in zip(feeds, refs)]
    except Exception as e:
        res.own_reason = "own-error run failed: " + _reason(e)
        return
    if any(o is None for o in own):
        res.own_reason = runner.own_unsupported or "not measured"
        return
    res.own = [[(n, np.asarray(v)) for n, v in o] for o in own]
    res.own_skipped = runner.own_skipped()


def write_own(path: Path, res: CaptureResult, key: str) -> dict:
    """own.parquet from the runner's own values (removed when there are none); the status entry."""
    if res.status != "OK" or res.own is None:
        path.unlink(missing_ok=True)
        return {"measured": False, "reason": res.own_reason or res.reason or res.status}
    rows = [store.Tensor(k, n, i, v) for k, named in enumerate(res.own) for i, (n, v) in enumerate(named)]
    store.write(path, rows, {"cell": key, "kind": "own"})
    return {"measured": True, "skipped": res.own_skipped}


def latency_stats(ms: list[float]) -> dict:
    if not ms:
        return {}
    s = sorted(ms)
    return {"median_ms": statistics.median(s), "p90_ms": s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))],
            "min_ms": s[0], "max_ms": s[-1], "repeats": len(s)}
