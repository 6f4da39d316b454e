"""Conformance: every registered provider (conf/providers/*.yaml) goes through the same contract on
a tiny model: same layer names as the torch reference, values within fp32 tolerance, and failures
reported as statuses (UNSUPPORTED, UNAVAILABLE, EXPORT_FAIL, INFER_FAIL), never raised."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import ROOT
from parity.backends import CaptureJob, Runner, load_runner, run_capture

PROVIDERS = {p.stem: yaml.safe_load(p.read_text())[p.stem] for p in sorted((ROOT / "conf/providers").glob("*.yaml"))}
ARCH = {"source": "parity", "name": "mlp", "kwargs": {"in_features": 16, "hidden": 32, "out_features": 8}}
MODEL = {"arch": ARCH, "input": [{"name": "input", "shape": [4, 16]}], "tolerances": []}
DTYPES = {"fp32": {"torch": "float32"}, "fp16": {"torch": "float16"}, "bf16": {"torch": "bfloat16"}}
FEEDS = [{"input": np.random.default_rng(k).standard_normal((4, 16)).astype(np.float32)} for k in range(2)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    import onnx

    from parity.export import export_layers, prune_outputs
    from parity.models import build

    import torch

    d = tmp_path_factory.mktemp("export")
    names = export_layers(build(ARCH, 0), (torch.from_numpy(FEEDS[0]["input"]),), ["input"],
                          d / "layers.onnx", "dynamo", 18)
    onnx.save(prune_outputs(onnx.load(str(d / "layers.onnx")), [n for n in names if n == "output"]),
              str(d / "model.onnx"))
    return d


@pytest.fixture(scope="module")
def reference():
    from stages.reference import run

    rows = run({"models": {"m": MODEL}, "seed": 0}, "m", FEEDS, "float32")
    return {(t.sample, t.name): t.array for t in rows}


def job(provider, dtype, model_dir):
    return CaptureJob(model="m", model_cfg=MODEL, dtype=dtype, dtype_cfg=DTYPES[dtype], provider=provider,
                      provider_cfg=PROVIDERS[provider], model_dir=model_dir)


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_every_provider_meets_the_runner_contract(provider, exported, reference):
    cls = load_runner(PROVIDERS[provider]["runner"])
    assert issubclass(cls, Runner)
    res = run_capture(cls, job(provider, "fp32", exported), FEEDS, warmup=1, repeats=3)
    assert res.status == "OK", res.reason
    assert len(res.samples) == len(FEEDS) and len(res.latency_ms) == 3
    for k, named in enumerate(res.samples):
        names = [n for n, _ in named]
        # outputs first, then layers in execution order, then the plain (shipped) graph's outputs
        assert names == ["output", "fc1", "act", "fc2", "plain:output"]
        for n, v in named:
            assert v.dtype == np.float32
            np.testing.assert_allclose(v, reference[(k, n.removeprefix("plain:"))], rtol=1.3e-6, atol=1e-5)


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_every_declared_dtype_runs_and_others_are_unsupported(provider, exported):
    cls = load_runner(PROVIDERS[provider]["runner"])
    for dtype in DTYPES:
        res = run_capture(cls, job(provider, dtype, exported), FEEDS[:1], warmup=0, repeats=1)
        if dtype in PROVIDERS[provider]["dtypes"]:
            assert res.status == "OK", (dtype, res.reason)
            assert all(np.isfinite(v).all() for _, v in res.samples[0])
        else:
            assert res.status == "UNSUPPORTED" and provider in res.reason and dtype in res.reason


class Unavailable(Runner):
    @classmethod
    def availability(cls, job):
        return "no such device here"


class BrokenBuild(Runner):
    def activate(self):
        raise RuntimeError("engine build failed")


class BrokenInfer(Runner):
    def infer(self, feeds):
        raise ValueError("kernel not implemented for this shape")


@pytest.mark.parametrize("cls, status, reason", [
    (Unavailable, "UNAVAILABLE", "no such device here"),
    (BrokenBuild, "EXPORT_FAIL", "RuntimeError: engine build failed"),
    (BrokenInfer, "INFER_FAIL", "ValueError: kernel not implemented"),
])
def test_failures_are_statuses_with_reasons(cls, status, reason, tmp_path):
    res = run_capture(cls, job("torch_cpu", "fp32", tmp_path), FEEDS, warmup=0, repeats=1)
    assert res.status == status and reason in res.reason


def test_a_bad_runner_path_names_the_problem():
    with pytest.raises(ValueError, match="cannot be imported"):
        load_runner("parity.backends.nope:Runner")
    with pytest.raises(ValueError, match="not a parity.backends.base.Runner"):
        load_runner("parity.store:Tensor")
