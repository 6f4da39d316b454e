"""The torch work of one model in one process (issue 23): the export stage exports the model, then runs
the reference (fp32, fp64) and the fp32 baseline on the model it has built, with torch and the model's
libraries imported once (bert_base: ~5 s of imports and model build per process saved, twice).

The reference's files are staged under the export's folder (publish.STAGING) and the fp32 baseline's
under the reference's (publish.FOLD_DIR); reference@<model> and baseline@<model>-fp32 publish them into
their folders without importing torch (parity.pipeline.publish). Each file is written as the stage that
publishes it would write it (own.parquet's reference path is relative to the baseline's folder), so the
bytes are the same either way (tests/test_fold.py). Where no staging was made for it (an ONNX-file
model, a model whose output is too small: the reference stage then says so), a stage computes its
files itself. The fp32 baseline's per-layer and plain runs are the fp32 reference's run (same model,
inputs, dtype, recorder): they are read back from fp32.parquet (baseline_torch.replaying), not run again;
only its own-error passes run the model (issue 38, benchmarks/export_phases.py).

The export does this for a model whose fp64 reference stays decoded (publish.keep_mb: weight-heavy
models, the transformers): stacked on what the export leaves imported, a reference that streams (an
activation-heavy net, resnet50; a 1B decoder) would pass the memory bound (3 W + 1 GiB), and the
imports it saves are a small part of its time. Such a model's reference and fp32 baseline stages
compute their files themselves, each in its own process (the two stacked passed the bound too).

What it costs: the export depends on the reference's params and code, and the reference on the export
(an opset change re-runs the reference's computation inside the export; its bytes do not change, so
nothing after it re-runs). The fp32 baseline is made whatever dtypes are swept: the export cannot depend
on the dtype list without re-running on every sweep."""

from __future__ import annotations

import shutil
from pathlib import Path

from parity.backends.loader import gold_rows
from parity.config import schema
from parity.pipeline import reference
from parity.pipeline.baseline_torch import torch_baseline
from parity.pipeline.inputs import load
from parity.pipeline.publish import FOLD_CFG, FOLD_DIR, FOLD_DTYPE, STAGING, background_ok, keep_mb, stage_for


def reference_and_baseline(p: dict, model: str, net, inputs: Path, staging: Path, reference_for: Path,
                           baseline_for: Path | None, sized: dict) -> str:
    """The reference's files of `model` (fp32.parquet, fp64.parquet) under `staging`, made for the folder
    `reference_for`, and with `baseline_for` the fp32 baseline's under `staging`/FOLD_DIR, made for that
    folder; `net` is the model, built; `sized`: W and SA (parity.core.memory.guard). The summary lines.
    reference.TinyOutput as reference.write."""
    staging, reference_for = Path(staging), Path(reference_for)
    by = f"{'reference' if staging == reference_for else 'export'}@{model}"
    weight_bytes = sized.get("w_bytes")
    kept = {"mb": keep_mb(weight_bytes, sized.get("sa_bytes")), "background": background_ok(weight_bytes)} \
        if baseline_for is not None else None
    line = reference.write(p, model, load(inputs), staging, bool(schema.of(p).reference.fp64), net, kept)
    if baseline_for is not None:
        gold = staging / "fp64.parquet"
        if gold.exists():  # the values just written, still decoded: no re-read
            gold_rows(gold, weight_bytes=weight_bytes).prime(kept.get("groups"))
        # the fp32 values just written are the baseline's per-layer and plain runs' (baseline_torch.replaying),
        # unless capture.threads sets a thread count the reference did not run with
        replay = staging / "fp32.parquet" if not schema.of(p).capture.threads else None
        line += "\n" + torch_baseline(p, model, FOLD_DTYPE, FOLD_CFG, None, inputs, staging / FOLD_DIR, gold, net,
                                      base_dir=Path(baseline_for), base_path=reference_for / "fp64.parquet",
                                      background=kept["background"], replay=replay)
        stage_for(staging / FOLD_DIR, baseline_for, by)
    if staging != reference_for:
        stage_for(staging, reference_for, by)
    return line


def in_export(p: dict, model: str, net, inputs: Path, export_out: Path, reference_for: Path,
              baseline_for: Path | None, sized: dict) -> None:
    """The export stage's part: reference_and_baseline staged under `export_out`/STAGING. A model whose
    output is too small stages nothing: reference@model then computes it and says why it is unusable."""
    staging = Path(export_out) / STAGING
    try:
        print(reference_and_baseline(p, model, net, inputs, staging, reference_for, baseline_for, sized))
    except reference.TinyOutput:
        shutil.rmtree(staging, ignore_errors=True)

