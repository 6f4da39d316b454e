"""The one verdict resolver (core): everything the config says about judging a model cell or a suite
case, read here and nowhere else.

- The tolerance resolver (`resolve`): a dtype's default (atol, rtol), then an ordered list of rules,
  the last matching one winning (torch.testing's dtype table, overridable per model layer or per suite
  case). Every result names the key it came from (`tol_source`), so a user can find it.
- The verdict modes `diff.verdict` chooses from (oracle | tolerance); the setting and `diff.max_mismatch`
  are read through the typed config (parity.config.schema, their defaults declared once there).
- The oracle's limits (`dtypes.<d>.oracle`: k and slack, with the unit roundoff u of the precision the
  cell computes in) and whether the trusted backend reproduces that precision; a dtype's mode and slack
  when its mapping gives none (DEFAULT_MODE, DEFAULT_SLACK: the typed config's Dtype and Oracle take them).
- The `Rule` of a cell: all of the above resolved once, frozen, with the tolerance of each of its
  layers, the number format it computes in (parity.core.dtypes) and the sample sets of its input
  shapes; built from the typed config by parity.config.schema.rule. The diff of a cell
  (parity.pipeline.diff) reads the config through its Rule only.

The config loader (parity.config.params) imports this module to validate diff.verdict, and must load
no numpy (a light stage's --help: tests/test_light_stages.py): the dtype table (parity.core.dtypes, from
numpy.finfo/ml_dtypes) is imported by the function that reads it, when a cell is judged."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from parity.core import dtypes

VERDICT_MODES = ("oracle", "tolerance")  # diff.verdict
# precision modes whose numerics the trusted backend (torch CPU eager) reproduces at the cell's dtype
BASELINE_MODES = ("cast", "autocast")
# the number format a precision mode computes in, where it is not the mode's torch dtype
# a dtype's `mode` and `oracle.slack` when its mapping gives none (parity.config.schema.Dtype, Oracle: these)
DEFAULT_MODE, DEFAULT_SLACK = "cast", 0.0
MODE_FORMATS = {"int8_dynamic": "int8", "int8_static": "int8", "int4_weight": "int4", "fp8": "fp8_e4m3",
                "tf32": "tf32"}


def resolve(default: dict, default_key: str, rules: list | None, rules_key: str, dtype: str, kind: str = "out",
            scale: float | None = None, scale_key: str = "", **names: str) -> tuple[float, float, str]:
    """(atol, rtol, source key). `default` is dtypes.<d>.tol (at `default_key`), multiplied by `scale`
    when given (its key appended: ' x <scale_key>'). A rule matches when its `dtype` (if any) is
    `dtype`, its `kind` (default "out") is `kind`, and each glob it has among `names` (e.g.
    layer=..., case=...) matches that name; its key is `<rules_key>[i]`."""
    atol, rtol, src = float(default["atol"]), float(default["rtol"]), default_key
    if scale is not None:
        atol, rtol, src = atol * scale, rtol * scale, f"{src} x {scale_key}"
    for i, r in enumerate(rules or []):
        if "dtype" in r and r["dtype"] != dtype:
            continue
        if r.get("kind", "out") != kind:
            continue
        if any(k in r and not fnmatch.fnmatchcase(v, r[k]) for k, v in names.items()):
            continue
        atol, rtol, src = float(r["atol"]), float(r["rtol"]), f"{rules_key}[{i}]"
    return atol, rtol, src


class Limits(NamedTuple):
    u: float      # the dtype's unit roundoff (unit_roundoff)
    k: float      # dtypes.<d>.oracle.k: required (parity.config.params)
    slack: float  # dtypes.<d>.oracle.slack: 0 unless given


def unit_roundoff(dtype_cfg: dict) -> float:
    """u of the precision a cell computes in (parity.core.dtypes): the cast/autocast dtype, tf32's (10-bit
    mantissa) for tf32, the fp32 value for int8/fp8 modes (their error is not a rounding of a float format).
    The config checked the names (parity.config.params): read from the table."""
    # lazy: the config loader imports this module; light stages' --help loads no numpy (+0.10 s, BENCHMARKS 22)
    from parity.core import dtypes

    mode = dtype_cfg.get("mode", DEFAULT_MODE)
    return dtypes.TABLE["tf32" if mode == "tf32" else dtype_cfg.get("torch", "float32")].u


def limits(dtype_cfg: dict) -> Limits:
    """(u, k, slack) of a conf dtype (`dtypes.<d>.oracle`): what every oracle verdict, a model's
    layer (parity.pipeline.diff), a suite case (parity.suites.diff), a generation step, a
    reduction or the report's limit line, is judged by. The one place these keys are read."""
    o = dtype_cfg["oracle"]
    return Limits(unit_roundoff(dtype_cfg), float(o["k"]), float(o.get("slack", DEFAULT_SLACK)))


def has_baseline(dtype_cfg: dict) -> bool:
    return dtype_cfg.get("mode", DEFAULT_MODE) in BASELINE_MODES


def number_format(dtype_cfg: dict) -> str:
    """The number format a conf dtype computes in, as parity.analysis.causes and parity.core.dtypes name it."""
    return MODE_FORMATS.get(dtype_cfg.get("mode", DEFAULT_MODE), dtype_cfg.get("torch", "float32"))


@dataclass(frozen=True)
class Rule:
    """Everything the config says about judging one cell (model x dtype), resolved once."""
    dtype: str                      # the conf dtype (dtypes.<d>)
    precision: str                  # dtypes.<d>.mode
    verdict: str                    # diff.verdict asked for
    max_mismatch: float             # diff.max_mismatch
    limits: Limits | None           # dtypes.<d>.oracle with the unit roundoff (None: a hand-made dtype without)
    baseline: bool                  # the trusted backend reproduces this precision (has_baseline)
    fp64: bool                      # reference.fp64: an fp64 run was asked for
    fmt: dtypes.Format              # the number format it computes in (parity.analysis.causes)
    reduced: dtypes.Format | None   # that format when it rounds coarser than fp32 (parity.core.dtypes.reduced)
    tolerances: dict                # layer -> (atol, rtol, source key): dtypes.<d>.tol, models.<m>.tolerances
    sample_sets: tuple              # (label, samples) per input shape (models.<m>.shapes); () without
