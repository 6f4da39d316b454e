"""Suites judged by the fp64 oracle as models are (parity.suites.diff, parity.core.oracle.judge):
a case one fp16 roundoff off passes where the fixed tolerance called it a MISMATCH, a real fault
still fails, a suite's `tolerances:` rule (or `diff.verdict: tolerance`) keeps the fixed tolerance,
and an opdiff suite's toy LayerNorm cases pass at fp16 through `import-opdiff` and the worker pool
while a wrong epsilon fails."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import yaml

from conftest import ROOT, env
from parity.suites import diff

U16 = 2.0 ** -11


def _params(rules=(), verdict="oracle") -> dict:
    p = yaml.safe_load((ROOT / "params.yaml").read_text())
    p["diff"]["verdict"] = verdict
    p["suites"] = {"s": {"tolerances": list(rules), "spec": {"cases": []}}}
    return p


def _case(out: np.ndarray, gold: np.ndarray, floor_from="none", floor=None, rules=(), verdict="oracle"):
    """The suite diff of one synthetic case at fp16: `out` (the provider, fp16 values), its fp32
    reference (gold rounded to fp32), `gold` (float64)."""
    row = {"id": "ln", "label": "toy", "kind": "module", "status": "OK", "outputs": ["out:0"], "floor_from": floor_from}
    return diff.diff_case(_params(rules, verdict), "s", "fp16", row, {"out:0": out.astype(np.float32)},
                          {"out:0": gold.astype(np.float32)}, gold={"out:0": gold},
                          floor=None if floor is None else {"out:0": floor.astype(np.float32)})


@pytest.fixture
def one_ulp_off():
    """fp16 values one ulp above the float64 truth: what a chain of fp16 ops leaves."""
    gold = np.random.default_rng(0).normal(size=(2, 64))
    return np.nextafter(gold.astype(np.float16), np.float16(np.inf)), gold


def test_one_roundoff_passes_under_the_oracle_and_mismatches_a_fixed_tolerance(one_ulp_off):
    out, gold = one_ulp_off
    fixed = _case(out, gold, verdict="tolerance")
    assert fixed["status"] == "MISMATCH" and fixed["verdict"] == "tolerance" and fixed["tol_ratio"] > 1
    res = _case(out, gold)
    assert res["status"] == "OK", res["reason"]
    assert res["verdict"] == "oracle" and res["oracle_k"] == 4.0 and 1.0 < res["excess"] < 4.0
    assert res["floor_from"] == "none" and res["tol_ratio"] == fixed["tol_ratio"]  # both metrics reported


def test_a_real_fault_still_fails_naming_excess_and_key(one_ulp_off):
    _, gold = one_ulp_off
    res = _case((gold * 1.01).astype(np.float16), gold)  # a weight scaled by 1.01
    assert res["status"] == "MISMATCH" and res["excess"] > 4.0
    assert "out:0: excess" in res["reason"] and "> k 4" in res["reason"] and "<dtypes.fp16.oracle>" in res["reason"]


def test_the_trusted_backends_error_is_the_floor(one_ulp_off):
    out, gold = one_ulp_off
    bad = out.astype(np.float64) + 8 * U16 * np.abs(gold)  # ~8 roundoffs off: fails against u x rms alone
    assert _case(bad, gold)["status"] == "MISMATCH"
    res = _case(bad, gold, floor_from="floor", floor=bad - 2 * U16 * np.abs(gold))  # the trusted one is as bad
    assert res["status"] == "OK" and res["floor_from"] == "floor", res["reason"]


def test_a_suite_tolerance_rule_keeps_the_fixed_tolerance(one_ulp_off):
    out, gold = one_ulp_off
    res = _case(out, gold, rules=[{"dtype": "fp16", "case": "l*", "atol": 1e-5, "rtol": 1e-4}])
    assert res["status"] == "MISMATCH" and res["verdict"] == "tolerance" and res.get("excess") is None
    assert res["tol_source"] == "suites.s.tolerances[0]" and "<suites.s.tolerances[0]>" in res["reason"]
    assert _case(out, gold, rules=[{"dtype": "bf16", "atol": 1e-5, "rtol": 1e-4}])["verdict"] == "oracle"
    loose = _case((gold * 1.01).astype(np.float16), gold, rules=[{"atol": 0.1, "rtol": 0.1}])
    assert loose["status"] == "OK" and loose["verdict"] == "tolerance"  # a bound the suite chose, as before


def test_without_a_float64_run_the_case_is_judged_by_tolerance(one_ulp_off):
    out, gold = one_ulp_off
    row = {"id": "x", "label": "x", "kind": "op", "status": "OK", "outputs": ["out:0"],
           "oracle_note": "no fp64 run (RuntimeError: no float64 kernel): judged by tolerance"}
    res = diff.diff_case(_params(), "s", "fp16", row, {"out:0": out.astype(np.float32)},
                         {"out:0": gold.astype(np.float32)})
    assert res["status"] == "MISMATCH" and res["verdict"] == "tolerance" and "no float64 kernel" in res["oracle_note"]


# ------------------------------------------------------- import-opdiff, run at fp16 (worker pool)
TOY = '''\
import torch
import torch.nn as nn
import torch.nn.functional as F


class ToyLN(nn.Module):
    """Linear -> GELU -> LayerNorm -> Linear."""

    def __init__(self, in_dim, hidden_dim, out_dim, eps=1e-5, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1, self.ln, self.fc2 = nn.Linear(in_dim, hidden_dim), nn.LayerNorm(hidden_dim, eps=eps), \\
            nn.Linear(hidden_dim, out_dim)

    def forward(self, x):
        return self.fc2(self.ln(F.gelu(self.fc1(x))))
'''

OPDIFF = """\
dims: {B: 2, N: 4}
presets:
  x_bn: {type: tensor, shape: [B, N], kind: float, init: normal}
