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
from parity.core import store
from parity.backends import STATUSES, CaptureJob, Runner, load_runner, run_capture
from parity.backends.runner import CompileError
from parity.backends.runner import Unavailable as UnavailableError

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

    from parity.pipeline.layer_export import export_layers, prune_outputs
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
    from parity.pipeline.reference import run

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
        pytest.skip(f"not applicable: {provider} is available on this machine, so there is no UNAVAILABLE reason to check")
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
    with pytest.raises(ValueError, match="not a parity.backends.runner.Runner"):
        load_runner("parity.backends.runner:CaptureJob")
    with pytest.raises(ValueError, match="not a parity backend .* declares no `import:`"):
        load_runner("parity.core.store:Tensor")  # outside the registry, undeclared: refused before importing


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
        r.infer(FEEDS[0])  # opens the per-layer session (the runner holds one session at a time)
        assert [o.name for o in r.layers.get_outputs()] == ["output", "fc1", "act", "fc2"]
        assert {o.type for o in r.layers.get_outputs()} == {"tensor(float)"}
        ops = {n.op_type for n in onnx.load_from_string(r._convert(exported / "layers.onnx")[0]).graph.node}
        assert ({"DynamicQuantizeLinear", "MatMulInteger"} if dtype == "int8_dynamic"
                else {"QuantizeLinear", "DequantizeLinear"}) <= ops, ops
        r.deactivate()


def test_int8_static_without_calibration_samples_is_a_clear_export_fail(exported, tmp_path):
    j = job("ort_int8", "int8_static", exported)
    j.calibration = tmp_path / "missing.parquet"
    res = run_capture(load_runner(PROVIDERS["ort_int8"]["runner"]), j, FEEDS[:1], 0, 1)
    assert res.status == "EXPORT_FAIL" and "inputs.calibration" in res.reason


CPUINFO_AVX2 = ROOT / "tests/data/cpuinfo-avx2.txt"          # Xeon E5-2680 v4: AVX2, no VNNI
CPUINFO_VNNI = ROOT / "tests/data/cpuinfo-avx512-vnni.txt"   # EPYC: AVX-512 + VNNI


def _int8_weights(runner, path) -> int:
    """The largest |value| of the int8 weight initializers the runner's quantizer wrote."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load_from_string(runner._convert(path)[0])
    return max(int(np.abs(numpy_helper.to_array(t).astype(np.int16)).max()) for t in m.graph.initializer
               if t.data_type == onnx.TensorProto.INT8 and len(t.dims) == 2)


def _host_has_vnni() -> bool:
    """This machine's CPU (not the recorded cpuinfo the test feeds the fingerprint) has VNNI."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


@pytest.mark.parametrize("cpuinfo, reduce_range, max_weight", [(CPUINFO_AVX2, True, 64), (CPUINFO_VNNI, False, 127)])
def test_int8_reduce_range_auto_follows_the_cpu_and_meets_the_contract_bound(
        cpuinfo, reduce_range, max_weight, exported, reference, monkeypatch):
    """`reduce_range: auto` (conf default) resolves from the CPU the fingerprint reads (here a recorded
    /proc/cpuinfo): 7-bit weights on the AVX2-only CPU, full 8-bit on the VNNI one; the quantizer gets
    the resolved value. The int8 contract bound holds either way on this machine; with 7-bit weights
    the u8 x s8 pair sums cannot saturate (2 x 255 x 63 < 2^15), so the AVX2 kernels compute the same
    integers as here: the bound the contract test checks holds on a CPU without VNNI too (measured
    under an emulated AVX2-only CPU: bit-identical outputs; docs/providers.md)."""
    monkeypatch.setenv("PARITY_CPUINFO", str(cpuinfo))
    assert PROVIDERS["ort_int8"]["options"]["reduce_range"] == "auto"
    cls = load_runner(PROVIDERS["ort_int8"]["runner"])
    j = job("ort_int8", "int8_dynamic", exported)
    s = cls.settings(j)
    assert s["reduce_range"] is reduce_range and s["cpu_vnni"] is (not reduce_range)
    assert s["reduce_range_from"].startswith("auto <providers.ort_int8.options.reduce_range=auto>: CPU with")
    assert s["u8s8"] is True and s["saturation_risk"] is False
    r = cls(j)
    r._prepare()
    assert _int8_weights(r, exported / "layers.onnx") == max_weight
    if not reduce_range and not _host_has_vnni():
        pytest.skip("not applicable: full 8-bit weights meet the contract bound only on a CPU with VNNI; this "
                    "machine has none (its AVX2 u8 x s8 kernels saturate: fc1 rel_l2 > 0.2), which is why "
                    "`reduce_range: auto` picks 7 bits here")
    res = run_capture(cls, j, FEEDS, 0, 1)
    assert res.status == "OK", res.reason
    for k, named in enumerate(res.samples):
        for n, v in named:
            ref = reference[(k, n.removeprefix("plain:"))]
            assert np.linalg.norm(v - ref) / np.linalg.norm(ref) < 0.2, n


def test_int8_settings_forced_and_saturation_risk(monkeypatch):
    """A forced reduce_range wins over auto and names its key; saturation risk is u8 x s8 (dynamic, or
    static with u8 activations) with full-range s8 weights on a CPU without VNNI, and nothing else."""
    from parity.backends.ort_int8 import OrtInt8Runner

    def settings(cpuinfo, dtype, **opts):
        monkeypatch.setenv("PARITY_CPUINFO", str(cpuinfo))
        cfg = {**PROVIDERS["ort_int8"], "options": {**PROVIDERS["ort_int8"]["options"], **opts}}
        return OrtInt8Runner.settings(job("ort_int8", dtype, ROOT, cfg))

    forced = settings(CPUINFO_AVX2, "int8_dynamic", reduce_range=False)
    assert forced["reduce_range"] is False and forced["saturation_risk"] is True
    assert forced["reduce_range_from"] == "set <providers.ort_int8.options.reduce_range=false>"
    assert forced["cpu_vnni"] is False and forced["cpu_int8_flags"] == ["avx2", "sse4_1"]
    assert settings(CPUINFO_VNNI, "int8_dynamic", reduce_range=False)["saturation_risk"] is False
    assert settings(CPUINFO_VNNI, "int8_dynamic", reduce_range=True)["reduce_range"] is True
    assert settings(CPUINFO_AVX2, "int8_static", reduce_range=False)["saturation_risk"] is False  # s8 x s8
    assert settings(CPUINFO_AVX2, "int8_static", reduce_range=False, activation_type="QUInt8")["saturation_risk"]
    assert not settings(CPUINFO_AVX2, "int8_dynamic", reduce_range=False, weight_type="QUInt8")["saturation_risk"]
    assert settings(CPUINFO_AVX2, "fp32") == {}  # not an int8 mode: nothing resolved
