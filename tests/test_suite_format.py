"""The suite format's features (issue 16): complex and per-tensor dtypes, seeded random values, file
modules, nested construct nodes, the dynamo exporter, a baseline choice, samples, skips per
(case, provider) and the all-zero-output guard: a suite using each validates (`parity suite
validate`) and runs through the real run and diff stages' code (isolated workers, real onnxruntime,
real Parquet)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from conftest import env
from parity.suites import spec

HELPER = '''\
import torch
from torch import nn


def itemsize(x):
    """The element size of the tensor it gets: 8 for float64, 2 for float16."""
    return torch.full((1,), float(x.element_size()))


class Scale(nn.Module):
    def __init__(self, inner, factor=2.0):
        super().__init__()
        self.inner, self.factor = inner, factor

    def forward(self, x):
        return self.inner(x) * self.factor
'''

SUITE = """\
feat:
  tolerances: []
  spec:
    dims: {B: 2, N: 4}
    presets:
      x: {shape: [B, N]}
      z: {shape: [B, N], dtype: complex}
      d: {shape: [B, N], dtype: float64}
      m: {shape: [B, N], dtype: bool, init: {bernoulli: 0.25}}
    cases:
      - {id: complex_fft, op: aten::fft_irfft, inputs: [z], export: {exporter: dynamo, opset: 20}}
      - {id: complex_legacy, op: torch.complex, inputs: [x, x]}
      - {id: complex_dynamo, op: torch.complex, inputs: [x, x], export: {exporter: dynamo, opset: 20}}
      - {id: fixed_f64, op: "file:suitehelp/toy.py::itemsize", inputs: [d]}
      - {id: follows_cell, op: "file:suitehelp/toy.py::itemsize", inputs: [x]}
      - {id: random_choice, op: aten::clamp, inputs: [x],
         kwargs: {min: {choice: [-0.5, null]}, max: {optional: {uniform: [0.25, 1.0]}, p_none: 0.3}}}
      - {id: where_bool, op: aten::where, inputs: [m, x, x]}
      - {id: file_module, module: "file:suitehelp/toy.py::Scale",
         args: [{construct: torch.nn.Linear, args: [N, 3]}], kwargs: {factor: 0.5}, inputs: [x]}
      - {id: nested_construct, module: torch.nn.Sequential,
         args: [{construct: torch.nn.Linear, args: [N, 4]}, {construct: torch.nn.Sigmoid}], inputs: [x]}
      - {id: baseline_fp64, op: aten::gelu, inputs: [x], baseline: torch_cpu@fp64}
      - {id: baseline_ort, op: aten::gelu, inputs: [x], baseline: ort_cpu@cell}
      - {id: samples3, op: aten::tanh, inputs: [x], samples: 3}
      - {id: skipped_on_ort, op: aten::relu, inputs: [x],
         skip_on: [{provider: "ort_*", reason: "known ORT gap, tracked elsewhere"}]}
      - {id: all_zero, op: aten::zeros_like, inputs: [x], zero_output: fail}
