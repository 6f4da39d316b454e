"""Hydra resolvers that split the selected providers by how their cells are produced, for dvc.yaml's
matrices (conf/config.yaml):

  capture_providers: ${parity_providers:capture}   # captured directly (capture@cell)
  engine_providers: ${parity_providers:engine}     # `engine: true`: engine@cell builds, capture_engine@cell runs

  torch_models: ${parity_models:torch}             # built in torch: reference@model
  onnx_models: ${parity_models:onnx}               # ONNX files: reference_onnx@model

  plan_dtypes: ${parity_plan:dtypes}               # analysis.plan: true -> the reduced-precision dtypes
  reduce_dtypes: ${parity_plan:reduce}             # analysis.reduce: true -> every selected dtype

An empty list gives an empty DVC matrix, so no engine stage exists unless e.g. trt is selected, and
no plan stage unless analysis.plan is true (parity.config.params.plan_dtypes).
The split itself is parity.config.params.capture_providers / engine_providers. Hydra imports every module
under hydra_plugins when it composes (dvc exp run, parity compose, tests), which registers these.
"""

from omegaconf import OmegaConf


def _providers(kind: str, *, _root_) -> list:
    from parity.config import params as config

    # no provider selected (providers=[]): an empty split; ${parity_validate:} then says what is wrong
    p = {"providers": OmegaConf.to_container(_root_.providers, resolve=True) if "providers" in _root_ else {}}
    split = {"engine": config.engine_providers, "capture": config.capture_providers}
    if kind not in split:
        raise ValueError(f"parity_providers: unknown kind '{kind}' (valid: capture, engine)")
    # a ListConfig, not a list: OmegaConf.resolve (what DVC's compose_and_dump calls) can put a
    # container in place of the interpolation, but not a plain list into a value node
    return OmegaConf.create(split[kind](p))


def _models(kind: str, *, _root_) -> list:
    from parity.config import params as config

    split = {"torch": config.torch_models, "onnx": config.onnx_models}
    if kind not in split:
        raise ValueError(f"parity_models: unknown kind '{kind}' (valid: torch, onnx)")
    p = {"models": OmegaConf.to_container(_root_.models, resolve=True) if "models" in _root_ else {}}
    return OmegaConf.create(split[kind](p))


def _plan(kind: str, *, _root_) -> list:
    from parity.config import params as config

    if kind not in ("dtypes", "reduce"):
        raise ValueError(f"parity_plan: unknown kind '{kind}' (valid: dtypes, reduce)")
    p = {k: OmegaConf.to_container(_root_[k], resolve=True) if k in _root_ else None
         for k in ("dtypes", "analysis")}
    return OmegaConf.create(config.plan_dtypes(p) if kind == "dtypes" else config.reduce_dtypes(p))


if not OmegaConf.has_resolver("parity_models"):
    OmegaConf.register_new_resolver("parity_models", _models)
if not OmegaConf.has_resolver("parity_plan"):
    OmegaConf.register_new_resolver("parity_plan", _plan)
if not OmegaConf.has_resolver("parity_providers"):
    OmegaConf.register_new_resolver("parity_providers", _providers)
