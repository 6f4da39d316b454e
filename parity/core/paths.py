"""Artifact path conventions, written once: dvc.yaml passes the same paths to the stages as arguments
(its `cmd:` lines and outs follow these), and the tools that read artifacts after a run (history,
compare, show, parallel's scheduling estimates, the Hydra plugin's report deps) take them from here.
Relative to the repository root (DVC's paths are)."""

from __future__ import annotations

ARTIFACTS = "artifacts"
CELL_METRICS = "metrics.json"  # a cell's verdict file, under diff_dir(cell)
CELL_LAYERS = "layers.json"    # its per-layer diff, beside it


def diff_dir(cell: str) -> str:
    return f"{ARTIFACTS}/diff/{cell}"


def cell_metrics(cell: str) -> str:
    return f"{diff_dir(cell)}/{CELL_METRICS}"


def cell_layers(cell: str) -> str:
    return f"{diff_dir(cell)}/{CELL_LAYERS}"


def timing(cell: str) -> str:
    return f"{ARTIFACTS}/timing/{cell}.json"


def model_dir(model: str) -> str:
    return f"{ARTIFACTS}/models/{model}"


SUITES_COVERAGE = f"{ARTIFACTS}/suites/coverage"
PLAN = f"{ARTIFACTS}/plan"
REDUCE = f"{ARTIFACTS}/reduce"  # reduce@cell folders (analysis.reduce)
FUZZ = f"{ARTIFACTS}/fuzz"              # fuzz@suite-dtype-provider: FUZZ/<suite>/<dtype>-<provider>/
TRAIN_STEP = f"{ARTIFACTS}/train_step"  # train_step@model-dtype: TRAIN_STEP/<model>/<dtype>.json
GENERATE = f"{ARTIFACTS}/generate"      # generate@model-dtype-provider: GENERATE/<cell>/
GENERATE_EXPORT = f"{ARTIFACTS}/generate_export"  # generate_export@model: GENERATE_EXPORT/<model>/decoder.onnx
REPORT = f"{ARTIFACTS}/report"
