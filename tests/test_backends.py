"""Conformance: every registered provider (conf/providers/*.yaml) goes through the same contract on
a tiny model: same layer names as the torch reference, values within the precision mode's tolerance,
and failures reported as statuses (UNSUPPORTED, UNAVAILABLE, EXPORT_FAIL, COMPILE_FAIL, INFER_FAIL),
never raised. A provider that cannot run here (no GPU, no TensorRT) must say so: UNAVAILABLE with a
reason, for every dtype it declares, without crashing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import ROOT
from parity import store
from parity.backends import STATUSES, CaptureJob, Runner, load_runner, run_capture
from parity.backends.base import CompileError
from parity.backends.base import Unavailable as UnavailableError

PROVIDERS = {p.stem: yaml.safe_load(p.read_text())[p.stem] for p in sorted((ROOT / "conf/providers").glob("*.yaml"))}
ARCH = {"source": "parity", "name": "mlp", "kwargs": {"in_features": 16, "hidden": 32, "out_features": 8}}
MODEL = {"arch": ARCH, "input": [{"name": "input", "shape": [4, 16]}], "tolerances": []}
DTYPES = {p.stem: yaml.safe_load(p.read_text())[p.stem] for p in sorted((ROOT / "conf/dtypes").glob("*.yaml"))}
FEEDS = [{"input": np.random.default_rng(k).standard_normal((4, 16)).astype(np.float32)} for k in range(2)]
CALIB = [{"input": np.random.default_rng(100 + k).standard_normal((4, 16)).astype(np.float32)} for k in range(4)]
# torch.compile takes ~10 s per compile on 2 cores: its full dtype sweep is in the slow set
SLOW_SWEEP = {"torch_compile"}


def _available(provider) -> str | None:
    cls = load_runner(PROVIDERS[provider]["runner"])
    return cls.availability(job(provider, PROVIDERS[provider]["dtypes"][0], ROOT))


def contract_dtype(provider) -> str:
    """fp32 where declared (compared at fp32 tolerance), else the provider's first precision mode."""
    return "fp32" if "fp32" in PROVIDERS[provider]["dtypes"] else PROVIDERS[provider]["dtypes"][0]


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
    store.write(d / "calibration.parquet", [store.Tensor(k, "input", 0, f["input"]) for k, f in enumerate(CALIB)])
    return d


@pytest.fixture(scope="module")
def reference():
    from stages.reference import run

    rows = run({"models": {"m": MODEL}, "seed": 0}, "m", FEEDS, "float32")
    return {(t.sample, t.name): t.array for t in rows}


def job(provider, dtype, model_dir, provider_cfg=None):
    return CaptureJob(model="m", model_cfg=MODEL, dtype=dtype, dtype_cfg=DTYPES[dtype], provider=provider,
                      provider_cfg=provider_cfg or PROVIDERS[provider], model_dir=model_dir,
                      calibration=model_dir / "calibration.parquet", engine_dir=model_dir / "engine")


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_every_provider_meets_the_runner_contract(provider, exported, reference):
    cls = load_runner(PROVIDERS[provider]["runner"])
    assert issubclass(cls, Runner)
    dtype = contract_dtype(provider)
    res = run_capture(cls, job(provider, dtype, exported), FEEDS, warmup=1, repeats=3)
    assert res.status in STATUSES
    if res.status == "UNAVAILABLE":  # not here (no GPU / TensorRT): a reason, never a crash
        assert res.reason and res.reason == _available(provider)
        pytest.skip(f"{provider} is unavailable here: {res.reason}")
    assert res.status == "OK", res.reason
    assert len(res.samples) == len(FEEDS) and len(res.latency_ms) == 3 and res.warmup == 1
    tol = DTYPES[dtype]["tol"] if dtype != "fp32" else {"atol": 1e-5, "rtol": 1.3e-6}
    for k, named in enumerate(res.samples):
        names = [n for n, _ in named]
        # outputs first, then layers in execution order, then the plain (shipped) graph's outputs
        assert names == ["output", "fc1", "act", "fc2", "plain:output"]
        for n, v in named:
            assert v.dtype == np.float32
            if dtype == "fp32":
                np.testing.assert_allclose(v, reference[(k, n.removeprefix("plain:"))], **tol)
            else:  # int8: same names and shapes, finite, and in the right ballpark (the diff judges it)
                r = reference[(k, n.removeprefix("plain:"))]
                assert v.shape == r.shape and np.isfinite(v).all()
                assert np.linalg.norm(v - r) / np.linalg.norm(r) < 0.2, n


def _sweep(provider):
    return pytest.param(provider, marks=pytest.mark.slow) if provider in SLOW_SWEEP else provider


@pytest.mark.parametrize("provider", [_sweep(p) for p in sorted(PROVIDERS)])
def test_every_declared_dtype_runs_and_others_are_unsupported(provider, exported):
    cls = load_runner(PROVIDERS[provider]["runner"])
    why = _available(provider)
    for dtype in DTYPES:
        res = run_capture(cls, job(provider, dtype, exported), FEEDS[:1], warmup=0, repeats=1)
        if dtype not in PROVIDERS[provider]["dtypes"]:
            assert res.status == "UNSUPPORTED" and provider in res.reason and dtype in res.reason
        elif why:
            assert res.status == "UNAVAILABLE" and res.reason == why, (dtype, res.reason)
        else:
            assert res.status == "OK", (dtype, res.reason)
            assert all(np.isfinite(v).all() for _, v in res.samples[0])


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_unavailable_providers_say_why_for_every_declared_dtype(provider, exported):
    """On a machine without the hardware or library, every cell of the provider is UNAVAILABLE with
    the same, specific reason (what is missing), never an exception or an empty reason."""
    why = _available(provider)
    if why is None:
        pytest.skip(f"{provider} runs here")
    assert len(why) > 10 and any(w in why for w in ("CUDA", "TensorRT", "GPU", "Provider", "driver", "torch"))
    cls = load_runner(PROVIDERS[provider]["runner"])
    for dtype in PROVIDERS[provider]["dtypes"]:
        res = run_capture(cls, job(provider, dtype, exported), FEEDS[:1], warmup=0, repeats=1)
        assert (res.status, res.reason) == ("UNAVAILABLE", why)


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


