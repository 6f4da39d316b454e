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
    # the DVC metric (summary.json) carries each suite cell's counts, compactly (parity.core.metrics)
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


HELPER_SUITES = {
    "sa": """\
sa:
  tolerances: []
  spec:
    presets: {x: {shape: [2, 8]}}
    cases:
      - {id: double, op: "file:suitehelp/a.py::double", inputs: [x]}
""",
    "sb": """\
sb:
  tolerances: []
  spec:
    import: suitehelp.b
    presets: {x: {shape: [2, 8]}}
    cases:
      - {id: triple, op: "suitehelp.b:triple", inputs: [x]}
""",
}


@pytest.mark.slow
def test_helper_module_edit_and_dtype_scoped_rule_rerun_only_what_they_change(tmp_path):
    """Issue 16: editing a suite's helper module makes exactly that suite's stages stale, with bytecode
    on (users' machines write __pycache__ beside the helper); a tolerance rule scoped to fp16 re-runs
    only the fp16 suite diffs."""
    import os

    from conftest import ran_stages, run

    repo = make_repo(tmp_path / "repo", dtypes=("fp32", "fp16"), providers=("torch_cpu",))
    for name, text in HELPER_SUITES.items():
        (repo.path / "conf" / "suites" / f"{name}.yaml").write_text(text)
    (repo.path / "suitehelp").mkdir()
    (repo.path / "suitehelp" / "a.py").write_text("def double(x):\n    return x * 2\n")
    (repo.path / "suitehelp" / "b.py").write_text("def triple(x):\n    return x * 3\n")
    repo.edit("conf/config.yaml", "  - suites: []", "  - suites: [sa, sb]")
    repo.commit("two suites with helper modules")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode on, as on users' machines (conftest.env copies it)
    try:
        def exp_run():
            return set(ran_stages(run(["dvc", "exp", "run"], repo.path).stdout)) - {ENV}

        first = exp_run()
        assert {"suite_run@sa-fp16-torch_cpu", "suite_run@sb-fp16-torch_cpu"} <= first
        assert (repo.path / "suitehelp" / "__pycache__").is_dir()  # the workers imported the helpers with bytecode on
        code = json.loads((repo.path / "artifacts/code/suite-sa.json").read_text())
        assert list(code["files"]) == ["suitehelp/a.py"]
        repo.commit("ran")
        assert exp_run() == set()  # __pycache__ beside the helpers changes nothing
        repo.edit("suitehelp/a.py", "return x * 2", "return x * 2  # same numbers, edited code")
        ran = exp_run()
        # exactly suite sa's run stages (their results are the same bytes, so its diffs stop there;
        # coverage and report read the re-measured latencies)
        assert {"suite_run@sa-fp32-torch_cpu", "suite_run@sa-fp16-torch_cpu"} <= ran, ran
        assert ran <= {"suite_run@sa-fp32-torch_cpu", "suite_run@sa-fp16-torch_cpu", "suite_coverage@sa", "report"}, ran
        repo.commit("edited helper a")
        repo.edit("conf/suites/sa.yaml", "  tolerances: []", "  tolerances:\n    - {dtype: fp16, atol: 1.0e-2, rtol: 1.0e-2}")
        repo.commit("fp16 rule")
        ran = exp_run()
        assert "suite_diff@sa-fp16-torch_cpu" in ran, ran
        assert ran <= {"suite_diff@sa-fp16-torch_cpu", "suite_coverage@sa", "report"}, ran  # no fp32 diff, no run
    finally:
        os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
