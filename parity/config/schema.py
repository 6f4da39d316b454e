"""params.yaml as typed, frozen objects: one dataclass per section, each default declared once, here.

`of(p)` builds a `Params` from the dict `parity.config.params.load()` returned (validated: a required
key is present, a value has the right kind; validation and its error messages stay in params.py, which
reads its defaults from these classes). Readers use attributes (`of(p).capture.threads`), never
`p.get("capture", {}).get("threads", 0)`: a default restated at a read is a second place to change.
Building is cheap (under a millisecond for the default params); `section(cls, d)` builds one section alone where a
reader runs per case or is handed a section's mapping rather than the whole params.

Values are kept as params.yaml gives them (an int stays an int: artifacts that echo a setting stay
byte-identical); lists become tuples. Opaque sub-configs (a model's `arch.kwargs`, a provider's
`options`, a suite's spec, `suite_tolerances`, `models.<m>.shapes`) stay plain mappings: their formats
are their owners' (the runner's options schema, parity/suites/spec.py, parity/config/inputspec.py).
Defaults are declared once. A setting conf/config.yaml gives (`inputs.samples`, `capture.warmup`, ...)
takes its default from there (`_conf`): a params dict made by hand for a test or a command gets what a
composed params.yaml holds. What conf/config.yaml does not give is declared here; a dtype's precision
mode and oracle slack are parity.core.tolerance's (the resolver reads a dtype's mapping with them).
tests/test_house.py fails when a conf default and a schema default disagree. `rule(p, ...)`: the Rule of
a cell (parity.core.tolerance.Rule), read through `of(p)`.
Light: stdlib, PyYAML and parity.core.tolerance (config layer: core and the config's libraries).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from parity.core import tolerance

CONF = Path(__file__).resolve().parents[2] / "conf" / "config.yaml"  # the defaults parity ships


# libyaml's loader where PyYAML has it: the pure-Python one is ~10x slower, and every stage process reads
# params.yaml and this file (issue 38)
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str):
    """yaml.safe_load's result, through libyaml where PyYAML has it. A YAML error is raised as the
    pure-Python loader words it (`expected the node content, but found '<stream end>'`; libyaml says
    `did not find expected node content`): errors are rare, the message is what a user reads."""
    try:
        return yaml.load(text, Loader=YAML_LOADER)
    except yaml.YAMLError:
        if YAML_LOADER is yaml.SafeLoader:
            raise
        return yaml.safe_load(text)


@functools.cache
def _conf_file() -> dict:
    return load_yaml(CONF.read_text(encoding="utf-8"))


def _conf(*keys: str):
    """conf/config.yaml's value at `keys` (`"inputs", "samples"`; a list as a tuple): a setting's default."""
    v = _conf_file()
    for k in keys:
        v = v[k]
    return tuple(v) if isinstance(v, list) else v


def _tuple(v) -> tuple:
    return tuple(v or ())


def _conv(fn):
    """Field metadata: build the value with fn (the raw params value in, the typed one out)."""
    return {"conv": fn}


def _make(cls, d: Mapping | None):
    """cls from the mapping d: a key present is converted by its field's `conv`, a key absent takes
    the field's default (a required field missing raises TypeError: validate first)."""
    d = d or {}
    kw = {}
    for f in dataclasses.fields(cls):
        key = f.metadata.get("key", f.name)
        if key in d:
            conv = f.metadata.get("conv")
            kw[f.name] = conv(d[key]) if conv else d[key]
    return cls(**kw)


class _Group(Mapping):
    """{name: cls(...)} of a group (models, dtypes, providers), read-only, in params order; an option is
    built when first read, so a reader of one section never builds (nor needs) every option."""

    def __init__(self, cls, raw: Mapping | None):
        self._cls, self._raw, self._built = cls, dict(raw or {}), {}

    def __getitem__(self, name: str):
        if name not in self._built:
            self._built[name] = _make(self._cls, self._raw[name])
        return self._built[name]

    def __iter__(self):
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __repr__(self) -> str:
        return f"{self._cls.__name__}s({', '.join(self._raw)})"


def _named(cls):
    return lambda d: _Group(cls, d)


# --- dtypes.<d> (conf/dtypes/<d>.yaml) ---------------------------------------------------------------

@dataclass(frozen=True)
class Tol:
    atol: float
    rtol: float


@dataclass(frozen=True)
class Oracle:
    k: float                   # required (validation): error vs fp64 within k x the trusted backend's
    slack: float = tolerance.DEFAULT_SLACK


