"""The export of one model: torch -> ONNX with every leaf-module call as a named output, checked,
plus the plain graph (model outputs only), layers.json and the op inventory (ops.json). The steps
themselves live in parity.pipeline.layer_export; this is their order and what is written."""

from __future__ import annotations

import time
from pathlib import Path

from parity.config import inputspec
from parity.core import modelfiles
from parity.core.io import write_json
from parity.core.store import is_output
from parity.models import build, example_inputs
from parity.models.onnx_weights import write_checked
from parity.pipeline.inputs import samples
from parity.models.onnx_graph import op_inventory, prune_outputs
from parity.pipeline.layer_export import ExportFailed, export_checked
from parity.pipeline.layer_export import layer_regions
from parity.pipeline.layer_export import NO_OUTPUT, input_error
from parity.pipeline.onnx_export import export_file
from parity.models.onnx_source import OnnxSourceError
from parity.config import inputspec, schema


class ExportError(Exception):
    """The model cannot be exported as configured (the message names the key)."""


def export_model(p: dict, model: str, out: Path, built: dict | None = None) -> str:
    """Write layers.onnx, model.onnx (both pointing at one weights.bin), layers.json and ops.json under
    `out`; the summary line. `built`: gets the model the export built ("net"; torch models), as built
    (seeded, fp32, eval), for the reference's run in the same process (parity.pipeline.fold)."""
    m = p["models"][model]
    if modelfiles.is_onnx_file(m):  # an ONNX file: checked and instrumented, no torch
        try:
            return export_file(model, m, out)
        except OnnxSourceError as e:
            raise ExportError(str(e)) from None
    c = schema.of(p)
    exporter, opset = c.export.exporter, int(c.export.opset)
    t0 = time.perf_counter()
    try:
        net = build(m["arch"], c.seed)
    except ValueError as e:  # an unknown model name or config key (torchvision, hf): the message lists valid ones
        raise ExportError(f"models.{model}.arch: {e}") from None
    if built is not None:
        built["net"] = net
    recorded: list = []  # the export example's output and leaf-call names, from its checking run
    example = _checked_example(p, model, net, recorded)
    dynamic = inputspec.dynamic_axes(m)  # axes whose size differs between models.<m>.shapes
    try:
        names, full = export_checked(net, example, [s["name"] for s in m["input"]], out, exporter, opset, dynamic,
                                     recorded or None)
    except ExportFailed as e:
        raise ExportError(f"EXPORT_FAIL with exporter={exporter} opset={opset} "
                          f"<export.exporter, export.opset>: {e}") from None
    outputs = [n for n in names if is_output(n)]
    plain = prune_outputs(full, outputs)  # weightless: model.onnx shares layers.onnx's weights.bin
    write_checked(plain, out / "model.onnx")
    layers = _layers_json(model, net, names, outputs, full, exporter, opset)
    if inputspec.labels(m) != [None]:  # several input shapes: what was declared dynamic, and each shape
        layers.update(dynamic_axes=dynamic, shapes={lab: inputspec.describe(m, lab) for lab in inputspec.labels(m)})
    write_json(out / "layers.json", layers, sort_keys=False)
    inv = op_inventory(plain)
    write_json(out / "ops.json", inv)
    uncalled = layers["uncalled"]
    return (f"{exporter} opset {opset}, {len(names) - len(outputs)} layer outputs, "
            f"{inv['nodes']} nodes / {inv['op_types']} op types, {time.perf_counter() - t0:.1f}s -> {out}"
            + (f" ({len(uncalled)} leaf modules never called, not captured: {', '.join(uncalled[:3])}"
               f"{', ...' if len(uncalled) > 3 else ''})" if uncalled else ""))


def _checked_example(p: dict, model: str, net, names: list | None = None):
    """The example the export traces (the largest shape with `models.<m>.shapes`), after checking
    that the model takes every shape's inputs (a shape it cannot take is a config error). `names`: gets
    the names of the export example's run (layer_export.input_error), for the export."""
    m = p["models"][model]
    firsts, labels = samples({**p, "inputs": {"samples": 1}}, model), inputspec.labels(m)  # one per shape
    export_label = inputspec.export_label(m)
    for label, first in zip(labels, firsts):
        example = example_inputs(m["input"], first)
        bad = input_error(net, example, names if label == export_label else None)
        if bad and bad.startswith(NO_OUTPUT):
            raise ExportError(f"models.{model}: {bad} (parity compares the tensors a model returns)")
        if bad:
            shapes = ", ".join(str(list(x.shape)) for x in example)
            raise ExportError(f"models.{model}.{'input' if label is None else 'shapes.' + label}: the model does "
                              f"not accept inputs of shape {shapes}: {bad}")
    return example_inputs(m["input"], firsts[labels.index(export_label)])


def _layers_json(model: str, net, names: list, outputs: list, full, exporter: str, opset: int) -> dict:
    # lazy: parity.models.layers imports torch (+1.84 s, BENCHMARKS 22); an ONNX-file model's export has no torch on its path
    from parity.models.layers import module_types

    types = module_types(net)
    called = {n.split("#")[0].split(":")[0] for n in names}
    # Leaf modules the forward never calls as modules (nn.MultiheadAttention.out_proj: MHA uses its
    # weights through F.multi_head_attention_forward) have no layer output; list them, don't hide them.
    uncalled = [n for n in types if n not in called]
    return {"model": model, "exporter": exporter, "opset": opset, "outputs": outputs, "uncalled": uncalled,
            "layers": [{"name": n, "module": types.get(n.split("#")[0].split(":")[0], "")}
                       for n in names if n not in outputs],
            "regions": layer_regions(full)}
