"""The one tolerance resolver (core): a dtype's default (atol, rtol), then an ordered list of rules,
the last matching one winning (torch.testing's dtype table, overridable per model layer or per suite
case). Every result names the key it came from (`tol_source`), so a user can find it.

Beside it, the verdict settings: `diff.verdict` (oracle | tolerance) and `diff.max_mismatch`, which
every model cell (parity.analysis.diffcell) and suite case (parity.suites.diff) is judged by, read here
and nowhere else; parity.core.verdict resolves them with the rest of a cell's rule."""

from __future__ import annotations

import fnmatch

VERDICT_MODES = ("oracle", "tolerance")  # diff.verdict


def verdict(p: dict) -> str:
    """diff.verdict: the verdict mode asked for, oracle unless given (a cell whose oracle cannot run is
    judged by tolerance: parity.analysis.diffcell.verdict_mode says why)."""
    return (p.get("diff") or {}).get("verdict", "oracle")


def max_mismatch(p: dict) -> float:
    """diff.max_mismatch: the fraction of a layer's (or tensor's) elements allowed outside (atol, rtol),
    0 unless given (as torch.testing.assert_close)."""
    return float((p.get("diff") or {}).get("max_mismatch", 0.0))


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
