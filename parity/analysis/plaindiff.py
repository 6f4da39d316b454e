"""Where the shipped graph differs from the per-layer one (issue 35, item 5): a cell whose only failing
values are the plain graph's (`plain:output`: model.onnx disagrees, layers.onnx's every layer passes) has
its fault in model.onnx's own nodes or in how the provider runs that graph. The export derives model.onnx
from layers.onnx by pruning outputs (same node names, same initializers), so the nodes whose op type,
attributes, inputs or weights differ between the two name the fault, and the module each belongs to
(the node's name_scopes). Static: no inference, the weights compared only where their references differ
(same file, offset and length: the same bytes). No node differing: the provider runs the plain graph
differently (fusions the extra outputs prevented), and reduce@ bisects it.

`plain_only(cd)` says whether a judged cell is that case; `locate(cd, model_dir)` sets its drift origin
to the first differing node's module and its cause to label `plain_graph` (the numbers' own cause kept
in the evidence). onnx is imported only there, never at a light stage's start.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

from parity.core import store

LIST_MAX = 8


def plain_only(cd) -> bool:
    """The cell failed and every layer that failed is a plain-graph value (`plain:...`)."""
    failed = [d for d in cd.layers if not d.passed]
    own_failed = [r for r in cd.own if not r.get("passed", True)]
    return bool(failed) and not own_failed and all(d.name.startswith(store.PLAIN) for d in failed)


PREFIX = "model."  # = parity.models.onnx_cut.PREFIX: LayerRecorder keeps the wrapped model as `self.model`
SCOPES = "pkg.torch.onnx.name_scopes"  # the dynamo exporter's node metadata (parity.models.onnx_cut.scopes)


def _module(node) -> str | None:
    """The module a node belongs to: its deepest name scope under the recorder's `model.` (the module path
    as users name it), None without the exporter's metadata. (Read here rather than through
    parity.models.onnx_cut, so that the diff stage's code closure holds no model builders.)"""
    raw = next((p.value for p in node.metadata_props if p.key == SCOPES), None)
    try:
        v = ast.literal_eval(raw) if raw else []
    except (ValueError, SyntaxError):
        return None
    mods = [str(x) for x in v if str(x).startswith(PREFIX)] if isinstance(v, (list, tuple)) else []
    return mods[-1].removeprefix(PREFIX) if mods else None


def _ref(t) -> tuple | None:
    """(location, offset, length) of an external initializer, None for inline data."""
    ext = {e.key: e.value for e in t.external_data}
    return (ext.get("location"), ext.get("offset", "0"), ext.get("length")) if ext else None


def _tensor_change(a, a_dir: Path, b, b_dir: Path) -> str | None:
    """How initializer `a` (model.onnx's) differs from `b` (layers.onnx's), None when equal."""
    from onnx import numpy_helper  # lazy: the diff stage imports onnx only for a plain-only failure

    if _ref(a) is not None and _ref(a) == _ref(b) and a_dir == b_dir:
        return None
    x, y = numpy_helper.to_array(a, str(a_dir)), numpy_helper.to_array(b, str(b_dir))
    if x.shape != y.shape or x.dtype != y.dtype:
        return f"{a.name}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}"
    if np.array_equal(x, y):
        return None
    xf, yf = x.astype(np.float64).ravel(), y.astype(np.float64).ravel()
    d = xf - yf
    ny = float(np.sqrt(yf @ yf)) or 1.0
    s = float(xf @ yf) / float(yf @ yf) if float(yf @ yf) > 0 else 1.0
    r = float(np.sqrt(((xf - s * yf) ** 2).sum())) / ny
    how = f", ~ x{s:.6g} (residual {r:.2g})" if r * 10 <= float(np.sqrt(d @ d)) / ny else ""
    return (f"{a.name}: {int((d != 0).sum()):,} of {d.size:,} values differ, rel_l2 "
            f"{float(np.sqrt(d @ d)) / ny:.3g}{how}")


def graph_changes(model_dir: Path) -> list[dict]:
    """model.onnx's nodes that differ from layers.onnx's node of the same name, in graph order:
    {node, op_type, module, changes}."""
    import onnx  # lazy: the diff stage imports onnx only for a plain-only failure

    model_dir = Path(model_dir)
    plain, layers = (onnx.load(str(model_dir / f), load_external_data=False) for f in ("model.onnx", "layers.onnx"))
    lnodes = {n.name: n for n in layers.graph.node}
    pin, lin = ({t.name: t for t in m.graph.initializer} for m in (plain, layers))
    out = []
    for n in plain.graph.node:
        o = lnodes.get(n.name)
        if o is None:
            changes = ["not in layers.onnx"]
        else:
            changes = []
            if n.op_type != o.op_type:
                changes.append(f"op {o.op_type} -> {n.op_type}")
            if sorted(a.SerializeToString() for a in n.attribute) != sorted(a.SerializeToString() for a in o.attribute):
                changes.append("attributes differ")
            for i, (x, y) in enumerate(zip(n.input, o.input)):
                if x in pin and y in lin:
                    c = _tensor_change(pin[x], model_dir, lin[y], model_dir)
                    if c:
                        changes.append(f"input {i} {c}")
                elif x != y and (x in pin or y in lin):
                    changes.append(f"input {i}: {y} -> {x}")
            if len(n.input) != len(o.input):
                changes.append(f"{len(o.input)} -> {len(n.input)} inputs")
        if changes:
            out.append({"node": n.name, "op_type": n.op_type, "module": _module(n), "changes": changes})
    return out


def locate(cd, model_dir: Path | None) -> None:
    """A plain-only failure's drift origin and cause (module docstring), in `cd.summary`."""
    if model_dir is None or not plain_only(cd) or not (Path(model_dir) / "model.onnx").exists() \
            or not (Path(model_dir) / "layers.onnx").exists():
        return
    numeric = cd.summary.get("drift_origin_cause")
    changes = graph_changes(Path(model_dir))
    ev = {"nodes": changes[:LIST_MAX], "n_nodes": len(changes), "failed": [d.name for d in cd.layers if not d.passed],
          "numeric": {k: numeric.get(k) for k in ("label", "summary")} if numeric else None}
    if not changes:
        cd.summary["drift_origin_cause"] = {
            "label": "plain_graph", "evidence": ev,
            "summary": "plain_graph: only the shipped graph (model.onnx) fails and its nodes match layers.onnx's "
                       "node for node: the provider runs it differently (fusions the per-layer outputs prevent); "
                       "reduce@ bisects it"}
        return
    first = changes[0]
    shown = "; ".join(f"{c['node']} ({c['op_type']}{', ' + c['module'] if c['module'] else ''}): "
                      f"{', '.join(c['changes'])}" for c in changes[:3])
    cd.summary["drift_origin"] = first["module"] or first["node"]
    cd.summary["drift_origin_cause"] = {
        "label": "plain_graph", "evidence": ev,
        "summary": f"plain_graph: only the shipped graph (model.onnx) fails; {len(changes)} of its nodes differ from "
                   f"layers.onnx's: {shown}{'; ...' if len(changes) > 3 else ''}"}
