"""A causal LM as one decode step with an explicit KV cache, for generation drift (torch).

`build_causal_lm` builds the model type's causal LM (base model + LM head: LlamaForCausalLM,
GPT2LMHeadModel) from a config alone, with `use_cache=True` (parity.models.hf builds the base model,
cache off, for the per-layer pipeline; the config keys are checked the same way).

`DecoderStep(lm)` runs `lm` (a transformers causal LM, build_causal_lm) on flat
tensors: forward(input_ids [1, S], attention_mask [1, P + S], position_ids [1, S], *past) with past =
(key, value) per layer, each [1, kv_heads, P, head_dim], builds transformers' DynamicCache from them,
and returns (logits [1, S, vocab], *present) with present = the cache after the step ([.., P + S, ..]).
P = 0 (empty past tensors) is the prefill. The same module is what the torch sides run and what is
exported to ONNX, so both sides compute the same thing and name it the same way.

`record()` wraps it in parity.models.layers.LayerRecorder: every leaf module's output becomes one more
output, named as users know the module (`model.layers.1.mlp.down_proj`, `transformer.h.0.mlp.c_proj`):
the per-layer drift origin at the first failing step.

Export (`export`): the dynamo exporter (torch.onnx.export(dynamo=True)) with explicit past tensors and
torch.export Dims for the sequence, the past and the total length, so one graph serves the prefill
(past 0) and every decode step (measured with torch 2.13 + transformers 5.23: ORT matches torch within
2.1e-7 on the logits at past 0/seq 8, past 8/seq 1 and past 12/seq 1 for a tiny Llama and a tiny
GPT-2). The cache object itself is no graph input: the wrapper builds it from the flat tensors, which
is what makes the dynamo export work without registering transformers' Cache as a pytree.
Two graphs from one export: `decoder_layers.onnx` (logits, present, every leaf output) and
`decoder.onnx`, the same graph pruned to logits + present (what decode steps run: marking every
leaf output can change what onnxruntime fuses). Both keep their weights in one shared external-data
file, `decoder.weights` (`externalize`): on disk once, and no graph near protobuf's 2 GiB limit. Both keep the nodes' name_scopes, so a fault named by
module (parity.pipeline.generate.resolve_fault) names the same node in both.

The cache as layers (the origin search with the cache, parity.pipeline.generate.cache_check): the
`present.<i>.key/value` outputs belong to decoder layer i (`block_names`: `model.layers.1`,
`transformer.h.1`), and `cache_order` places them after that layer's last leaf in execution order.
`cache_fault` is a diagnostic fault on that path: one present output rounded to float16 and back on
its way out of the graph (the step's own attention reads the unrounded value; the next step reads the
rounded cache), as a backend that stores its KV cache in a narrower format would.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import torch
from onnx import TensorProto
from torch import nn
from torch.export import Dim
from transformers.cache_utils import DynamicCache

from parity.core.io import atomic_path
from parity.models import hf, torchlib_table
from parity.models.layers import LayerRecorder
from parity.pipeline.layer_export import prune_outputs, strip_paths

LM = "lm"  # DecoderStep keeps the causal LM as `self.lm`: layer names drop this prefix
LOGITS = "logits"


def build_causal_lm(name: str, kwargs: dict):
    """The causal LM of Hugging Face model type `name` with config `kwargs` (arch.kwargs), cache on,
    seeded by the caller. ValueError naming the bad key, or the type without a causal LM head."""
    tf = hf.load()
    kw = dict(kwargs)
    extra = {k: kw.pop(k) for k in hf.FROM_CONFIG_KEYS if k in kw}
    try:
        cfg = tf.AutoConfig.for_model(name, **kw)
    except ValueError as e:
        raise ValueError(f"unknown Hugging Face model type '{name}': {str(e).splitlines()[0]}") from e
    unknown = sorted(k for k in kw if not hasattr(type(cfg)(), k))
    if unknown:
        raise ValueError(f"unknown {type(cfg).__name__} key(s) {', '.join(unknown)} in arch.kwargs")
    cfg.use_cache = True
    try:
        return tf.AutoModelForCausalLM.from_config(cfg, **extra)
    except ValueError as e:
        raise ValueError(f"Hugging Face model type '{name}' has no causal LM head "
                         f"(AutoModelForCausalLM): {str(e).splitlines()[0]}") from e


def past_names(n_layers: int) -> list[str]:
    return [f"past.{i}.{kv}" for i in range(n_layers) for kv in ("key", "value")]


def present_names(n_layers: int) -> list[str]:
    return [f"present.{i}.{kv}" for i in range(n_layers) for kv in ("key", "value")]


class DecoderStep(nn.Module):
    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm.eval()
        self.n_layers = int(lm.config.num_hidden_layers)

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = DynamicCache(config=self.lm.config)
        for i in range(self.n_layers):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      past_key_values=cache, use_cache=True)
        present = []
        for layer in out.past_key_values.layers:
            present += [layer.keys, layer.values]
        return (out.logits, *present)


def kv_shape(lm: nn.Module) -> tuple[int, int]:
    """(kv_heads, head_dim) of the cache: a prefill of one token tells, whatever the architecture."""
    with torch.no_grad():
        out = lm(input_ids=torch.zeros(1, 1, dtype=torch.long), attention_mask=torch.ones(1, 1, dtype=torch.long),
                 use_cache=True)
    k = out.past_key_values.layers[0].keys
    return int(k.shape[1]), int(k.shape[3])


def empty_past(lm: nn.Module, dtype=None) -> list[torch.Tensor]:
    heads, dim = kv_shape(lm)
    dtype = dtype or next(lm.parameters()).dtype
    return [torch.zeros(1, heads, 0, dim, dtype=dtype) for _ in range(2 * int(lm.config.num_hidden_layers))]


def record(lm: nn.Module) -> LayerRecorder:
    """DecoderStep(lm) under a LayerRecorder: forward returns (logits, *present, *leaf outputs);
    `layer_names(rec)` names the leaf outputs after a call."""
    return LayerRecorder(DecoderStep(lm))


def layer_names(rec: LayerRecorder, n_outputs: int) -> list[str]:
    """The leaf output names of the last call, the DecoderStep prefix dropped."""
    return [n.removeprefix(LM + ".") for n in rec.names[n_outputs:]]


def block_names(lm: nn.Module) -> list[str]:
    """The decoder layers' module names as the leaves name them (`model.layers.0`, ...): the first
    ModuleList holding num_hidden_layers modules."""
    n = int(lm.config.num_hidden_layers)
    for name, m in lm.named_modules():
        if isinstance(m, nn.ModuleList) and len(m) == n:
            return [f"{name}.{i}" for i in range(n)]
    return [f"layer {i}" for i in range(n)]


def cache_order(layers: list[str], blocks: list[str]) -> list[str]:
    """The leaves `layers` (execution order) with present.<i>.key/value placed after the last leaf of
    decoder layer i (blocks[i]); a layer without leaves gets them at the end."""
    out, last = list(layers), {}
    for i, b in enumerate(blocks):
        idx = [j for j, n in enumerate(layers) if n.startswith(b + ".")]
        last[i] = idx[-1] if idx else len(layers)
    for i in sorted(last, key=lambda i: -last[i]):  # from the back, so earlier positions stay put
        out[last[i] + 1:last[i] + 1] = [f"present.{i}.key", f"present.{i}.value"]
    return out


def cache_fault(m, name: str):
    """A copy of decoder graph `m` whose output `name` (a present.<i>.key/value) is rounded to float16
    and back on its way out: the nodes that read the value inside the step keep the unrounded one."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    g = out.graph
    if name not in [o.name for o in g.output]:
        raise ValueError(f"cache_fault: {name!r} is not an output of the graph "
                         f"(outputs: {', '.join(o.name for o in g.output if o.name.startswith('present.'))})")
    raw, half = name + "__raw", name + "__fp16"
    for n in g.node:
        n.output[:] = [raw if o == name else o for o in n.output]
        n.input[:] = [raw if i == name else i for i in n.input]
    g.node.extend([onnx.helper.make_node("Cast", [raw], [half], name=half, to=TensorProto.FLOAT16),
                   onnx.helper.make_node("Cast", [half], [name], name=name + "__fp32", to=TensorProto.FLOAT)])
    return out


