"""Cause labels on faults injected into real models (`pytest -m slow`): the exported graphs of
resnet18 and mobilenet_v3_small on ort_cpu at fp32, one fault each (parity.analysis.faults), captured
and diffed by the stages; the diff names the faulty layer as drift origin and labels it."""

from __future__ import annotations

import json

import pytest

from conftest import make_repo

pytestmark = pytest.mark.slow

CASES = [  # model, fault, target, options, label, text the summary holds
    ("resnet18", "fp16_round", "layer1.0.conv1", {}, "narrow_format", "rounded to fp16 at this layer"),
    ("resnet18", "channel_swap", "layer2.0.conv1", {"channels": [3, 7]}, "channel_permutation",
     "channels 3 and 7 swapped"),
    ("resnet18", "relu_leaky", "layer1.0.relu", {"value": 0.01}, "op_substitution",
     "computes LeakyRelu(alpha=0.01) where the reference computes Relu"),
    ("mobilenet_v3_small", "hardsigmoid_sigmoid", "features.1.block.1.scale_activation", {}, "op_substitution",
     "computes Sigmoid where the reference computes HardSigmoid(alpha=1/6)"),
]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    r = make_repo(tmp_path_factory.mktemp("faults") / "repo", models=("resnet18", "mobilenet_v3_small"),
                  dtypes=("fp32",), providers=("ort_cpu",))
    r.repro()
    return r


@pytest.mark.parametrize("model,fault,target,options,label,text", CASES, ids=[c[1] for c in CASES])
def test_injected_fault_gets_its_label(repo, tmp_path, model, fault, target, options, label, text):
    from parity.analysis.faults import inject_dir

    inject_dir(repo.path / "artifacts/models" / model, tmp_path / "model", fault, target, **options)
    cell = ["--model", model, "--dtype", "fp32", "--provider", "ort_cpu"]
    repo.run(["python", "-m", "stages.capture", *cell, "--model-dir", str(tmp_path / "model"),
              "--inputs", f"artifacts/inputs/{model}.parquet",
              "--reference", f"artifacts/reference/{model}/fp64.parquet",
              "--out", str(tmp_path / "capture"), "--timing", str(tmp_path / "t.json")])
    repo.run(["python", "-m", "stages.diff", *cell, "--capture", str(tmp_path / "capture"),
              "--reference", f"artifacts/reference/{model}", "--baseline", f"artifacts/baseline/{model}/fp32",
              "--model-dir", str(tmp_path / "model"), "--out", str(tmp_path / "diff"),
              "--timing", str(tmp_path / "d.json")])
    m = json.loads((tmp_path / "diff/metrics.json").read_text())
    print(f"\n{model} {fault} {target}: {m['verdict']}, drift origin {m['drift_origin']}\n  "
          f"{m['drift_origin_cause']['summary']}")
    assert m["verdict"] == "FAIL" and m["drift_origin"] == target
    assert m["drift_origin_cause"]["label"] == label and text in m["drift_origin_cause"]["summary"]