class BrokenCompile(Runner):
    def infer(self, feeds):
        try:
            raise NotImplementedError("no lowering for aten.foo")
        except NotImplementedError as e:
            raise CompileError("compiling the per-layer graph failed") from e


class FellBack(Runner):
    def activate(self):
        raise UnavailableError("the session fell back to CPU")


@pytest.mark.parametrize("cls, status, reason", [
    (Unavailable, "UNAVAILABLE", "no such device here"),
    (BrokenBuild, "EXPORT_FAIL", "RuntimeError: engine build failed"),
    (BrokenInfer, "INFER_FAIL", "ValueError: kernel not implemented"),
    (BrokenCompile, "COMPILE_FAIL", "per-layer graph failed: NotImplementedError: no lowering for aten.foo"),
    (FellBack, "UNAVAILABLE", "the session fell back to CPU"),
])
def test_failures_are_statuses_with_reasons(cls, status, reason, tmp_path):
    res = run_capture(cls, job("torch_cpu", "fp32", tmp_path), FEEDS, warmup=0, repeats=1)
    assert res.status == status and reason in res.reason


def test_a_bad_runner_path_names_the_problem():
    with pytest.raises(ValueError, match="cannot be imported"):
        load_runner("parity.backends.nope:Runner")
    with pytest.raises(ValueError, match="not a parity.backends.base.Runner"):
        load_runner("parity.backends.base:CaptureJob")
    with pytest.raises(ValueError, match="not a parity backend .* declares no `import:`"):
        load_runner("parity.store:Tensor")  # outside the registry, undeclared: refused before importing


def test_a_real_torch_compile_failure_is_compile_fail_not_a_crash(exported):
    """Behaviour inconsistency: eager runs this model; a compiler that raises gives COMPILE_FAIL
    with the compiler's own exception (here Dynamo rejecting an unknown backend)."""
    cfg = {**PROVIDERS["torch_compile"], "options": {**PROVIDERS["torch_compile"]["options"], "backend": "no_such_backend"}}
    res = run_capture(load_runner(cfg["runner"]), job("torch_compile", "fp32", exported, cfg), FEEDS[:1], 0, 1)
    assert res.status == "COMPILE_FAIL", res.reason
    assert "no_such_backend" in res.reason and "torch.compile(" in res.reason


def test_autocast_mode_runs_on_cpu_through_the_torch_runner(exported, reference):
    """The autocast (AMP) path torch_cuda uses, exercised on CPU (bf16 autocast): fp32 weights,
    bf16 matmuls, results within bf16 tolerance and not bit-identical to fp32."""
    cfg = {**PROVIDERS["torch_cpu"], "dtypes": ["amp_bf16"]}
    res = run_capture(load_runner(cfg["runner"]), job("torch_cpu", "amp_bf16", exported, cfg), FEEDS, 0, 1)
    assert res.status == "OK", res.reason
    out = dict(res.samples[0])["output"]
    assert out.dtype == np.float32 and not np.array_equal(out, reference[(0, "output")])
    np.testing.assert_allclose(out, reference[(0, "output")], rtol=5e-2, atol=5e-2)


def test_tf32_mode_needs_cuda(exported):
    cfg = {**PROVIDERS["torch_cpu"], "dtypes": ["tf32"]}
    res = run_capture(load_runner(cfg["runner"]), job("torch_cpu", "tf32", exported, cfg), FEEDS[:1], 0, 1)
    assert res.status == "EXPORT_FAIL" and "tf32 needs a CUDA device" in res.reason


def test_int8_keeps_layer_names_and_float32_outputs(exported):
    """The quantizer may put Q/DQ around graph outputs: every layer output must still exist under
    its name, as float32, in both int8 modes."""
    import onnx

    for dtype in ("int8_dynamic", "int8_static"):
        r = load_runner(PROVIDERS["ort_int8"]["runner"])(job("ort_int8", dtype, exported))
        r.activate()
        assert [o.name for o in r.layers.get_outputs()] == ["output", "fc1", "act", "fc2"]
        assert {o.type for o in r.layers.get_outputs()} == {"tensor(float)"}
        ops = {n.op_type for n in onnx.load_from_string(r._convert(exported / "layers.onnx")).graph.node}
        assert ({"DynamicQuantizeLinear", "MatMulInteger"} if dtype == "int8_dynamic"
                else {"QuantizeLinear", "DequantizeLinear"}) <= ops, ops
        r.deactivate()


def test_int8_static_without_calibration_samples_is_a_clear_export_fail(exported, tmp_path):
    j = job("ort_int8", "int8_static", exported)
    j.calibration = tmp_path / "missing.parquet"
    res = run_capture(load_runner(PROVIDERS["ort_int8"]["runner"]), j, FEEDS[:1], 0, 1)
    assert res.status == "EXPORT_FAIL" and "inputs.calibration" in res.reason