@dataclass(frozen=True)
class Dtype:
    torch: str
    tol: Tol = field(metadata=_conv(lambda v: _make(Tol, v)))
    oracle: Oracle = field(metadata=_conv(lambda v: _make(Oracle, v)))
    mode: str = tolerance.DEFAULT_MODE  # precision mode (parity.config.params.DTYPE_MODES)


# --- providers.<p> (conf/providers/<p>.yaml) ---------------------------------------------------------

@dataclass(frozen=True)
class Provider:
    runner: str
    dtypes: tuple[str, ...] = field(metadata=_conv(_tuple))
    uses: tuple[str, ...] = field(metadata=_conv(_tuple))
    options: Mapping[str, Any] = field(default_factory=dict, metadata=_conv(lambda v: v or {}))
    engine: bool = False
    import_: str | list | None = field(default=None, metadata={"key": "import"})


# --- models.<m> (conf/models/<m>.yaml) ---------------------------------------------------------------

@dataclass(frozen=True)
class Calibrate:
    shape: tuple[int, ...] = field(metadata=_conv(_tuple))


@dataclass(frozen=True)
class Arch:
    source: str
    name: str = ""             # an ONNX-file model has a path instead
    kwargs: Mapping[str, Any] = field(default_factory=dict, metadata=_conv(lambda v: v or {}))
    calibrate: Calibrate | None = field(default=None, metadata=_conv(lambda v: _make(Calibrate, v)))
    head: str = "base"         # hf: base (AutoModel) or causal_lm (parity.config.params.HF_HEADS)
    import_: str | list | None = field(default=None, metadata={"key": "import"})
    path: str | None = None    # source: onnx (the .onnx file); source: hf (a checkpoint folder)
    weights: str | None = None  # a torch model's trained state dict (.safetensors/.pt/.pth; parity.models.weights)


# init -> (low, high) when the spec gives none (uniform floats, integer draws, token ids)
INIT_BOUNDS = {"uniform": (0.0, 1.0), "randint": (0, 2), "tokens": (0, 2)}


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...] = field(metadata=_conv(_tuple))
    dtype: str = "float32"
    init: str = "normal"
    mean: float = 0.0
    std: float = 1.0
    low: float | None = None   # None: INIT_BOUNDS[init]
    high: float | None = None
    path: str | None = None    # init: file; init: text (a prompts file, one a line)
    key: str | None = None     # init: file (array/column); init: text (the tokenizer's field)
    prompts: tuple[str, ...] | None = field(default=None, metadata=_conv(lambda v: None if v is None else _tuple(v)))

    def bounds(self) -> tuple:
        lo, hi = INIT_BOUNDS.get(self.init, (None, None))
        return (lo if self.low is None else self.low), (hi if self.high is None else self.high)


@dataclass(frozen=True)
class TolRule:
    atol: float
    rtol: float
    dtype: str | None = None   # None: every dtype
    layer: str | None = None   # fnmatch pattern; None: every layer


@dataclass(frozen=True)
class Model:
    arch: Arch = field(metadata=_conv(lambda v: _make(Arch, v)))
    input: tuple[InputSpec, ...] = field(metadata=_conv(lambda v: tuple(_make(InputSpec, s) for s in v)))
    tolerances: tuple[TolRule, ...] = field(default=(), metadata=_conv(
        lambda v: tuple(_make(TolRule, r) for r in v or ())))
    shapes: Mapping[str, Any] | None = None   # parity/config/inputspec.py


# --- the settings sections ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Export:
    exporter: str = _conf("export", "exporter")  # dynamo | legacy (parity.config.params.EXPORTERS)
    opset: int = _conf("export", "opset")


@dataclass(frozen=True)
class Inputs:
    samples: int = _conf("inputs", "samples")
    calibration: int = _conf("inputs", "calibration")


@dataclass(frozen=True)
class Reference:
    fp64: bool = _conf("reference", "fp64")


@dataclass(frozen=True)
class Capture:
    latency: bool = _conf("capture", "latency")
    warmup: int = _conf("capture", "warmup")
    repeats: int = _conf("capture", "repeats")
    threads: int = _conf("capture", "threads")  # 0: the library's default


@dataclass(frozen=True)
class Diff:
    verdict: str = _conf("diff", "verdict")  # oracle | tolerance (parity.core.tolerance.VERDICT_MODES)
    max_mismatch: float = _conf("diff", "max_mismatch")