"""


@pytest.fixture(scope="module")
def feat_repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("feat")
    (root / "conf" / "suites").mkdir(parents=True)
    (root / "conf" / "suites" / "feat.yaml").write_text(SUITE)
    (root / "suitehelp").mkdir()
    (root / "suitehelp" / "toy.py").write_text(HELPER)
    return root


def test_each_feature_validates(feat_repo, monkeypatch):
    monkeypatch.chdir(feat_repo)
    p = subprocess.run([sys.executable, "-m", "parity.commands.suite_cli", "validate", "feat"], cwd=feat_repo, env=env(),
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "feat: OK, 14 cases" in p.stdout
    cases = {c["id"]: c for c in spec.expand("feat")}
    assert cases["complex_fft"]["export"] == {"exporter": "dynamo", "opset": 20}
    assert cases["baseline_ort"]["baseline"] == {"provider": "ort_cpu", "precision": "cell"}
    assert cases["nested_construct"]["ctor_args"][0]["construct"]["target"] == "torch.nn.Linear"


def test_validate_sees_the_helpers_the_workers_see_from_any_directory(feat_repo, tmp_path):
    """Workers run at the repository root; validating the suite file from elsewhere resolves its
    file: and import: helpers from that root too."""
    (feat_repo / "conf" / "suites" / "decl.yaml").write_text(
        "decl:\n  tolerances: []\n  spec:\n    import: suitehelp.toy\n    presets: {x: {shape: [4]}}\n"
        "    cases:\n      - {id: a, op: suitehelp.toy:itemsize, inputs: [x]}\n"
        "      - {id: b, module: 'file:suitehelp/toy.py::Scale', args: [{construct: torch.nn.ReLU}], inputs: [x]}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    p = subprocess.run([sys.executable, "-m", "parity.commands.suite_cli", "validate", str(feat_repo / "conf/suites/decl.yaml")],
                       cwd=elsewhere, env=env(), capture_output=True, text=True)
    (feat_repo / "conf" / "suites" / "decl.yaml").unlink()
    assert p.returncode == 0 and "decl.yaml: OK, 2 cases" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("text, message", [
    ("{id: a, op: aten::relu, inputs: [x], export: {exporter: dynamo, opset: 17}}",
     "key 'export.opset': opset 17 is out of range for the dynamo exporter (valid: [18, 25])"),
    ("{id: a, op: aten::relu, inputs: [x], baseline: ort_cpu@fp64}", "key 'baseline': bad baseline"),
    ("{id: a, op: aten::relu, inputs: [x], skip_on: [{provider: ort_cpu}]}", "key 'skip_on': "),
    ("{id: a, op: aten::relu, inputs: [x], kwargs: {min: {choice: []}}}", "choice: expected a non-empty list"),
    ("{id: a, module: 'file:suitehelp/nope.py::Scale', inputs: [x]}", "no file suitehelp/nope.py"),
    ("{id: a, module: 'file:suitehelp/toy.py::Nope', inputs: [x]}", "suitehelp/toy.py defines no 'Nope'"),
    ("{id: a, module: 'file:../toy.py::Scale', inputs: [x]}", "give a path inside the repository"),
    ("{id: a, module: 'file:suitehelp/toy.py::itemsize', inputs: [x]}", "is a function, not a class"),
])
def test_bad_feature_values_name_the_case_and_key(feat_repo, monkeypatch, text, message):
    monkeypatch.chdir(feat_repo)
    f = feat_repo / "conf" / "suites" / "bad.yaml"
    f.write_text(f"bad:\n  tolerances: []\n  spec:\n    presets: {{x: {{shape: [4]}}}}\n    cases:\n      - {text}\n")
    try:
        with pytest.raises(spec.SuiteError) as e:
            spec.expand("bad")
    finally:
        f.unlink()
    assert "case 'a'" in str(e.value) and message in str(e.value), str(e.value)


def _run(p, provider, dtype):
    from stages.suite_diff import diff_cell
    from stages.suite_run import run_cell

    import tempfile
    from pathlib import Path

    from parity.core import store
    from parity.core.io import write_json

    rows, outs, refs, timing, _ = run_cell(p, "feat", dtype, provider, workers=2)
    d = Path(tempfile.mkdtemp(dir="."))
    store.write(d / "outputs.parquet", outs, {})
    for what, ts in refs.items():  # reference, gold, floor
        store.write(d / f"{what}.parquet", ts, {})
    write_json(d / "results.json", {"cases": rows}, sort_keys=False)
    diffed = {r["id"]: r for r in diff_cell(p, "feat", dtype, d)}
    return {r["id"]: r for r in rows}, diffed, {t.name: t.array for t in store.read(d / "outputs.parquet")}


@pytest.fixture(scope="module")
def feat_results(feat_repo):
    import os

    from conftest import composed

    p = composed("dtypes=[fp32,fp16]", "providers=[torch_cpu,ort_cpu]")
    cwd = os.getcwd()
    os.chdir(feat_repo)
    try:
        p["suites"] = {"feat": yaml.safe_load(SUITE)["feat"]}
        return {(prov, dt): _run(p, prov, dt) for prov in ("torch_cpu", "ort_cpu") for dt in ("fp32", "fp16")}
    finally:
        os.chdir(cwd)


def test_each_feature_runs(feat_results):
    st = {k: {cid: r["status"] for cid, r in v[1].items()} for k, v in feat_results.items()}
    for cell in st:
        for cid in ("complex_fft", "random_choice", "where_bool", "file_module", "nested_construct", "baseline_fp64",
                    "baseline_ort", "samples3", "fixed_f64"):
            assert st[cell][cid] == "OK", (cell, cid, feat_results[cell][1][cid]["reason"])
        assert st[cell]["all_zero"] == "INVALID" and "all zeros" in feat_results[cell][1]["all_zero"]["reason"]
    # skip per (case, provider), with its reason; torch still runs it
    assert st[("ort_cpu", "fp16")]["skipped_on_ort"] == "SKIPPED"
    assert "known ORT gap" in feat_results[("ort_cpu", "fp16")][1]["skipped_on_ort"]["reason"]
    assert st[("torch_cpu", "fp16")]["skipped_on_ort"] == "OK"
    # torch.complex: the legacy exporter (opset 17) cannot export it, the dynamo exporter (opset 20) can
    assert st[("ort_cpu", "fp32")]["complex_legacy"] == "EXPORT_FAIL"
    assert st[("ort_cpu", "fp32")]["complex_dynamo"] == "OK"


def test_dtypes_random_values_and_samples_are_explicit(feat_results):
    rows, diffed, outs = feat_results[("torch_cpu", "fp16")]
    # a float64 preset stays float64 on the fp16 cell; a `float` preset follows the cell
    assert outs["fixed_f64/out:0"].tolist() == [8.0] and outs["follows_cell/out:0"].tolist() == [2.0]
    # what fp16 means for a complex case is said in the result
    assert "rounded to float16, computed in complex64" in diffed["complex_fft"]["note"]
    # random values are drawn from the case seed: recorded, and the same in every cell
    drawn = {k: v[0]["random_choice"]["drawn"] for k, v in feat_results.items()}
    assert len(drawn[("torch_cpu", "fp16")]) >= 2 and len({json.dumps(v) for v in drawn.values()}) == 1
    # samples: 3 independent draws, each compared
    assert [n for n in rows["samples3"]["outputs"]] == ["out:0", "out:0#s1", "out:0#s2"]
    assert not (outs["samples3/out:0"] == outs["samples3/out:0#s1"]).all()


def test_suite_show_prints_one_case_in_every_cell(feat_results, feat_repo, monkeypatch, capsys):
    from parity.core.io import write_json
    from parity.commands import suite_show as show

    monkeypatch.chdir(feat_repo)
    for (prov, dt), (_, diffed, _) in feat_results.items():
        write_json(feat_repo / "artifacts/suites/diff/feat" / f"{dt}-{prov}" / "results.json",
                   {"suite": "feat", "dtype": dt, "provider": prov, "cases": list(diffed.values())}, sort_keys=False)
    assert show.main(["feat", "skipped_on_ort"]) == 0
    out = capsys.readouterr().out
    assert "feat / skipped_on_ort  (aten::relu" in out and "skip_on:" in out
    cells = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.startswith(("torch_cpu/", "ort_cpu/")) and ":" not in line.split()[1]}
    assert cells["ort_cpu/fp16"] == "SKIPPED" and cells["torch_cpu/fp16"] == "OK" and len(cells) == 4
    assert "ort_cpu/fp16 reason: skip_on: known ORT gap" in out
    assert show.main(["feat", "skipped_on_or"]) == 2
    assert "no case 'skipped_on_or'. Close: skipped_on_ort" in capsys.readouterr().err
