"""Suites: YAML expansion and validation errors (file, case, key), isolated workers (CRASH, TIMEOUT,
restart), per-case statuses, coverage matrix and its HTML, light modules, and the default pipeline
staying free of suite stages."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import yaml

from conftest import ROOT, env
from parity.suites import coverage, diff, render, spec

BAD = {
    "unknown_preset": ("""\
bad:
  spec:
    dims: {N: 8}
    presets: {x: {shape: [N]}}
    cases:
      - {id: relu, op: aten::relu, inputs: [x]}
      - {id: gelu, op: aten::gelu, inputs: [y]}
""", "case 'gelu': key 'inputs': unknown preset 'y'"),
    "bad_template_variable": ("""\
bad:
  spec:
    presets: {x: {shape: [4]}}
    cases:
      - {id: "softmax_d{dim}", op: aten::softmax, inputs: [x], args: ["{dmi}"], vars: {dim: [0]}}
""", "case 'softmax_d0': key 'args': unknown template variable '{dmi}'"),
    "unknown_op": ("""\
bad:
  spec:
    presets: {x: {shape: [4]}}
    cases:
      - {id: frob, op: aten::frobnicate, inputs: [x]}
""", "case 'frob': key 'op': unknown op 'aten::frobnicate'"),
    "unknown_dim": ("""\
bad:
  spec:
    presets: {x: {shape: [Q]}}
    cases: []
""", "key 'spec.presets.x': unknown dim 'Q'"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_validate_names_file_case_and_key_and_runs_nothing(tmp_path, name):
    text, expected = BAD[name]
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    p = subprocess.run([sys.executable, "-m", "parity.commands.suite_cli", "validate", str(f)], cwd=tmp_path, env=env(),
                       capture_output=True, text=True)
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"bad.yaml: {expected}" in p.stderr, p.stderr  # the file, the case and the key
    assert sorted(x.name for x in tmp_path.iterdir()) == ["bad.yaml"]  # nothing written, nothing run


def test_templates_pairs_includes_and_dims(tmp_path):
    (tmp_path / "base.yaml").write_text("base:\n  spec:\n    presets: {v: {shape: [3]}}\n"
                                        "    cases: [{id: b_relu, op: aten::relu, inputs: [v]}]\n")
    (tmp_path / "top.yaml").write_text("""\
top:
  tolerances: [{dtype: fp16, case: "sm*", atol: 1.0e-2, rtol: 1.0e-2}]
  spec:
    include: [base]
    dims: {B: 2, D: 4, H: 2*D}
    presets:
      x: {shape: [B, H]}
      i: {shape: [B], dtype: int, init: {randint: [0, D]}}
    cases:
      - {id: "sm_d{d}_{t}", op: aten::softmax, inputs: [x], args: ["{d}"], vars: {d: [0, 1], t: [a, b]},
         skip: [{d: 0, t: b}]}
      - {id: lin, module: torch.nn.Linear, args: [H, D], inputs: [x]}
      - {id: p, pair: {a: {op: aten::gelu}, b: {op: aten::gelu, kwargs: {approximate: tanh}}}, inputs: [x]}
      - {id: isel, op: aten::index_select, args: [$x, 0, $i]}
