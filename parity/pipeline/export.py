"""The export of one model: torch -> ONNX with every leaf-module call as a named output, checked,
plus the plain graph (model outputs only), layers.json and the op inventory (ops.json). The steps
themselves live in parity.pipeline.layer_export; this is their order and what is written."""

from __future__ import annotations

import time
from pathlib import Path

from parity.config import inputspec, schema
from parity.core.io import write_json
from parity.models import build
from parity.pipeline.inputfiles import model_samples
from parity.pipeline.inputs import generate
from parity.pipeline.layer_export import ExportFailed, InputRefused, export_checked


class ExportError(Exception):
    """The model cannot be exported as configured (the message names the key)."""


def export_model(p: dict, model: str, out: Path, built: dict | None = None) -> str:
    """Write layers.onnx, model.onnx (both pointing at one weights.bin), layers.json and ops.json under
    `out` for a torch model (an ONNX file's export: parity.pipeline.onnx_export.export_file); the summary
    line. The config is read here, once: the model's inputs resolved into an InputPlan
    (parity.config.inputspec), the model built, the first sample of each input shape drawn, then
    parity.pipeline.layer_export checks and exports. `built`: gets the model the export built ("net"),
    as built (seeded, fp32, eval), for the reference's run in the same process (parity.pipeline.fold)."""
    m, c = p["models"][model], schema.of(p)
    exporter, opset = c.export.exporter, int(c.export.opset)
    plan = inputspec.plan(m, 1)  # the export runs one sample of each input shape
    t0 = time.perf_counter()
    try:
        net = build(m["arch"], c.seed)
    except ValueError as e:  # an unknown model name or config key (torchvision, hf): the message lists valid ones
        raise ExportError(f"models.{model}.arch: {e}") from None
    if built is not None:
        built["net"] = net
    firsts = model_samples(plan, c.seed, generate)
    try:
        layers = export_checked(net, firsts, plan, out, exporter, opset)
    except InputRefused as e:
        raise ExportError(f"models.{model}: {e.why} (parity compares the tensors a model returns)" if e.no_output else
                          f"models.{model}.{'input' if e.label is None else 'shapes.' + e.label}: the model does "
                          f"not accept inputs of shape {e.shapes}: {e.why}") from None
    except ExportFailed as e:
        raise ExportError(f"EXPORT_FAIL with exporter={exporter} opset={opset} "
                          f"<export.exporter, export.opset>: {e}") from None
    inv = layers.pop("ops")
    layers = {"model": model, **layers}
    if plan.labels != [None]:  # several input shapes: what was declared dynamic, and each shape
        layers.update(dynamic_axes=plan.dynamic, shapes=plan.shown)
    write_json(out / "layers.json", layers, sort_keys=False)
    write_json(out / "ops.json", inv)
    uncalled, n = layers["uncalled"], len(layers["layers"])
    return (f"{exporter} opset {opset}, {n} layer outputs, "
            f"{inv['nodes']} nodes / {inv['op_types']} op types, {time.perf_counter() - t0:.1f}s -> {out}"
            + (f" ({len(uncalled)} leaf modules never called, not captured: {', '.join(uncalled[:3])}"
               f"{', ...' if len(uncalled) > 3 else ''})" if uncalled else ""))
