"""torch -> ONNX export of the per-layer graph, the plain graph derived from it, and the op inventory.

One export: the model wrapped in a LayerRecorder, so every leaf-module call is a named graph output
(`layers.onnx`). The plain graph (`model.onnx`, what ships) is the same graph with only the model
outputs kept and dead nodes dropped, so both graphs carry identical weights: both point at one shared
weights file, `weights.bin` (ONNX external data, parity.models.onnx_weights), and neither the export
nor anything after it holds the weights in a protobuf (no 2 GiB limit). Whole-model latency is
measured on the plain graph, since extra outputs can change what a backend fuses.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import onnx

from parity.core.io import atomic_path
from parity.core.store import is_output
from parity.models import onnx_cut, onnx_weights, torchlib_table
from parity.models.onnx_graph import op_inventory, prune_outputs  # noqa: F401  (export, decoder, tests)


def export_layers(model, example: tuple, input_names: list[str], path: Path, exporter: str, opset: int,
                  dynamic: dict[str, dict[int, str]] | None = None, shapes: list | None = None,
                  types: dict | None = None, unsaved: dict | None = None) -> list[str]:
    """Export `model` with every leaf call as an output; return output names (model outputs first).
    `dynamic`: {input name: {axis: dim name}} declared dynamic (several input shapes, parity.config.inputspec);
    `shapes`: [(label, example)] of every input shape, in order, each run once first (InputRefused when the
    model does not take one; the one that is `example` runs in the recorder, giving the names, so the export
    does not run the model once more: issue 38); `types`: gets each leaf module's type name; `unsaved`
    (dynamo): gets the exported program under "program" and nothing is written to `path`."""
    import torch  # lazy: torch +1.84 s (BENCHMARKS 22); parity.pipeline.decoder uses this module's ONNX helpers only

    # lazy: torch +1.84 s (BENCHMARKS 22); parity.pipeline.decoder uses this module's ONNX helpers only
    from parity.models.layers import LayerRecorder, flatten, module_types

    kwargs = dict(input_names=input_names, opset_version=opset, **(dynamic_axes(input_names, dynamic, exporter)
                                                                   if dynamic else {}))
    if exporter == "dynamo":
        kwargs.update(dynamo=True, external_data=True, verbose=False)  # weights beside it: no 2 GiB limit
        torchlib_table.install()  # the exporter's operator table listed once, cheaply
    else:
        kwargs.update(dynamo=False)
    fastpath = torch.backends.mha.get_fastpath_enabled()
    if types is not None:
        types.update(module_types(model))
    rec = LayerRecorder(model).eval()
    try:
        with torch.no_grad():
            for label, ex in shapes or [(None, example)]:
                try:  # the recorder's hooks are idle outside its own forward: the bare model runs
                    out = rec(*ex) if ex is example else model(*ex)
                except Exception as e:  # any error of the model's own forward on these inputs
                    raise InputRefused(label, ex, f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}")
                if (not rec.names or not is_output(rec.names[0])) if ex is example else not flatten(out):
                    # no tensor came back (the recorder names the model's outputs first): nothing to compare
                    raw = model(*ex) if ex is example else out
                    raise InputRefused(label, ex, NO_OUTPUT + ("None" if raw is None else
                                                                f"no tensor (a {type(raw).__name__})"), no_output=True)
        kwargs.update(output_names=list(rec.names))
        if exporter != "dynamo":
            torch.backends.mha.set_fastpath_enabled(False)  # legacy export of nn.MultiheadAttention
        with torch.no_grad():
            if exporter == "dynamo" and unsaved is not None:  # f=None: the program, its weights unsaved
                unsaved["program"] = torch.onnx.export(rec, example, None, **kwargs)
            else:
                torch.onnx.export(rec, example, str(path), **kwargs)
    finally:  # the model is left as it was: the reference runs on it next (parity.pipeline.fold)
        rec.remove_hooks()
        torch.backends.mha.set_fastpath_enabled(fastpath)
    return kwargs["output_names"]


class InputRefused(Exception):
    """The model does not take one input shape's inputs (a config error, not an export failure):
    `label` (None: the model's `input:`), `shapes` (the example's), `why` (the first line of its error,
    or NO_OUTPUT: the forward returned no tensor)."""

    def __init__(self, label, example, why: str, no_output: bool = False):
        super().__init__(why)
        self.label, self.why, self.no_output = label, why, no_output
        self.shapes = ", ".join(str(list(x.shape)) for x in example)


def dynamic_axes(input_names: list[str], dynamic: dict[str, dict[int, str]], exporter: str) -> dict:
    """torch.onnx.export arguments declaring the `dynamic` axes ({input: {axis: dim name}},
    parity.config.inputspec.dynamic_axes): torch.export Dims for dynamo, dynamic_axes for legacy."""
    if exporter != "dynamo":
        return {"dynamic_axes": {n: dict(axes) for n, axes in dynamic.items()}}
    # lazy: torch +1.84 s (BENCHMARKS 22); parity.pipeline.decoder uses this module's ONNX helpers only
    from torch.export import Dim

    objs = {d: Dim(d) for axes in dynamic.values() for d in axes.values()}
    # LayerRecorder.forward(*inputs): the spec is one tuple, for the varargs
    return {"dynamic_shapes": (tuple({a: objs[d] for a, d in dynamic[n].items()} if n in dynamic else None
                                     for n in input_names),)}


PATH_METADATA = ("pkg.torch.onnx.stack_trace",)


def strip_paths(m: onnx.ModelProto) -> onnx.ModelProto:
    """Drop node metadata that embeds absolute source paths (the dynamo exporter's stack traces), so
    the same model exported from two checkouts gives the same bytes (and DVC cache hits across
    clones). The path-free metadata (namespace, name_scopes: which torch module made each node) stays."""
    nodes = [n for g in onnx_weights.graphs(m.graph) for n in g.node] + [n for f in m.functions for n in f.node]
    for n in nodes:
        keep = [p for p in n.metadata_props if p.key not in PATH_METADATA]
        if len(keep) != len(n.metadata_props):
            del n.metadata_props[:]
            n.metadata_props.extend(keep)
        n.doc_string = ""
    return m


def constant_outputs_as_nodes(m: onnx.ModelProto) -> onnx.ModelProto:
    """A graph output that is an initializer (the exporter folds a layer whose inputs are all
    constant: BERT's position embeddings at a fixed sequence length) becomes an Identity of a renamed
    initializer. onnxruntime's fp16 conversion (keep_io_types) otherwise defines that name twice and
    the session refuses the model. No-op (same bytes) for graphs without such an output."""
    g = m.graph
    outs = {o.name for o in g.output}
    nodes = []
    for t in g.initializer:
        if t.name in outs:
            const = f"{t.name}__const"
            nodes.append(onnx.helper.make_node("Identity", [const], [t.name], name=f"{t.name}__identity"))
            t.name = const
    if nodes:  # first: other nodes may read the name too
        rest = list(g.node)
        del g.node[:]
        g.node.extend(nodes + rest)
    return m


def layer_regions(m: onnx.ModelProto) -> dict[str, dict]:
    """layers.json `regions`: per leaf call, the leaf calls feeding it and the op types between them
    (from the exported nodes' name_scopes; parity.models.onnx_cut.regions). A graph without that
    metadata (the legacy exporter) gives {} rather than failing the export."""
    try:
        return onnx_cut.regions(m)
    except Exception:  # naming is a diagnostic aid: never fail an export over it
        return {}


LEAFSPEC_WARNING = r".*isinstance\(treespec, LeafSpec\)"  # torch 2.x pytree deprecation (FutureWarning)


class ExportFailed(Exception):
    """The exporter raised: EXPORT_FAIL (the message is the exporter's, first line)."""


NO_OUTPUT = "forward returned "  # InputRefused.why for a forward with nothing to compare


def export_checked(model, firsts: list, plan, out: Path, exporter: str, opset: int) -> dict:
    """Export the per-layer graph to `out`/layers.onnx with its weights in `out`/weights.bin (each
    published only when export and check succeed), and the plain graph to `out`/model.onnx. `firsts`:
    the first sample of each input shape, in the order of `plan.labels` (an InputPlan of
    parity.config.inputspec), each run once, the export label traced. Returns the record of layers.json
    (all but the model name) with the op inventory under "ops". InputRefused when the model does not
    take a shape, ExportFailed when the exporter raises. The dynamo exporter's program is not saved: its
    graph is serialised with the weights left in memory and written once, in graph order, into weights.bin
    (parity.models.onnx_weights.unsaved_graph, pack); the legacy exporter writes into a temp folder beside
    `out` and its weights are copied from there. Weights are never loaded into a protobuf."""
    import torch  # lazy: torch +1.84 s (BENCHMARKS 22); parity.pipeline.decoder uses this module's ONNX helpers only

    shapes = [(lab, tuple(torch.from_numpy(f[s["name"]].copy()) for s in plan.inputs)) for lab, f in zip(plan.labels, firsts)]
    example, types = shapes[plan.labels.index(plan.export_label)][1], {}
    unsaved = {} if exporter == "dynamo" else None
    out.parent.mkdir(parents=True, exist_ok=True)  # `out` itself only once the model took every shape
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.export-", dir=out.parent) as d:
        tmp = Path(d) / "layers.onnx"
        try:
            with warnings.catch_warnings():
                # torch.export's pytree prints it on every dynamo export (torch 2.x internals, not ours)
                warnings.filterwarnings("ignore", message=LEAFSPEC_WARNING, category=FutureWarning)
                names = export_layers(model, example, plan.names, tmp, exporter, opset, plan.dynamic, shapes,
                                      types, unsaved)
            # a dynamo export's weights go from memory to weights.bin once, not through a temp file (issue 38)
            graph, memory = (onnx_weights.unsaved_graph(unsaved.pop("program")) if unsaved is not None
                             else (onnx_weights.load_graph(tmp), None))
        except InputRefused:
            raise
        except Exception as e:  # the exporter's failure is the cell's result (EXPORT_FAIL), not a crash
            raise ExportFailed(f"{type(e).__name__}: {e}") from e
        full = constant_outputs_as_nodes(strip_paths(graph))
        out.mkdir(exist_ok=True)
        with atomic_path(out / onnx_weights.WEIGHTS, allow_empty=True) as w:
            onnx_weights.pack(full, d, w, memory=memory)
        del memory
    onnx_weights.write_checked(full, out / "layers.onnx")
    outputs = [n for n in names if is_output(n)]
    plain = prune_outputs(full, outputs)  # weightless: model.onnx shares layers.onnx's weights.bin
    onnx_weights.write_checked(plain, out / "model.onnx")
    called = {n.split("#")[0].split(":")[0] for n in names}
    # Leaf modules the forward never calls as modules (nn.MultiheadAttention.out_proj: MHA uses its
    # weights through F.multi_head_attention_forward) have no layer output; list them, don't hide them.
    return {"exporter": exporter, "opset": opset, "outputs": outputs, "uncalled": [n for n in types if n not in called],
            "layers": [{"name": n, "module": types.get(n.split("#")[0].split(":")[0], "")} for n in names if n not in outputs],
            "regions": layer_regions(full), "ops": op_inventory(plain)}
