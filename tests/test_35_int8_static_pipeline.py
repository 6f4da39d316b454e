"""The int8_static quantised oracle in the pipeline (issue 35 item 3): real DVC in a temporary git repo,
a tiny pre-norm transformer block (LayerNorm, attention with Softmax, 4 weight MatMuls), real
onnxruntime quantize_static calibrated on the inputs stage's calibration samples. Parity quantises the
export itself (its own placement, MinMax calibration, scales): unfaulted the cell PASSes by the oracle
with every calibrated parameter equal to the provider's and the cost reported apart from the verdict;
fc1's weight x1.1 FAILs at fc1, its quantised weight named as differing from parity's."""

from __future__ import annotations

import json

import pytest

from conftest import BIN, TINY_TB, make_repo

CELL = "tiny_tb-int8_static-ort_int8"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    r = make_repo(tmp_path_factory.mktemp("quant_static") / "repo", compose=False)
    (r.path / "conf/models/tiny_tb.yaml").write_text(TINY_TB)
    r.set_defaults(models=["tiny_tb"], dtypes=["int8_static"], providers=["ort_int8"])
    r.run([f"{BIN}/parity", "compose"])
    r.commit("tiny_tb int8_static")
    return r


def read(repo, rel: str) -> dict:
    return json.loads((repo.path / "artifacts" / rel).read_text())


def test_int8_static_passes_by_its_quantised_oracle_with_the_cost_apart(repo):
    assert f"diff@{CELL}" in repo.exp_run()
    info = read(repo, f"capture/{CELL}/quant_oracle.json")
    assert info["scheme"] == "int8_static" and info["quantised_nodes"] == 4, info
    assert info["checked_against_reference"] and info["graph_vs_reference"]["rel_l2"] < 1e-5
    act = info["activations"]
    assert act["compared"] >= 10 and act["differ"] == [], act
    assert info["weights"] and all(w["matches"] for w in info["weights"]), info["weights"]
    m = read(repo, f"diff/{CELL}/metrics.json")
    assert m["verdict"] == "PASS" and m["verdict_mode"] == "oracle", m
    assert m["quant"]["scheme"] == "int8_static" and m["quant"]["cost_output"] > 1e-3 and not m["quant"]["weights_differ"]
    layers = {r["name"]: r for r in read(repo, f"diff/{CELL}/layers.json")["layers"]}
    assert layers["fc1"]["oracle"]["quant_cost"] > 1e-3
    report = (repo.path / "artifacts/report/report.md").read_text()
    assert "## Quantisation cost (expected, not judged)" in report and f"{CELL} (int8_static, PASS)" in report


def test_a_ten_percent_weight_error_fails_at_its_layer(repo):
    if not (repo.path / f"artifacts/capture/{CELL}/quant_oracle.json").exists():
        repo.exp_run()
    layers = read(repo, f"capture/{CELL}/quant_oracle.json")["layers"]
    node = next(n for n, layer in layers.items() if layer == "fc1")
    repo.exp_run(f"+providers.ort_int8.options.fault={{node: {node}, scale: 1.1}}")
    m = read(repo, f"diff/{CELL}/metrics.json")
    assert m["verdict"] == "FAIL" and m["verdict_mode"] == "oracle" and m["drift_origin"] == "fc1", m
    assert "limit" not in (m["drift_origin_cause"]["summary"] or ""), m["drift_origin_cause"]
    assert m["quant"]["weights_differ"] == ["fc1"], m["quant"]
