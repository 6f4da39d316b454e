"""Config and wiring of the providers and precision modes of issue 3: every option composes and
validates, new keys are checked with clear messages, and the DVC matrix gets engine stages only
when an engine provider (trt) is selected."""

from __future__ import annotations

import json

import pytest

from conftest import CONF, composed, config_error, make_repo, options
from parity.config import params as config


def test_every_provider_and_precision_mode_composes_and_validates():
    p = composed(*(f"{g}=[{','.join(options(g))}]" for g in ("models", "dtypes", "providers")))
    assert config.validate(p) is p
    assert {"torch_compile", "torch_cuda", "ort_cpu_noopt", "ort_int8", "ort_cuda", "ort_trt", "trt"} <= set(p["providers"])
    assert {"tf32", "amp_fp16", "amp_bf16", "int8_dynamic", "int8_static", "fp8_e4m3"} <= set(p["dtypes"])
    assert p["engine_providers"] == ["trt"]
    assert p["capture_providers"] == [n for n in p["providers"] if n != "trt"]
    for name, prov in p["providers"].items():  # every declared mode exists, every `uses:` is fingerprinted
        assert set(prov["dtypes"]) <= set(options("dtypes")), name
        assert set(prov["uses"]) <= set(config.COMPONENTS), name


def test_default_selection_has_no_engine_provider():
    p = composed()
    assert p["capture_providers"] == ["torch_cpu", "ort_cpu"] and p["engine_providers"] == []
    assert {d["mode"] for d in p["dtypes"].values()} == {"cast"}
    assert p["inputs"]["calibration"] >= 1


def test_every_dtype_file_states_its_mode():
    """dvc.yaml's capture stage reads dtypes.<d>.mode as a param: DVC fails on a missing one."""
    import yaml

    for f in sorted((CONF / "dtypes").glob("*.yaml")):
        assert "mode" in yaml.safe_load(f.read_text())[f.stem], f.name


def test_int8_tolerances_are_explicit_in_conf():
    p = composed("dtypes=[int8_dynamic,int8_static]")
    for d in ("int8_dynamic", "int8_static"):
        assert p["dtypes"][d]["tol"] == {"atol": 5e-2, "rtol": 5e-2}
        assert p["dtypes"][d]["torch"] == "float32"  # fp32 graph I/O


def test_strict_rejects_an_unsupported_pair_at_compose_with_a_clear_message():
    with pytest.raises(Exception) as e:
        composed("providers=[torch_cpu,ort_int8]", "dtypes=[fp32,int8_static]", "strict=true")
    msg = str(e.value)
    for s in ("providers.torch_cpu does not support dtype 'int8_static'", "strict: true",
              "UNSUPPORTED", "conf/providers/torch_cpu.yaml", "fp16, fp32"):
        assert s in msg, (s, msg)


@pytest.fixture(scope="module")
def default():
    return composed()


AMP = {"torch": "float32", "mode": "autocast", "tol": {"atol": 1e-5, "rtol": 1e-3}, "oracle": {"k": 4.0}}


@pytest.mark.parametrize("mutate, expected", [
    (lambda p: p["dtypes"]["fp16"].update(mode="mixed"), ["dtypes.fp16.mode", "mixed", "autocast", "int8_static"]),
    (lambda p: p["dtypes"].update(amp=AMP), ["dtypes.amp", "autocast", "float16 or bfloat16", "float32"]),
    (lambda p: p["dtypes"]["fp32"].update(mode="int8_static", torch="float16"), ["int8_static", "float32"]),
    (lambda p: p["providers"]["ort_cpu"].update(engine="yes"), ["providers.ort_cpu.engine", "true or false"]),
    (lambda p: p["inputs"].update(calibration=-1), ["inputs.calibration", ">= 0"]),
    (lambda p: p.update(engine_providers=["trt"]), ["engine_providers", "parity compose"]),
    (lambda p: p.update(capture_providers=["torch_cpu"]), ["capture_providers", "ort_cpu"]),
])
def test_bad_new_keys_name_the_key_and_the_choices(default, mutate, expected):
    msg = config_error(default, mutate)
    for s in expected:
        assert s in msg, (s, msg)


def _stages(repo) -> list[str]:
    return [line.split()[0] for line in repo.run(["dvc", "stage", "list"]).stdout.splitlines()]


def test_engine_stages_exist_only_when_an_engine_provider_is_selected(tmp_path):
    """An empty matrix axis gives no stage at all (DVC 3.67): without trt there is no engine stage;
    with it, engine@ and capture_engine@ replace capture@ for trt cells only."""
    r = make_repo(tmp_path / "repo", dtypes=("fp32", "fp16"), providers=("ort_cpu",))
    assert not [s for s in _stages(r) if s.startswith(("engine@", "capture_engine@"))]
    r.set_defaults(providers=["ort_cpu", "trt"])
    r.run(["parity", "compose"])
    stages = _stages(r)
    assert [s for s in stages if s.startswith("engine@")] == ["engine@tiny_mlp-fp32-trt", "engine@tiny_mlp-fp16-trt"]
    assert [s for s in stages if s.startswith("capture_engine@")] == [
        "capture_engine@tiny_mlp-fp32-trt", "capture_engine@tiny_mlp-fp16-trt"]
    assert not [s for s in stages if s.startswith("capture@") and s.endswith("-trt")]
    assert "diff@tiny_mlp-fp16-trt" in stages
    # the trt capture depends on its engine, and the engine on the TensorRT/CUDA fingerprint
    dag = r.run(["dvc", "dag", "--dot", "diff@tiny_mlp-fp16-trt"]).stdout
    assert '"engine@tiny_mlp-fp16-trt" -> "capture_engine@tiny_mlp-fp16-trt"' in dag
    fp = json.loads(r.run(["python", "-c", "import json,sys; from parity.backends import fingerprint; "
                                          "print(json.dumps(sorted(fingerprint.collect(['cuda','tensorrt']))))"]).stdout)
    assert fp == ["cuda", "tensorrt"]
