"""generate.own_every (issue 35 item 2, the option): generation's own-error test, which runs at the
prompt's step and the first failing step, runs at every k-th step too when asked. A bad value is
refused at compose with one line naming the key; the default keeps the steps as they were. Real DVC,
a tiny Llama, real onnxruntime."""

from __future__ import annotations

import json

import pytest

from conftest import BIN, composed, config_error, make_repo
from test_generate import GEN_LLAMA

CELL = "generate@gen_llama-fp32-ort_cpu"


@pytest.mark.parametrize("value, must_say", [
    (-1, "generate.own_every: -1 is out of range (valid: [0, 4096])"),
    ("2", "generate.own_every: expected an integer, got '2'"),
    (1.5, "generate.own_every: expected an integer, got 1.5"),
])
def test_bad_own_every_names_the_key(value, must_say):
    assert must_say in config_error(composed(), lambda p: p["generate"].update(own_every=value))


def test_own_steps_default_and_every_k():
    from parity.pipeline.generate import own_steps

    assert own_steps(None, 8, 0) == [0] and own_steps(5, 8, 0) == [0, 5]  # the default: as before
    assert own_steps(None, 8, 3) == [0, 3, 6] and own_steps(5, 8, 3) == [0, 3, 5, 6]
    assert own_steps(None, 8, 8) == [0]


def test_own_error_runs_at_every_kth_step_when_asked(tmp_path):
    repo = make_repo(tmp_path / "repo", models=("gen_llama",), dtypes=("fp32",), providers=("ort_cpu",), compose=False)
    (repo.path / "conf/models/gen_llama.yaml").write_text(GEN_LLAMA)
    repo.edit("conf/config.yaml", "  models: []               # dvc exp run -S 'generate.models=[gpt2_small]'",
              "  models: [gen_llama]")
    repo.edit("conf/config.yaml", "  dtypes: [fp32]\n  providers: [torch_cpu, ort_cpu]\n  steps: 32",
              "  dtypes: [fp32]\n  providers: [ort_cpu]\n  steps: 5")
    repo.run([f"{BIN}/parity", "compose", "-S", "generate.own_every=2"])
    repo.commit("generate, own error every 2nd step")
    repo.repro(CELL)
    steps = json.loads((repo.path / "artifacts/generate/gen_llama-fp32-ort_cpu/steps.json").read_text())
    assert steps["verdict"] == "PASS" and list(steps["own"]) == ["0", "2", "4"], steps["own"]
    for r in steps["steps_detail"]:  # judged at those steps, as the per-layer cells judge it
        assert ("own_worst_excess" in r) is (r["step"] in (0, 2, 4)), r
        assert r.get("own_failed", []) == []
    assert all(o["prefix_len"] == 8 + int(t) for t, o in steps["own"].items())