def feeds(ids, past_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, position_ids) of a step feeding `ids` after `past_len` tokens."""
    ids = torch.as_tensor(ids, dtype=torch.long).reshape(1, -1)
    s = ids.shape[1]
    return (ids, torch.ones(1, past_len + s, dtype=torch.long),
            torch.arange(past_len, past_len + s, dtype=torch.long).reshape(1, -1))


def export(lm: nn.Module, out_dir, opset: int = 18) -> dict:
    """decoder_layers.onnx and decoder.onnx under `out_dir` (module docstring); returns decoder.json:
    input/output names, cache shape, the leaf output names in execution order."""
    out_dir = Path(out_dir)
    n = int(lm.config.num_hidden_layers)
    rec = record(lm)
    heads, dim = kv_shape(lm)
    # the example: past 3, seq 2 (torch.export specialises dims that are 0 or 1 in the example)
    past = [torch.randn(1, heads, 3, dim, generator=torch.Generator().manual_seed(i)) for i in range(2 * n)]
    ids, mask, pos = feeds([1, 2], 3)
    with torch.no_grad():
        rec(ids, mask, pos, *past)
    layers = layer_names(rec, 1 + 2 * n)
    inputs = ["input_ids", "attention_mask", "position_ids", *past_names(n)]
    outputs = [LOGITS, *present_names(n), *layers]

    p, s, t = Dim("past", min=0, max=1 << 16), Dim("seq", min=1, max=1 << 16), Dim("total", min=1, max=1 << 17)
    shapes = ({1: s}, {1: t}, {1: s}, *({2: p} for _ in range(2 * n)))
    torchlib_table.install()  # the exporter's operator table listed once, cheaply
    prog = torch.onnx.export(rec, (ids, mask, pos, *past), input_names=inputs, output_names=outputs,
                             dynamic_shapes=(shapes,), dynamo=True, opset_version=opset, external_data=False)
    m = strip_paths(prog.model_proto)
    del prog
    externalize(m, out_dir, WEIGHTS)  # before pruning: the copy prune_outputs makes holds no weights
    plain = prune_outputs(m, [LOGITS, *present_names(n)])
    for name, proto in (("decoder_layers.onnx", m), ("decoder.onnx", plain)):
        with atomic_path(out_dir / name) as tmp:
            onnx.save(proto, str(tmp))
    return {"inputs": inputs, "outputs": [LOGITS, *present_names(n)], "layers": layers, "n_layers": n,
            "kv_heads": heads, "head_dim": dim, "vocab_size": int(lm.config.vocab_size), "opset": opset,
            "exporter": "dynamo", "weights": WEIGHTS}


WEIGHTS = "decoder.weights"
EXTERNAL_MIN = 1024  # initializers of at least this many bytes go to the weights file


def externalize(m, out_dir, name: str) -> int:
    """Write the bytes of every initializer of `m` holding >= EXTERNAL_MIN bytes (raw_data) once, in
    initializer order, to out_dir/name (atomically), and make `m` refer to them (ONNX external data,
    location relative to the graph). Both decoder graphs refer to the one file: the weights are on
    disk once, no graph is near protobuf's 2 GiB limit, and onnxruntime reads them by path. Returns
    the bytes written."""
    written = 0
    with atomic_path(Path(out_dir) / name, allow_empty=True) as tmp, open(tmp, "wb") as f:
        for t in m.graph.initializer:
            if t.data_location == TensorProto.EXTERNAL or len(t.raw_data) < EXTERNAL_MIN:
                continue
            data = t.raw_data
            ref = {"location": name, "offset": str(written), "length": str(len(data))}
            f.write(data)
            written += len(data)
            t.ClearField("raw_data")
            t.data_location = TensorProto.EXTERNAL
            del t.external_data[:]
            for k, v in ref.items():
                e = t.external_data.add()
                e.key, e.value = k, v
    return written