""")
    cases = spec.expand("top", root=tmp_path)
    assert [c["id"] for c in cases] == ["b_relu", "sm_d0_a", "sm_d1_a", "sm_d1_b", "lin", "p", "isel"]
    assert cases[0]["file"].endswith("base.yaml")
    assert cases[1]["call_args"][0]["tensor"]["shape"] == [2, 8] and cases[2]["call_args"][1] == 1
    assert cases[4]["ctor_args"] == [8, 4]
    assert cases[6]["call_args"][2]["tensor"]["init"] == {"randint": [0, 4]}
    p = {"dtypes": {"fp16": {"tol": {"atol": 1e-5, "rtol": 1e-3}}}, "suites": {"top": yaml.safe_load(
        (tmp_path / "top.yaml").read_text())["top"]}}
    assert spec.tolerance_for(p, "top", "fp16", "sm_d0_a", "out") == (1e-2, 1e-2, "suites.top.tolerances[0]")
    assert spec.tolerance_for(p, "top", "fp16", "lin", "out") == (1e-5, 1e-3, "dtypes.fp16.tol")


def test_shipped_suites_expand():
    n = {s: len(spec.expand(s)) for s in ("critical", "top50", "modules", "selftest", "opinfo")}
    assert n["critical"] >= 18 and n["modules"] >= 10
    ops = {c["opinfo"]["name"] for c in spec.expand("opinfo")}
    assert len(ops) >= 300


@pytest.fixture(scope="module")
def selftest_fp16():
    """The selftest suite on torch_cpu fp16 through the real worker pool: the `sleep` case's own
    timeout is 2 s, every other case has the suite's (120 s: a loaded machine must not time out an
    honest case, as it did with one 2 s limit for all)."""
    p = yaml.safe_load((ROOT / "params.yaml").read_text())
    sec, _ = spec.load_section("selftest")
    (sleep,) = [c for c in sec["spec"]["cases"] if c["id"] == "sleep"]
    sleep["timeout_s"] = 2
    p["suites"] = {"selftest": sec}
    from parity.pipeline.suite_run import run_cell

    t0 = time.perf_counter()
    rows, outs, refs, timing, stats = run_cell(p, "selftest", "fp16", "torch_cpu", workers=2)
    wall = time.perf_counter() - t0
    o, r, g, f = {}, {}, {}, {}
    for ts, d in ((outs, o), (refs["reference"], r), (refs["gold"], g), (refs["floor"], f)):
        for t in ts:
            cid, _, name = t.name.partition("/")
            d.setdefault(cid, {})[name] = t.array
    res = {row["id"]: diff.diff_case(p, "selftest", "fp16", row, o.get(row["id"], {}), r.get(row["id"], {}),
                                     gold=g.get(row["id"]), floor=f.get(row["id"]))
           for row in rows}
    return res, stats, wall


def test_crash_and_timeout_cost_one_case_each(selftest_fp16):
    res, stats, _ = selftest_fp16
    st = {k: v["status"] for k, v in res.items()}
    assert st["abort"] == st["segfault"] == st["exit3"] == "CRASH"
    assert "SIGABRT" in res["abort"]["reason"] and "SIGSEGV" in res["segfault"]["reason"]
    assert "code 3" in res["exit3"]["reason"]
    assert st["sleep"] == "TIMEOUT" and "2 s" in res["sleep"]["reason"]
    assert st["relu_before"] == st["relu_after"] == st["add_a1"] == st["add_a2"] == "OK"
    assert all(v in diff.STATUS_ORDER for v in st.values())  # every case has a result
    assert stats["crashes"] == 3 and stats["timeouts"] == 1 and 3 <= stats["restarts"] <= 4  # none needed after the last case


def test_statuses_from_the_diff(selftest_fp16):
    res, _, _ = selftest_fp16
    st = {k: v["status"] for k, v in res.items()}
    assert st["raises"] == "INVALID"
    assert st["nan_below_fp32"] == "NAN_IN_OUTPUT"
    assert st["nan_at_fp32"] == "NAN_IN_REFERENCE"
    assert st["off_by_a_bit"] == "MISMATCH" and "excess" in res["off_by_a_bit"]["reason"]  # the fp64 oracle's
    assert st["scaled_tanh_gradcheck"] == "OK"
    assert st["bad_tanh_gradcheck"] == "MISMATCH" and "gradcheck" in res["bad_tanh_gradcheck"]["reason"]
    assert res["seed_mlp"]["grad_tol_ratio"] is not None  # input + parameter grads compared


def test_coverage_matrix_and_html(selftest_fp16, tmp_path):
    res, _, _ = selftest_fp16
    from parity.core.io import write_json

    write_json(tmp_path / "diff" / "fp16-torch_cpu" / "results.json", {"cases": list(res.values())}, sort_keys=False)
    cov = coverage.build("selftest", [("fp16", "torch_cpu"), ("fp16", "ort_cpu")], tmp_path / "diff", None, 17,
                         ["ort_cpu"])
    by_op = {r["op"]: r for r in cov["ops"]}
    assert by_op["parity.suites.testops:abort"]["cells"]["torch_cpu/fp16"]["status"] == "CRASH"
    assert by_op["aten::add"]["cases"] == 2
    assert by_op["aten::add"]["cells"]["ort_cpu/fp16"]["status"] == "NOT_RUN"
    # a row per case, grouped by op, with that case's own numbers
    add_rows = [r for r in cov["rows"] if r["op"] == "aten::add"]
    assert len(add_rows) == 2 and len({r["case"] for r in add_rows}) == 2
    idx = [i for i, r in enumerate(cov["rows"]) if r["op"] == "aten::add"]
    assert idx == list(range(idx[0], idx[0] + 2))  # adjacent: grouped by op
    ok_case = next(r for r in add_rows if r["cells"]["torch_cpu/fp16"]["status"] == "OK")
    assert ok_case["cells"]["torch_cpu/fp16"]["max_abs"] is not None
    csv_lines = coverage.to_csv(cov).splitlines()
    assert csv_lines[0] == "op,case,onnx_ops(opset 17),torch_cpu/fp16,ort_cpu/fp16"
    assert sum(1 for line in csv_lines if line.startswith("aten::add,")) == 2
    html = render.render_coverage_html(cov)
    assert 'title="CRASH: abort: worker killed by SIGABRT' in html
    anchor = render.case_anchor("selftest", ok_case["case"])
    assert f"href='#{anchor}'" in html and f"<details id='{anchor}'>" in html  # the matrix links the numbers
    assert "<script" not in html and "http" not in html and "<svg" in html


@pytest.mark.parametrize("module", ["stages.suite_run", "stages.suite_diff", "stages.suite_coverage",
                                    "parity.suites.render", "parity.suites.coverage", "parity.commands.suite_cli",
                                    "parity.suites.pool", "parity.config.params"])
def test_light_suite_modules_do_not_import_torch(module):
    code = (f"import sys, importlib; importlib.import_module({module!r}); "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env(), capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_default_pipeline_has_no_suite_stages():
    p = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert p["suites"] == {}
    out = subprocess.run(["dvc", "stage", "list", "--name-only"], cwd=ROOT, env=env(), capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    names = out.stdout.split()
    assert names and not [n for n in names if n.startswith("suite_")]
