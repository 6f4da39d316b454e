"""export@model for a model given as an ONNX file (arch.source: onnx): the file checked
(parity.models.onnx_source.load_checked), then written as the torch export writes its graphs:
layers.onnx (every floating node output a graph output), model.onnx (both pointing at one
weights.bin), layers.json, ops.json."""

from __future__ import annotations

from pathlib import Path

from parity.core.io import write_json
from parity.models.onnx_graph import op_inventory
from parity.models.onnx_source import arch_path, check_inputs, load_checked, write_graphs


def export_file(model: str, model_cfg: dict, out: Path) -> str:
    """export@model for an ONNX file: layers.onnx, model.onnx, layers.json, ops.json under `out`.
    Checks everything first (OnnxSourceError), so a bad file writes nothing. Returns a summary line."""
    where = f"models.{model}.arch.path"
    path = arch_path(model_cfg)
    notes: list[str] = []
    m = load_checked(path, where, notes)
    check_inputs(m, model_cfg["input"], path, f"models.{model}.input")
    layers, plain, names, renamed = write_graphs(m, path.parent, out)
    write_json(out / "layers.json", {
        "model": model, "exporter": "onnx-file", "source": str(path),
        "opset": next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), None),
        "outputs": list(renamed), "output_tensors": renamed, "uncalled": [],
        "layers": [{"name": n, "module": op} for n, op in names], "regions": {},
        **({"loaded_as": notes} if notes else {}),
    }, sort_keys=False)
    inv = op_inventory(plain)
    write_json(out / "ops.json", inv)
    return (f"ONNX file {path}, {len(names)} node outputs captured, {inv['nodes']} nodes / "
            f"{inv['op_types']} op types" + "".join(f"; {n}" for n in notes) + f" -> {out}")
