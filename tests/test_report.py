"""The report's tables without a browser: a tolerance said once per rule, the machine in the
environment section (from the env stage's real output)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT, env

from parity.pipeline import report_render as report


def layer(name, order, atol, rtol, src, passed=False):
    return {"name": name, "order": order, "atol": atol, "rtol": rtol, "tol_source": src, "passed": passed,
            "numel": 8, "n_outside": 0 if passed else 2, "max_abs": 1e-3, "max_rel": 1e-2, "rel_l2": 1e-3,
            "cosine": 1.0, "tol_ratio": 0.5 if passed else 3.0, "worst_sample": 1, "worst_index": [0, 3],
            "worst_actual": 1.5, "worst_expected": 1.4990000009536743, "problem": ""}


def cell(layers):
    return {"key": "m-fp16-ort_cpu", "metrics": {"verdict": "FAIL", "verdict_mode": "tolerance"}, "layers": layers,
            "modules": {"fc1": "Linear"}}


def test_one_tolerance_is_a_legend_line_and_several_get_a_rule_column():
    same = cell([layer("fc1", 0, 1e-5, 1e-3, "dtypes.fp16.tol"), layer("fc2", 1, 1e-5, 1e-3, "dtypes.fp16.tol")])
    assert report.tolerance_legend(same) == "Tolerance of every layer: atol=1e-05 rtol=0.001 (dtypes.fp16.tol)."
    head, rows = report.failing_rows(same)
    assert "rule" not in head and not any("atol" in x for r in rows for x in r)
    row = dict(zip(head, rows[0]))
    assert row["mismatched"] == "2 / 8 (25%)" and row["worst element"] == "sample 1 [0, 3]"
    assert row["actual"] == "1.5" and row["allowed"] == report.fmt(1e-5 + 1e-3 * 1.4990000009536743)
    two = cell([layer("fc1", 0, 1e-5, 1e-3, "dtypes.fp16.tol"), layer("fc2", 1, 1e-3, 1e-2, "models.m.tolerances[0]"),
                layer("out", 2, 1e-5, 1e-3, "dtypes.fp16.tol", passed=True)])
    assert report.tolerance_legend(two) == ("Tolerances (column rule): T1: atol=1e-05 rtol=0.001 (dtypes.fp16.tol); "
                                            "T2: atol=0.001 rtol=0.01 (models.m.tolerances[0]).")
    head, rows = report.failing_rows(two)
    assert head[-1] == "rule" and [r[-1] for r in rows] == ["T1", "T2"]
    head, rows = report.layer_rows(two)  # every layer, the passing one too
    assert [r[1] for r in rows] == ["fc1", "fc2", "out"] and [r[-1] for r in rows] == ["T1", "T2", "T1"]
    assert [r[3] for r in rows] == ["FAIL", "FAIL", "pass"]


def test_environment_names_the_cpu_os_and_thread_counts(tmp_path):
    out = tmp_path / "env"
    p = subprocess.run([sys.executable, "-m", "stages.env", "--out", str(out)], cwd=ROOT, env=env(),
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    fps = {f.stem: json.loads(f.read_text()) for f in out.glob("*.json") if not f.stem.startswith(("provider-", "stage-"))}
    rows = dict(report.environment_rows(fps, threads=0))
    if fps["cpu"].get("model_name"):  # x86's "model name" (aarch64 has none)
        assert fps["cpu"]["model_name"] in rows["CPU"]
    assert fps["host"]["os"] in rows["OS"] and fps["host"]["python"] in rows["OS"]
    assert f"{fps['host']['cpus_logical']} logical CPUs" in rows["threads"]
    assert "capture.threads = 0 (library default)" in rows["threads"]
    assert "onnxruntime" in rows and "host" not in rows
