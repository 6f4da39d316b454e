"""Suites on real DVC: one run and one diff stage per (suite, dtype, provider); changing one suite's
tolerance re-runs only that suite's diff (and coverage) stages."""

from __future__ import annotations

import json

import pytest

from conftest import ENV, make_repo


@pytest.mark.slow
def test_tolerance_change_reruns_only_that_suites_diffs(tmp_path):
    repo = make_repo(tmp_path / "repo", dtypes=("fp16",), providers=("torch_cpu",))
    ran = repo.exp_run("suites=[critical,modules]")
    assert {"suite_run@critical-fp16-torch_cpu", "suite_run@modules-fp16-torch_cpu",
            "suite_diff@critical-fp16-torch_cpu", "suite_diff@modules-fp16-torch_cpu",
            "suite_coverage@critical", "suite_coverage@modules"} <= set(ran)
    m = json.loads((repo.path / "artifacts/suites/diff/critical/fp16-torch_cpu/metrics.json").read_text())
    assert m["cases"] >= 18 and m["grad_checked"] >= 15
    assert (repo.path / "artifacts/suites/coverage/critical.csv").read_text().startswith("op,case,")
    # the DVC metric (summary.json) carries each suite cell's counts, compactly (parity.metrics)
    s = json.loads((repo.path / "artifacts/report/summary.json").read_text())["suites"]
    assert s["critical-fp16-torch_cpu"] == {"cases": m["cases"], "ok": m["ok"]} and "modules-fp16-torch_cpu" in s
    # keep the selection in conf/ (a queued/next `dvc exp run` composes from conf/ defaults)
    repo.edit("conf/config.yaml", "  - suites: []", "  - suites: [critical, modules]")
    repo.commit("select suites")
    assert set(repo.exp_run()) - {ENV} == set()
    repo.edit("conf/suites/critical.yaml", "{dtype: fp16, kind: grad, atol: 2.0e-2", "{dtype: fp16, kind: grad, atol: 3.0e-2")
    repo.commit("loosen critical fp16 grads")
    ran = set(repo.exp_run()) - {ENV}
    # the report shows the coverage matrix (its dependency report.coverage_dep), so it re-renders too
    assert ran == {"suite_diff@critical-fp16-torch_cpu", "suite_coverage@critical", "report"}, ran
