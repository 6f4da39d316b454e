"""The torch CPU reference of a model: per-layer outputs at fp32 (and fp64, the golden run, with each
leaf call's first floating input as `pre:<call>`), streamed to the Parquet store sample by sample.

Memory: the model is built once, in float32. The fp64 run does not convert the whole model (a 1.1B
decoder would need 8.8 GB for an fp64 copy): each leaf module's floating parameters and buffers are
converted to float64 just before it runs and restored right after (fp64_leaves), so at most one leaf's
fp64 weights exist beside the fp32 model. The values are the same bytes as a whole-model `.double()`:
every leaf computes in float64 on float64 weights either way. Parameters that a module uses without
calling the leaf that holds them (nn.MultiheadAttention reads `out_proj.weight` itself) and parameters
of non-leaf modules are converted for the whole run; a model whose forward still meets a float32
weight falls back to the whole-model conversion (same values, more memory), saying so.
"""

from __future__ import annotations

import contextlib

from parity.core import store
from parity.models import build as build_model
from parity.models.layers import LayerRecorder, leaf_modules
import torch
from parity.config import schema
# the ~0-output rule, shared with the ONNX-file reference (torch-free there)
from parity.pipeline.tiny_output import MIN_OUTPUT_ABS, TinyOutput, refusal, tiny_outputs  # noqa: F401


def build(p: dict, model_name: str):
    """The model of `model_name`, fp32, seeded, in eval mode."""
    m = p["models"][model_name]
    return build_model(m["arch"], schema.of(p).seed)


def stream(p: dict, model_name: str, net, feeds: list, dtype: str, writer, inputs: bool = False) -> dict:
    """One reference run of `net` at torch dtype `dtype` on `feeds`, each sample's rows handed to
    `writer` (store.Writer) as soon as that sample has run. Returns {output name: max |value|}."""
    m = p["models"][model_name]
    tdt = getattr(torch, dtype)
    rec = LayerRecorder(net, inputs=inputs).eval()
    peak: dict[str, float] = {}
    try:
        with torch.no_grad(), _at(net, tdt) as run:
            for k, f in enumerate(feeds):
                xs = [torch.from_numpy(f[s["name"]].copy()) for s in m["input"]]
                xs = [x.to(tdt) if x.is_floating_point() else x for x in xs]
                outs = run(rec, xs)
                rows = store.rows_from(k, [(n, v.detach().numpy()) for n, v in zip(rec.names, outs)])
                del outs
                if inputs:  # a leaf input that is another leaf's output is stored once (its copy freed)
                    rows = store.stored_once(rows, release=isinstance(writer, store.Writer))
                for t in rows:
                    if store.is_output(t.name):
                        peak[t.name] = max(peak.get(t.name, 0.0), float(abs(t.array).max()))
                writer.extend(rows)
                del rows
    finally:
        rec.remove_hooks()
    return peak


def run(p: dict, model_name: str, feeds: list, dtype: str, inputs: bool = False) -> list:
    """Store rows of one reference run, kept in memory (small models, tests): stream() into a list."""
    rows: list = []
    stream(p, model_name, build(p, model_name), feeds, dtype, rows, inputs)
    return rows


@contextlib.contextmanager
def _at(net, tdt):
    """A callable running the recorder at `tdt`: float32 as built; float64 leaf by leaf (fp64_leaves)."""
    if tdt == torch.float32:
        yield lambda rec, xs: rec(*xs)
        return
    if tdt != torch.float64:  # any other dtype: the whole model, as before
        net.to(tdt)
        yield lambda rec, xs: rec(*xs)
        return
    with fp64_leaves(net) as state:
        def run(rec, xs):
            if state["whole"]:
                return rec(*xs)
            try:
                return rec(*xs)
            except RuntimeError as e:  # a float32 weight met a float64 value outside its own leaf
                if "dtype" not in str(e).lower() and "type" not in str(e).lower():
                    raise
                state["whole"] = True
                state["restore"]()
                net.to(torch.float64)
                print(f"reference: leaf-by-leaf float64 failed ({str(e).splitlines()[0][:120]}); "
                      f"converting the whole model to float64 (same values, more memory)")
                return rec(*xs)
        yield run


