"""The verdict settings (diff.verdict, diff.max_mismatch) and the oracle limits (dtypes.<d>.oracle) are
read in one place each: parity.core.tolerance and parity.core.verdict.limits (the verdict resolver, with
the Rule of a cell; in-process, no pipeline)."""

import re
from pathlib import Path

import pytest

from parity.core import tolerance
from parity.analysis import oracle

ROOT = Path(__file__).resolve().parents[1]
# a read with its default restated (the config keys, not the result field "verdict" of metrics)
READS = {"parity/core/tolerance.py": re.compile(r"get\(\"(verdict|max_mismatch)\", "),
         "parity/core/verdict.py": re.compile(r"get\(\"(k|slack)\", |DEFAULT_K")}


def test_verdict_settings_and_their_defaults():
    assert tolerance.verdict({}) == "oracle" and tolerance.verdict({"diff": None}) == "oracle"
    assert tolerance.verdict({"diff": {"verdict": "tolerance"}}) == "tolerance"
    assert tolerance.max_mismatch({"diff": {}}) == 0.0
    assert tolerance.max_mismatch({"diff": {"max_mismatch": 0.02}}) == 0.02


def test_oracle_limits_k_required_slack_zero_unless_given():
    lim = oracle.limits({"torch": "float16", "mode": "cast", "oracle": {"k": 4.0}})
    assert lim == (2.0 ** -11, 4.0, 0.0) and lim.k == 4.0
    tf32 = {"torch": "float32", "mode": "tf32", "oracle": {"k": 2, "slack": 1e-6}}
    assert oracle.limits(tf32) == (2.0 ** -11, 2.0, 1e-6)
    with pytest.raises(KeyError):
        oracle.limits({"torch": "float16", "tol": {"atol": 1e-5, "rtol": 1e-3}})  # config makes it required


@pytest.mark.parametrize("owner", sorted(READS))
def test_no_other_module_restates_the_defaults(owner):
    pat = READS[owner]
    files = [f for d in ("parity", "stages") for f in sorted((ROOT / d).rglob("*.py"))]
    found = [f"{f.relative_to(ROOT)}:{n}" for f in files if str(f.relative_to(ROOT)) != owner
             for n, line in enumerate(f.read_text().splitlines(), 1) if pat.search(line)]
    assert found == [], f"read outside {owner}: {found}"