tests:
  - id: toy_ln
    op: {type: module, path: file:examples/toy.py::ToyLN, args: [4, 32, 7], kwargs: {seed: 0}}
    in: [{ref: x_bn}]
  - id: toy_ln_templated
    op:
      type: template_module
      path: file:examples/toy.py::ToyLN
      vars: {hidden_dim: [16, 32]}
      args: [4, {var: hidden_dim}, 7]
    in: [{ref: x_bn}]
  - id: toy_ln_wrong_eps
    op:
      type: template_compare_pair
      vars: {}
      common: {args: [4, 32, 7]}
      a: {type: module, path: file:examples/toy.py::ToyLN}
      b: {type: module, path: file:examples/toy.py::ToyLN, kwargs: {eps: 1.0e-2}}
    in: [{ref: x_bn}]
"""


def test_opdiff_toy_layernorm_cases_pass_at_fp16_and_a_wrong_epsilon_fails(tmp_path, monkeypatch):
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples/__init__.py").write_text("")
    (tmp_path / "examples/toy.py").write_text(TOY)
    (tmp_path / "od.yaml").write_text(OPDIFF)
    c = subprocess.run([sys.executable, "-m", "parity.commands.suite_cli", "import-opdiff", "od.yaml", "--name", "od"],
                       cwd=tmp_path, env=env(), capture_output=True, text=True)
    assert c.returncode == 0, c.stdout + c.stderr
    monkeypatch.chdir(tmp_path)
    from parity.pipeline.suite_run import run_cell
    from parity.suites import spec

    p = _params()
    p["suites"] = {"od": spec.load_section("od", tmp_path / "conf/suites")[0]}
    rows, outs, refs, _, _ = run_cell(p, "od", "fp16", "torch_cpu", workers=1)
    by: dict = {}
    for what, ts in [("outputs", outs), *refs.items()]:
        for t in ts:
            cid, _, name = t.name.partition("/")
            by.setdefault(what, {}).setdefault(cid, {})[name] = t.array
    res = {}
    for verdict in ("oracle", "tolerance"):
        p["diff"]["verdict"] = verdict
        res[verdict] = {r["id"]: diff.diff_case(p, "od", "fp16", r, *(by.get(w, {}).get(r["id"]) or {} for w in
                                                                      ("outputs", "reference")),
                                                gold=by.get("gold", {}).get(r["id"]),
                                                floor=by.get("floor", {}).get(r["id"])) for r in rows}
    toys = ["toy_ln", "toy_ln_templated__hidden_dim=16", "toy_ln_templated__hidden_dim=32"]
    assert {k: v["status"] for k, v in res["oracle"].items()} == {**{t: "OK" for t in toys}, "toy_ln_wrong_eps": "MISMATCH"}
    assert all(res["oracle"][t]["verdict"] == "oracle" and res["oracle"][t]["excess"] < 4 for t in toys)
    assert res["oracle"]["toy_ln_wrong_eps"]["excess"] > 4 and res["oracle"]["toy_ln_wrong_eps"]["floor_from"] == "reference"
    assert res["tolerance"]["toy_ln_wrong_eps"]["status"] == "MISMATCH"
