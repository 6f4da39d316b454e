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
import pyarrow.parquet as pq

from parity.config import params as config
from parity.config import schema
from parity.core import modelfiles, status, store
from parity.core.store import PLAIN

STATUSES = status.RUNNER  # the one vocabulary: parity.core.status


class Unavailable(RuntimeError):
    """Raised from activate() when the backend turns out not to run here after all (e.g. onnxruntime
    lists CUDAExecutionProvider but the session fell back to CPU): status UNAVAILABLE, not a failure."""


class CompileError(RuntimeError):
    """Raised by a runner (from activate or infer) when its compiler, not the model, failed:
    run_capture records COMPILE_FAIL with the compiler's exception as the reason."""


class SessionError(RuntimeError):
    """Raised from activate() when the runtime refuses to load the graph prepared for it (an ORT
    session on the fp16 conversion of a graph): INFER_FAIL with the runtime's reason, as a suite case
    whose session fails; a converter or exporter that raises is EXPORT_FAIL."""


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
    # a model already built from model_cfg and seed (fp32, eval) that a torch runner uses instead of
    # building its own: the fp32 baseline made with the reference (parity.pipeline.fold)
    net: object | None = None


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
    # fingerprint components of its own, beside the built-in ones (parity.backends.fingerprint.PROBES) a conf's
    # `uses:` can name: {component: (distribution, ...)}, fingerprinted as those packages' versions.
    # A literal dict in the class body: compose reads it without importing the module.
    fingerprint_components: dict[str, tuple[str, ...]] = {}
    # its provider's `options:` (conf/providers/<p>.yaml): {key: allowed values (a tuple) or the name
    # of a rule of parity.config.params.OPTION_RULES}; None: any mapping (a user's own runner).
    # Literal (a dict may spread a base's: {**Base.options_schema, ...}): compose reads it from the
    # source without importing the module (parity.config.imports.class_value).
    options_schema: dict | None = None
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


def calibration_feeds(path) -> list[dict]:
    """The calibration samples written by the inputs stage: [{input name: array}, ...] (what an INT8
    runner calibrates on: ort_int8's static quantization, an engine build's INT8 calibrator)."""
    by_sample: dict[int, dict] = {}
    for t in store.read(path):
        by_sample.setdefault(t.sample, {})[t.name] = t.array
    return [by_sample[k] for k in sorted(by_sample)]


def error_reason(e: BaseException) -> str:
    """An exception as a status reason: `Type: message (at file:line)`."""
    tb = traceback.extract_tb(e.__traceback__)
    where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    return f"{type(e).__name__}: {e}{where}".strip()


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


def interleave(own: list, between: dict) -> list:
    """Own values in execution order: `between:<leaf>` before `<leaf>`; `between:output` last."""
    res, between = [], dict(between)
    for n, v in own:
        if n in between:
            res.append((store.BETWEEN + n, between.pop(n)))
        res.append((n, v))
    return res + [(store.BETWEEN + n, v) for n, v in between.items()]


def gold_samples(path: Path):
    """fp64.parquet one sample at a time: (k, {name: array}) in sample order (the file holds each
    sample's rows together), so a reader holds one sample of the reference at once."""
    cur, by = None, {}
    for t in store.read(path):
        if t.sample != cur and by:
            yield cur, by
            by = {}
        cur = t.sample
        by[t.name] = t.array
    if by:
        yield cur, by


def lazy_gold_samples(path: Path, model_dir: Path | None = None):
    """fp64.parquet one sample at a time as (k, {name: array}), each array read when it is looked up
    (store.SampleRows): the own-error run and the oracle's sums hold the row groups they are reading,
    not a whole fp64 sample (resnet50: 490 MB of leaf outputs and `pre:` inputs). The two passes of a
    capture (the sums, then the own-error run) share one reader (gold_rows): a reference small enough
    to stay decoded is decoded once, not once per pass and lookup region."""
    return gold_rows(path, model_dir).by_sample()


_GOLD: dict[Path, store.Rows] = {}  # this process's fp64 reference reader, by path (one capture per process)
WHOLE_MAX_MB = 1024  # the most a reference kept decoded may take, whatever the weights


def gold_rows(path: Path, model_dir: Path | None = None, weight_bytes: int | None = None) -> store.Rows:
    """One store.Rows of `path` per process. It stays decoded whole when it takes no more than the
    model's weights (weights.bin, which the stage maps anyway; at least store.KEEP_MB, at most
    WHOLE_MAX_MB), else it keeps its last 2 row groups (the streaming bound of issue 23): the memory
    it adds stays within the budgets of parity.core.memory (3 W + 1 GiB; a 1B model's reference,
    several GB, streams). gpt2_small's (368 MB decoded, 12 row groups, W 474 MB) was decoded 64 times
    in its baseline: 5.8 of 10.6 s. `weight_bytes`: W when no model_dir gives it (the fp32
    baseline made with the reference: W from parity.pipeline.memsize); the first call for a path decides."""
    key = Path(path).resolve()
    if key not in _GOLD:
        _GOLD.clear()  # one reference at a time
        w = model_dir / "weights.bin" if model_dir is not None else None
        mb = (w.stat().st_size if w is not None and w.is_file() else (weight_bytes or 0)) / 2**20
        _GOLD[key] = store.Rows(key, keep=store.Rows.WHOLE, whole_mb=min(max(mb, store.KEEP_MB), WHOLE_MAX_MB))
    return _GOLD[key]


def _has_reference(job: CaptureJob) -> bool:
    return job.reference is not None and Path(job.reference).exists()


def reference_samples(path: Path) -> int:
    """How many samples fp64.parquet holds (its `sample` column alone is read)."""
    col = pq.read_table(path, columns=["sample"]).column("sample").to_pylist()
    return len(set(col))


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
