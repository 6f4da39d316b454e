"""The Runner interface (after Polygraphy's BaseRunner: activate / infer / deactivate).

A runner is one backend at one dtype. Like Polygraphy's BaseRunner it keeps, as class attributes that
compose reads from the source without importing the module, what it can do: the precision modes it
runs (`precision_modes`), its provider's options schema (`options_schema`), the fingerprint components
it depends on (`fingerprint_components`), whether it runs ONNX graphs or builds an engine; and as
hooks its lifecycle: availability() -> activate() -> infer()* / infer_plain() / infer_own() ->
deactivate(), plus run_op for one op of a suite and mixed() for a mixed-precision plan. The contract
a provider author keeps is in docs/extending.md.

Who drives it: parity.backends.capture_driver.run_capture (one model cell) and parity.suites.execute
(one suite case); what it is given comes from parity.backends.loader (the class named by a conf's
`runner:`, calibration samples, the fp64 reference). A failure is a status with a reason, never a
crashed pipeline:
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

import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Collection

import numpy as np

from parity.core import status, store

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


def error_reason(e: BaseException) -> str:
    """An exception as a status reason: `Type: message (at file:line)`."""
    tb = traceback.extract_tb(e.__traceback__)
    where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    return f"{type(e).__name__}: {e}{where}".strip()


def interleave(own: list, between: dict) -> list:
    """Own values in execution order: `between:<leaf>` before `<leaf>`; `between:output` last."""
    res, between = [], dict(between)
    for n, v in own:
        if n in between:
            res.append((store.BETWEEN + n, between.pop(n)))
        res.append((n, v))
    return res + [(store.BETWEEN + n, v) for n, v in between.items()]
