"""Config: the real conf/ composes (every option of every group), the committed params.yaml is the
composition of conf/, and bad values name the key and the valid choices."""

from __future__ import annotations

import copy
import importlib
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, composed, config_error, options
from parity.config import params as config, schema


@pytest.fixture(scope="module")
def default() -> dict:
    return composed()


GROUPS = ("models", "dtypes", "providers", "suites")


def test_every_option_of_every_group_composes_and_validates():
    p = composed(*(f"{g}=[{','.join(options(g))}]" for g in GROUPS))
    for g in GROUPS:
        assert sorted(p[g]) == options(g), g
    assert len(p["models"]) >= 7 and {"fp32", "fp16", "bf16"} <= set(p["dtypes"])  # every conf/models file
    assert config.validate(p) is p
    n = [len(p[g]) for g in ("models", "dtypes", "providers")]
    assert p["validated"] == f"{n[0]} models x {n[1]} dtypes x {n[2]} providers = {n[0] * n[1] * n[2]} cells"
    assert p["report"]["coverage_dep"] == "artifacts/suites/coverage"


def test_committed_params_yaml_is_the_composition_of_conf(default):
    committed = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert committed == default, "params.yaml is stale: run `parity compose` and commit it"


def test_report_depends_on_conf_suites_when_no_suite_is_selected(default):
    assert default["suites"] == {} and default["report"]["coverage_dep"] == "conf/suites"


def test_cpu_default_is_small(default):
    assert list(default["models"]) == ["mlp", "resnet18"]
    assert list(default["dtypes"]) == ["fp32", "fp16"]
    assert list(default["providers"]) == ["torch_cpu", "ort_cpu"]


def test_default_tolerances_start_from_torch_testing(default):
    # torch.testing.assert_close: float16 (1e-3, 1e-5), bfloat16 (1.6e-2, 1e-5); fp32 rtol 1.3e-6
    # (atol raised to 1e-4 for whole models: see conf/dtypes/fp32.yaml)
    p = composed("dtypes=[fp32,fp16,bf16]")
    assert p["dtypes"]["fp16"]["tol"] == {"atol": 1e-5, "rtol": 1e-3}
    assert p["dtypes"]["bf16"]["tol"] == {"atol": 1e-5, "rtol": 1.6e-2}
    assert p["dtypes"]["fp32"]["tol"]["rtol"] == 1.3e-6


def test_sweep_override_of_a_multiselect_group_gives_one_option():
    assert list(composed("dtypes=bf16")["dtypes"]) == ["bf16"]
    assert list(composed("+models=resnet50")["models"]) == ["mlp", "resnet18", "resnet50"]


def test_parity_zoo_matches_builders():
    from parity.models import zoo

    assert set(config.parity_zoo()) == set(zoo.BUILDERS)


def test_tolerance_resolution_order(default):
    p = copy.deepcopy(default)
    p["models"]["resnet18"]["tolerances"] = [
        {"dtype": "fp16", "atol": 1e-3, "rtol": 1e-3},
        {"dtype": "fp16", "layer": "layer4.*", "atol": 5e-3, "rtol": 2e-3},
    ]
    config.validate(p)
    fp32, fp16 = (schema.rule(p, "resnet18", d, ["conv1", "layer4.0.conv1"]).tolerances for d in ("fp32", "fp16"))
    assert fp32["layer4.0.conv1"] == (1e-4, 1.3e-6, "dtypes.fp32.tol")
    assert fp16["conv1"] == (1e-3, 1e-3, "models.resnet18.tolerances[0]")
    assert fp16["layer4.0.conv1"] == (5e-3, 2e-3, "models.resnet18.tolerances[1]")


@pytest.mark.parametrize("mutate, expected", [
    (lambda p: p.update(bogus=1), ["unknown key 'bogus'", "models", "providers"]),
    (lambda p: p["export"].update(exporter="torchscript"), ["export.exporter", "torchscript", "dynamo, legacy"]),
    (lambda p: p["export"].update(opset=17), ["export.opset", "[18, 25]"]),
    (lambda p: p["models"]["mlp"]["arch"].update(name="mlpp"), ["models.mlp.arch.name", "mlpp", "transformer_block"]),
    (lambda p: p["models"]["mlp"]["arch"].update(source="hub"), ["models.mlp.arch.source", "torchvision"]),
    (lambda p: p["models"]["mlp"].update(tolerances=[{"atol": 1e-3}]), ["tolerances[0]", "atol and rtol together"]),
    (lambda p: p["models"]["mlp"].update(tolerances=[{"layr": "fc*", "atol": 1, "rtol": 1}]), ["unknown key 'layr'", "layer"]),
    (lambda p: p["models"]["mlp"]["input"][0].update(init="gauss"), ["init", "gauss", "normal"]),
    (lambda p: p["models"]["mlp"]["input"][0].update(shape=[8, -1]), ["shape"]),
    (lambda p: p["dtypes"]["fp16"].update(torch="half"), ["dtypes.fp16.torch", "half", "bfloat16"]),
    (lambda p: p["providers"]["ort_cpu"].update(uses=["onnxruntime", "rocm"]), ["rocm", "tensorrt"]),
    (lambda p: p.update(models={}), ["models", "select at least one"]),
    (lambda p: p.update(strict=True, dtypes={**p["dtypes"], "bf16": {"torch": "bfloat16", "tol": {"atol": 1e-5, "rtol": 1.6e-2}, "oracle": {"k": 4.0}}}),
     ["providers.ort_cpu", "bf16", "strict"]),
])
def test_bad_values_name_the_key_and_the_choices(default, mutate, expected):
    msg = config_error(default, mutate)
    for s in expected:
        assert s in msg, (s, msg)


