"""The export of one model: torch -> ONNX with every leaf-module call as a named output, checked,
plus the plain graph (model outputs only), layers.json and the op inventory (ops.json). The steps
themselves live in parity.export; this is their order and what is written."""

from __future__ import annotations

import time
from pathlib import Path


class ExportError(Exception):
    """The model cannot be exported as configured (the message names the key)."""


def export_model(p: dict, model: str, out: Path) -> str:
    """Write layers.onnx, model.onnx, layers.json and ops.json under `out`; the summary line."""
    import onnx

    from parity.export import ExportFailed, export_checked, input_error, op_inventory, prune_outputs
    from parity.io import atomic_path, write_json
    from parity.models import build, example_inputs
    from parity.pipeline.inputs import samples
    from parity.store import is_output

    m = p["models"][model]
    exp = p.get("export", {})
    exporter, opset = exp.get("exporter", "dynamo"), int(exp.get("opset", 18))
    t0 = time.perf_counter()
    net = build(m["arch"], p.get("seed", 0))
    example = example_inputs(m["input"], samples({**p, "inputs": {"samples": 1}}, model)[0])
    bad = input_error(net, example)
    if bad:
        shapes = ", ".join(str(list(x.shape)) for x in example)
        raise ExportError(f"models.{model}.input: the model does not accept inputs of shape {shapes}: {bad}")
    try:
        names, full = export_checked(net, example, [s["name"] for s in m["input"]], out / "layers.onnx",
                                     exporter, opset)
    except ExportFailed as e:
        raise ExportError(f"EXPORT_FAIL with exporter={exporter} opset={opset} "
                          f"<export.exporter, export.opset>: {e}") from None
    outputs = [n for n in names if is_output(n)]
    plain = prune_outputs(full, outputs)
    onnx.checker.check_model(plain, full_check=True)
    with atomic_path(out / "model.onnx") as tmp:
        onnx.save(plain, str(tmp))
    layers = _layers_json(model, net, names, outputs, full, exporter, opset)
    write_json(out / "layers.json", layers, sort_keys=False)
    inv = op_inventory(plain)
    write_json(out / "ops.json", inv)
    uncalled = layers["uncalled"]
    return (f"{exporter} opset {opset}, {len(names) - len(outputs)} layer outputs, "
            f"{inv['nodes']} nodes / {inv['op_types']} op types, {time.perf_counter() - t0:.1f}s -> {out}"
            + (f" ({len(uncalled)} leaf modules never called, not captured: {', '.join(uncalled[:3])}"
               f"{', ...' if len(uncalled) > 3 else ''})" if uncalled else ""))


def _layers_json(model: str, net, names: list, outputs: list, full, exporter: str, opset: int) -> dict:
    from parity.export import layer_regions
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