@contextlib.contextmanager
def fp64_leaves(net):
    """Hooks that run every called leaf module in float64 (its floating parameters and buffers
    converted on entry, the float32 originals put back on exit); non-leaf modules' own tensors and
    the leaves of modules that hold tensors of their own (they may read a child's weights without
    calling it) in float64 for the whole block. Yields a state dict: `restore()` undoes it all."""
    leaves = dict(leaf_modules(net))
    owners = {n for n, mod in net.named_modules() if n not in leaves and _own_tensors(mod)}
    permanent = [mod for n, mod in net.named_modules() if n not in leaves and _own_tensors(mod)]
    permanent += [mod for n, mod in leaves.items() if n.rpartition(".")[0] in owners]
    saved: dict[int, dict] = {}

    def to64(mod):
        saved[id(mod)] = _swap(mod, torch.float64)

    def back(mod):
        orig = saved.pop(id(mod), None)
        if orig is not None:
            _restore(mod, orig)

    fixed = [(mod, _swap(mod, torch.float64)) for mod in permanent]
    handles = []
    for n, mod in leaves.items():
        if any(mod is x for x in permanent) or not _own_tensors(mod):
            continue
        handles.append(mod.register_forward_pre_hook(lambda mod, args: to64(mod)))
        handles.append(mod.register_forward_hook(lambda mod, args, out: back(mod), always_call=True))

    def restore():
        for h in handles:
            h.remove()
        handles.clear()
        for mod in list(leaves.values()):
            back(mod)
        for mod, orig in fixed:
            _restore(mod, orig)
        fixed.clear()

    state = {"whole": False, "restore": restore}
    try:
        yield state
    finally:
        if not state["whole"]:
            restore()


def _own_tensors(mod) -> list:
    """The floating parameters and buffers a module holds itself (not its children's)."""
    return [t for t in list(mod.parameters(recurse=False)) + list(mod.buffers(recurse=False))
            if t is not None and t.is_floating_point()]


def _swap(mod, dtype) -> dict:
    """Replace `mod`'s own floating parameters' and buffers' data by `dtype` copies; the originals."""
    orig = {}
    for name, t in list(mod._parameters.items()) + list(mod._buffers.items()):
        if t is not None and t.is_floating_point() and t.dtype != dtype:
            orig[name] = t.data
            t.data = t.data.to(dtype)
    return orig


def _restore(mod, orig: dict) -> None:
    for name, data in orig.items():
        t = mod._parameters.get(name)
        if t is None:
            t = mod._buffers.get(name)
        t.data = data


def write(p: dict, model_name: str, feeds: list, out, fp64: bool, net=None, kept: dict | None = None) -> str:
    """fp32.parquet (and fp64.parquet) under `out`, streamed; the summary line. TinyOutput when the
    model's output is too small to prove anything (nothing is published). `net`: the model, built
    already (build()); it is left as built (fp32 weights restored after the fp64 run). `kept`
    ({"mb": bound, "background": bool}): the fp64 values written are kept under "groups" while they stay
    under the bound (store.Writer keep_mb), for a reader in this process (parity.pipeline.fold); with
    "background", row groups are encoded on a thread beside the runs."""
    net = net if net is not None else build(p, model_name)
    bg = bool(kept and kept.get("background"))  # row groups encoded beside the runs (publish.background_ok)
    with store.writer(out / "fp32.parquet", {"model": model_name, "dtype": "float32"}, background=bg) as w:
        tiny = tiny_outputs(stream(p, model_name, net, feeds, "float32", w))
        if tiny:
            raise refusal(model_name, tiny, f"Initialise the model's head, set models.{model_name}.arch.calibrate "
                                            f"for BatchNorm nets, or change its inputs.")
    n = w.count
    msg = f"reference@{model_name}: {n} tensors ({len(feeds)} samples) fp32"
    if fp64:
        with store.writer(out / "fp64.parquet", {"model": model_name, "dtype": "float64"},
                          keep_mb=kept.get("mb") if kept is not None else None, background=bg) as w:
            stream(p, model_name, net, feeds, "float64", w, inputs=True)
        if kept is not None:
            kept["groups"] = w.kept
        msg += " + fp64 golden"
    return msg + f" -> {out}"