@pytest.mark.parametrize("mutate, expected", [
    (lambda p: p["providers"]["ort_cpu"]["options"].update(graph_optimization_level="bogus"),
     ["providers.ort_cpu.options.graph_optimization_level", "'bogus'", "disabled, basic, extended, all"]),
    (lambda p: p["providers"]["ort_cpu"]["options"].update(graph_optimisation_level="all"),
     ["providers.ort_cpu.options", "unknown option 'graph_optimisation_level'", "graph_optimization_level"]),
    (lambda p: p["providers"]["torch_cpu"]["options"].update(device="cuda"), ["providers.torch_cpu.options.device", "cpu"]),
    (lambda p: p["providers"].update(torch_compile=composed("providers=[torch_compile]")["providers"]["torch_compile"])
     or p["providers"]["torch_compile"]["options"].update(mode="fastest"),
     ["providers.torch_compile.options.mode", "'fastest'", "max-autotune"]),
    (lambda p: p["providers"].update(torch_compile=composed("providers=[torch_compile]")["providers"]["torch_compile"])
     or p["providers"]["torch_compile"]["options"].update(fullgraph="yes"),
     ["providers.torch_compile.options.fullgraph", "true or false"]),
    (lambda p: p["providers"].update(ort_int8=composed("providers=[ort_int8]")["providers"]["ort_int8"])
     or p["providers"]["ort_int8"]["options"].update(weight_type="QInt3"),
     ["providers.ort_int8.options.weight_type", "QInt8, QUInt8"]),
    (lambda p: p.update(strict="maybe"), ["strict", "true or false", "'maybe'"]),
    (lambda p: p["reference"].update(fp64="no"), ["reference.fp64", "true or false"]),
    (lambda p: p.update(providers={}), ["providers", "no option selected"]),
    (lambda p: p.update(dtypes={}), ["dtypes", "no option selected"]),
    (lambda p: p.pop("models"), ["models", "no option selected"]),
    (lambda p: p["models"].update({"a/b": p["models"]["mlp"]}), ["models.a/b", "[A-Za-z0-9_]"]),
    (lambda p: p["models"].update({"..": p["models"]["mlp"]}), ["models...", "letters, digits and '_'"]),
    (lambda p: p["models"].update({"my model": p["models"]["mlp"]}), ["models.my model", "[A-Za-z0-9_]"]),
    (lambda p: p["models"].update({"my-model": p["models"]["mlp"]}), ["models.my-model", "[A-Za-z0-9_]"]),
    (lambda p: p["dtypes"].update({"fp/16": p["dtypes"]["fp16"]}), ["dtypes.fp/16", "[A-Za-z0-9_]"]),
    (lambda p: p["providers"].update({"ort cpu": p["providers"]["ort_cpu"]}), ["providers.ort cpu", "[A-Za-z0-9_]"]),
])
def test_bad_values_refused_at_compose(default, mutate, expected):
    """What `parity compose` / `dvc exp run` refuse (tests/test_bad_config.py runs them end to end)."""
    msg = config_error(default, mutate)
    assert "\n" not in msg, msg
    for s in expected:
        assert s in msg, (s, msg)


def test_every_provider_of_conf_passes_its_option_schema():
    p = composed("providers=[" + ",".join(options("providers")) + "]")
    for name, prov in p["providers"].items():  # each declares one, and compose reads what Python sees
        mod, _, cls = prov["runner"].partition(":")
        schema = config.runner_options(prov)
        assert schema, name
        assert schema == getattr(importlib.import_module(mod), cls).options_schema, name
        assert all(isinstance(r, tuple) or r in config.OPTION_RULES for r in schema.values()), name
    config.validate(p)


def test_missing_params_file_says_how_to_make_it(tmp_path):
    with pytest.raises(config.ConfigError, match="parity compose"):
        config.load(Path(tmp_path) / "params.yaml")