@dataclass(frozen=True)
class Analysis:
    plan: bool = _conf("analysis", "plan")
    plan_target: Tol | None = field(default=_conf("analysis", "plan_target"),
                                    metadata=_conv(lambda v: None if v is None else _make(Tol, v)))
    max_keep: int = _conf("analysis", "max_keep")
    plan_group: str = _conf("analysis", "plan_group")  # auto | leaf | block (main's parity.analysis.plan.GROUPS)
    reduce: bool = _conf("analysis", "reduce")
    reduce_rel_l2: float = _conf("analysis", "reduce_rel_l2")


@dataclass(frozen=True)
class SuitesRun:
    workers: int = _conf("suites_run", "workers")
    threads: int = _conf("suites_run", "threads")
    timeout_s: float = _conf("suites_run", "timeout_s")
    repeats: int = _conf("suites_run", "repeats")
    onnx_opset: int = _conf("suites_run", "onnx_opset")
    grad: bool = _conf("suites_run", "grad")
    grad_tol_scale: float = _conf("suites_run", "grad_tol_scale")


@dataclass(frozen=True)
class Fuzz:
    suites: tuple[str, ...] = field(default=_conf("fuzz", "suites"), metadata=_conv(_tuple))
    dtypes: tuple[str, ...] = field(default=_conf("fuzz", "dtypes"), metadata=_conv(_tuple))
    providers: tuple[str, ...] = field(default=_conf("fuzz", "providers"), metadata=_conv(_tuple))
    seed: int = _conf("fuzz", "seed")
    cases: int = _conf("fuzz", "cases")
    ops: str | list | None = _conf("fuzz", "ops")  # fnmatch patterns of case ids (None: all)
    nonfinite: bool = _conf("fuzz", "nonfinite")
    empty: bool = _conf("fuzz", "empty")
    max_numel: int = _conf("fuzz", "max_numel")
    timeout_s: float = _conf("fuzz", "timeout_s")
    workers: int = _conf("fuzz", "workers")

    def settings(self) -> dict:
        """The campaign's settings (everything but what selects the campaigns)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in ("suites", "dtypes", "providers")}


@dataclass(frozen=True)
class TrainStep:
    models: tuple[str, ...] = field(default=_conf("train_step", "models"), metadata=_conv(_tuple))
    dtypes: tuple[str, ...] = field(default=_conf("train_step", "dtypes"), metadata=_conv(_tuple))
    lr: float = _conf("train_step", "lr")
    fp64: bool = _conf("train_step", "fp64")
    limit: float | None = _conf("train_step", "limit")  # None: the AMP dtype's own (parity.analysis.train_step)
    device: str = _conf("train_step", "device")


@dataclass(frozen=True)
class Generate:
    models: tuple[str, ...] = field(default=_conf("generate", "models"), metadata=_conv(_tuple))
    dtypes: tuple[str, ...] = field(default=_conf("generate", "dtypes"), metadata=_conv(_tuple))
    providers: tuple[str, ...] = field(default=_conf("generate", "providers"), metadata=_conv(_tuple))
    steps: int = _conf("generate", "steps")
    prompt_len: int = _conf("generate", "prompt_len")
    prompt: str | None = _conf("generate", "prompt")
    own_every: int = _conf("generate", "own_every")


@dataclass(frozen=True)
class Report:
    """What the report stage depends on (resolved at compose by the Hydra plugin; dvc.yaml reads them)."""
    coverage_dep: str | None = None
    plan_dep: str | None = None
    reduce_dep: str | None = None
    fuzz_dep: str | None = None
    train_dep: str | None = None
    generate_dep: str | None = None


def _section(cls):
    return field(default_factory=cls, metadata=_conv(lambda v: _make(cls, v)))


def _names():
    return field(default=(), metadata=_conv(_tuple))


def _group(cls):
    """A selection (models, dtypes, providers): validation requires one; empty only in a params dict
    made by hand for one section (a test's, a command's)."""
    return field(default_factory=lambda: _Group(cls, {}), metadata=_conv(_named(cls)))


@dataclass(frozen=True)
class Params:
    models: Mapping[str, Model] = _group(Model)
    dtypes: Mapping[str, Dtype] = _group(Dtype)
    providers: Mapping[str, Provider] = _group(Provider)
    seed: int = _conf("seed")
    strict: bool = _conf("strict")
    export: Export = _section(Export)
    inputs: Inputs = _section(Inputs)
    reference: Reference = _section(Reference)
    capture: Capture = _section(Capture)
    diff: Diff = _section(Diff)
    analysis: Analysis = _section(Analysis)
    suites: Mapping[str, Any] = field(default_factory=dict, metadata=_conv(lambda v: v or {}))
    suites_run: SuitesRun = _section(SuitesRun)
    suite_tolerances: Mapping[str, Any] = field(default_factory=dict, metadata=_conv(lambda v: v or {}))
    fuzz: Fuzz = _section(Fuzz)
    train_step: TrainStep = _section(TrainStep)
    generate: Generate = _section(Generate)
    report: Report = _section(Report)
    validated: str | None = None
    # resolved at compose from the selection (dvc.yaml's matrices)
    capture_providers: tuple[str, ...] = _names()
    engine_providers: tuple[str, ...] = _names()
    torch_models: tuple[str, ...] = _names()
    onnx_models: tuple[str, ...] = _names()
    plan_dtypes: tuple[str, ...] = _names()
    reduce_dtypes: tuple[str, ...] = _names()


def of(p: Mapping) -> Params:
    """The typed view of a validated params dict."""
    return _make(Params, p)


def section(cls, d: Mapping | None):
    """One section (or a dtype, provider, model) from its mapping alone: for code handed the mapping
    rather than the whole params (a runner's `dtype_cfg`, a cell's provider)."""
    return _make(cls, d)


def rule(p: Mapping, model: str, dtype: str, layers=None) -> tolerance.Rule:
    """The Rule of a cell of `model` at `dtype` (parity.core.tolerance.Rule), with the tolerance of every
    layer in `layers` (None: of each layer when first looked up, LayerTolerances: the diff stage makes the
    Rule before it reads the layer names): the settings read through of(p), so every default it applies is
    this module's."""
    c, dc, m = of(p), p["dtypes"][dtype], p["models"][model]
    n = int(c.inputs.samples)
    labels = list(m.get("shapes") or {})  # as parity.config.inputspec.sample_sets: n samples a label, in order
    sets = tuple((lab, range(i * n, (i + 1) * n)) for i, lab in enumerate(labels))
    tols = LayerTolerances(lambda name: tolerance.resolve(dc["tol"], f"dtypes.{dtype}.tol", m.get("tolerances"),
                                                          f"models.{model}.tolerances", dtype, layer=name))
    for name in layers or ():
        tols[name]  # noqa: B018  resolved now: a bad rule fails here, as before
    d = c.dtypes[dtype]
    return _rule(dtype, dc, d.mode, d.oracle, c.diff, c.reference, tols, sets)


