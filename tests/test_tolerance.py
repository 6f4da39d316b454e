"""The verdict settings (diff.verdict, diff.max_mismatch) and the oracle limits (dtypes.<d>.oracle) are
read in one place: parity.core.tolerance (the verdict resolver), the settings' defaults in the typed config
(parity.config.schema, which builds the Rule of a cell; in-process, no pipeline)."""

import dataclasses
import re
from pathlib import Path

import pytest

from parity.core import oracle

ROOT = Path(__file__).resolve().parents[1]
# a read with its default restated (the config keys, not the result field "verdict" of metrics)
READS = {"parity/core/tolerance.py": re.compile(r"get\(\"(verdict|max_mismatch|k|slack)\", |DEFAULT_K")}


def test_verdict_settings_and_their_defaults():
    from parity.config import schema

    assert schema.of({}).diff.verdict == "oracle" and schema.of({"diff": None}).diff.verdict == "oracle"
    assert schema.of({"diff": {"verdict": "tolerance"}}).diff.verdict == "tolerance"
    assert schema.of({"diff": {}}).diff.max_mismatch == 0.0
    assert schema.of({"diff": {"max_mismatch": 0.02}}).diff.max_mismatch == 0.02


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


def test_the_rule_of_a_cell_is_resolved_once_with_its_layers_tolerances_and_facts():
    """parity.config.schema.rule: what the diff of a cell reads of the config, in one frozen Rule."""
    from parity.config import schema
    from parity.core import dtypes

    p = {"diff": {"verdict": "tolerance", "max_mismatch": 0.01}, "inputs": {"samples": 2},
         "reference": {"fp64": True},
         "dtypes": {"fp16": {"torch": "float16", "mode": "cast", "tol": {"atol": 1e-5, "rtol": 1e-3},
                             "oracle": {"k": 4.0, "slack": 1e-6}},
                    "int8": {"torch": "float32", "mode": "int8_static", "tol": {"atol": 0.05, "rtol": 0.05},
                             "oracle": {"k": 2.0}}},
         "models": {"m": {"tolerances": [{"layer": "fc*", "atol": 1e-2, "rtol": 1e-2}],
                          "shapes": {"s1": {"x": [1, 4]}, "s2": {"x": [2, 4]}}}}}
    r = schema.rule(p, "m", "fp16", ["fc1", "out"])
    assert (r.verdict, r.max_mismatch, r.fp64, r.baseline, r.precision) == ("tolerance", 0.01, True, True, "cast")
    assert r.limits == (2.0 ** -11, 4.0, 1e-6) and r.fmt is dtypes.FP16 and r.reduced is dtypes.FP16
    assert r.tolerances == {"fc1": (1e-2, 1e-2, "models.m.tolerances[0]"), "out": (1e-5, 1e-3, "dtypes.fp16.tol")}
    assert r.sample_sets == (("s1", range(0, 2)), ("s2", range(2, 4)))
    q = schema.rule(p, "m", "int8", [])
    assert q.fmt.name == "int8" and q.limits == (2.0 ** -24, 2.0, 0.0) and not q.baseline
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.verdict = "oracle"
