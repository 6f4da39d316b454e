"""export@model: torch -> ONNX with every leaf-module call as a named output, checked, plus the
plain graph and an op inventory.

Writes, under --out: layers.onnx (per-layer graph), model.onnx (the same graph, model outputs only),
layers.json (output names in execution order, module types, `regions`: per leaf call the leaf calls
whose outputs feed it and the op types between them, e.g. Softmax between qkv and out), ops.json
(op types and counts, opset).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    from parity import config, inputspec

    ap = config.stage_parser("stages.export", __doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    p = config.load_or_die(a.params)

    import onnx

    from parity.export import ExportFailed, export_checked, input_error, layer_regions, op_inventory, prune_outputs
    from parity.io import atomic_path, write_json
    from parity.models import build, example_inputs
    from parity.models.layers import module_types
    from parity.store import is_output
    from stages.inputs import samples

    m = p["models"][a.model]
    exp = p.get("export", {})
    exporter, opset = exp.get("exporter", "dynamo"), int(exp.get("opset", 18))
    out = Path(a.out)
    t0 = time.perf_counter()
    try:
        model = build(m["arch"], p.get("seed", 0))
    except ValueError as e:  # an unknown model name or config key (torchvision, hf): the message lists valid ones
        print(f"export@{a.model}: models.{a.model}.arch: {e}", file=sys.stderr)
        return 1
    firsts, labels = samples({**p, "inputs": {"samples": 1}}, a.model), inputspec.labels(m)  # one per shape
    for label, first in zip(labels, firsts):
        example = example_inputs(m["input"], first)
        bad = input_error(model, example)
        if bad:
            shapes = ", ".join(str(list(x.shape)) for x in example)
            print(f"export@{a.model}: models.{a.model}.{'input' if label is None else 'shapes.' + label}: the model "
                  f"does not accept inputs of shape {shapes}: {bad}", file=sys.stderr)
            return 1
    example = example_inputs(m["input"], firsts[labels.index(inputspec.export_label(m))])
    dynamic = inputspec.dynamic_axes(m)  # axes whose size differs between models.<m>.shapes
    input_names = [s["name"] for s in m["input"]]
    try:
        names, full = export_checked(model, example, input_names, out / "layers.onnx", exporter, opset, dynamic)
    except ExportFailed as e:
        print(f"export@{a.model}: EXPORT_FAIL with exporter={exporter} opset={opset} "
              f"<export.exporter, export.opset>: {e}", file=sys.stderr)
        return 1
    outputs = [n for n in names if is_output(n)]
    plain = prune_outputs(full, outputs)
    onnx.checker.check_model(plain, full_check=True)
    with atomic_path(out / "model.onnx") as tmp:
        onnx.save(plain, str(tmp))
    types = module_types(model)
    called = {n.split("#")[0].split(":")[0] for n in names}
    # Leaf modules the forward never calls as modules (nn.MultiheadAttention.out_proj: MHA uses its
    # weights through F.multi_head_attention_forward) have no layer output; list them, don't hide them.
    uncalled = [n for n in types if n not in called]
    write_json(out / "layers.json", {
        "model": a.model, "exporter": exporter, "opset": opset, "outputs": outputs, "uncalled": uncalled,
        "layers": [{"name": n, "module": types.get(n.split("#")[0].split(":")[0], "")}
                   for n in names if n not in outputs],
        "regions": layer_regions(full),
        **({"dynamic_axes": dynamic, "shapes": {lab: inputspec.describe(m, lab) for lab in labels}} if labels != [None] else {}),
    }, sort_keys=False)
    inv = op_inventory(plain)
    write_json(out / "ops.json", inv)
    print(f"export@{a.model}: {exporter} opset {opset}, {len(names) - len(outputs)} layer outputs, "
          f"{inv['nodes']} nodes / {inv['op_types']} op types, {time.perf_counter() - t0:.1f}s -> {out}"
          + (f" ({len(uncalled)} leaf modules never called, not captured: {', '.join(uncalled[:3])}"
             f"{', ...' if len(uncalled) > 3 else ''})" if uncalled else ""))
    return 0


if __name__ == "__main__":
    from parity.io import exit_now

    exit_now(main())  # outputs are in place; skip torch's interpreter teardown