class LayerTolerances(dict):
    """layer -> (atol, rtol, source key) of a model cell, each resolved on its first look-up."""

    def __init__(self, resolve):
        super().__init__()
        self._resolve = resolve

    def __missing__(self, name: str):
        got = self[name] = self._resolve(name)
        return got


def suite_rule(p: Mapping, suite: str, dtype: str) -> tolerance.Rule:
    """The Rule of a suite cell (`suite` at `dtype`, parity.suites.diff): the Rule a model cell is judged
    by, read through the same typed sections one at a time (a fuzz campaign judges one case at a time;
    a test's or a probe's params may hold only these, a dtype without `oracle`: limits None, judged by
    tolerance). Its tolerances are resolved per case and kind (parity.suites.spec.tolerance_for), so
    the Rule names none."""
    dc = p["dtypes"][dtype]
    o = section(Oracle, dc["oracle"]) if dc.get("oracle") else None
    return _rule(dtype, dc, mode(dc), o, section(Diff, p.get("diff")), section(Reference, p.get("reference")), {}, ())


def _rule(dtype: str, dc: Mapping, precision: str, o: Oracle | None, diff: Diff, ref: Reference, tols: dict,
          sets: tuple) -> tolerance.Rule:
    # lazy: numpy (ml_dtypes) for the dtype table, only where a cell is judged (light stages' --help)
    from parity.core import dtypes

    fmt = dtypes.TABLE[tolerance.number_format(dc)]  # the config checked the names (parity.config.params)
    lim = tolerance.Limits(tolerance.unit_roundoff(dc), float(o.k), float(o.slack)) if o is not None else None
    return tolerance.Rule(dtype, precision, diff.verdict, float(diff.max_mismatch), lim,
                          precision in tolerance.BASELINE_MODES, bool(ref.fp64), fmt,
                          fmt if fmt.u > dtypes.FP32.u else None, tols, sets)


def mode(dtype_cfg: Mapping) -> str:
    """The precision mode of a dtype's mapping that may be partial (a runner's `job.dtype_cfg` is
    sometimes made by hand: a suite case's, a probe's), Dtype's default when it names none."""
    return dtype_cfg.get("mode", Dtype.mode)
