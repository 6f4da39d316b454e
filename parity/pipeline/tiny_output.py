"""The one rule that refuses a reference whose model output is ~0, for every model source: a torch
model (parity.pipeline.reference) and an ONNX file (parity.pipeline.onnx_reference) alike. numpy-free,
torch-free: the ONNX-file path imports it without torch.

An output within atol of zero passes any diff, even against an all-zero actual: the default atols are
1e-4 (fp32) and 1e-5 (fp16/bf16), so demand values well above them (MIN_OUTPUT_ABS)."""

from __future__ import annotations

MIN_OUTPUT_ABS = 1e-3


class TinyOutput(Exception):
    """The model output is too small to prove anything (tiny_outputs): nothing is published."""


def tiny_outputs(peak: dict) -> dict:
    """Model outputs whose max |value| is <= MIN_OUTPUT_ABS (NaN counts as tiny: it proves nothing
    either). `peak`: {output name: max |value| over the samples}."""
    return {n: v for n, v in peak.items() if not v > MIN_OUTPUT_ABS}


def refusal(model: str, tiny: dict, fix: str) -> TinyOutput:
    """The TinyOutput of `model` whose outputs `tiny` are ~0; `fix` says how to give it a real output."""
    return TinyOutput(f"reference@{model}: model output max |value| {tiny} <= {MIN_OUTPUT_ABS:g}: a diff "
                      f"against it proves nothing (any actual within atol of zero passes). {fix}")
