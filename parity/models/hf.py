"""Hugging Face transformers from a config (`arch.source: hf`): no network, random init from the seed.

`arch: {source: hf, name: bert, kwargs: {hidden_size: 768, ...}}` builds
`transformers.AutoModel.from_config(AutoConfig.for_model("bert", **kwargs))`: the model type's base
model (BertModel, GPT2Model) with the config's defaults for every key not given.
`arch.head: causal_lm` builds `AutoModelForCausalLM` instead (LlamaForCausalLM, Qwen2ForCausalLM):
the base model under `model.` (layers named as users know them, `model.layers.3.mlp.down_proj`)
plus `lm_head`, and the logits are the model's output. Nothing is
downloaded: no pretrained weights, no tokenizer, no hub config. Weights come from transformers' own
initialisers under `torch.manual_seed(seed)` (parity.models.build seeds before calling `build`), so
the same seed gives the same weights in every process.

- `use_cache` is forced off: a KV-cache object is not a tensor output, and parity compares one
  forward pass.
- Inputs are passed positionally, in the order of the model's `forward` parameters: BERT
  (input_ids, attention_mask, token_type_ids), GPT-2 (input_ids only: its second parameter is the
  cache), Llama and Qwen2 (input_ids, attention_mask; with input_ids alone the mask is causal).
- With `head: causal_lm` the output is the logits alone: `CausalLMOutputWithPast` with no labels
  (no loss) and no cache holds one tensor. A tied `lm_head` (Qwen2's `tie_word_embeddings`) is still
  its own leaf module, captured as `lm_head`.
- `kwargs.attn_implementation` (eager | sdpa) picks the attention kernel; transformers' default
  otherwise (sdpa).

A local checkpoint (`arch: {source: hf, path: <dir>, head: base|causal_lm}`): the folder Hugging Face's
`save_pretrained` writes (config.json; model.safetensors, or shards with model.safetensors.index.json;
weights stored in fp32, fp16 or bf16), loaded by transformers' own
`from_pretrained(path, local_files_only=True, dtype=float32)`: the model type comes from config.json,
nothing is downloaded, and weights stored in fp16/bf16 are cast to fp32 tensor by tensor as they are
read (the fp32 model is the one full copy). A key the model needs that the checkpoint lacks, or one of
another shape, is an error listing them (transformers would initialise it at random and only warn);
keys the checkpoint has beyond the model (a causal LM's `lm_head` loaded with `head: base`) are
dropped, as transformers does. `checkpoint_config` builds the same architecture from config.json alone
(no weights read: parity.pipeline.memsize sizes it on the meta device).

transformers imports torchvision when it is installed (its image utilities): on CPU torch that needs
parity.models.tv_compat's workaround first, so transformers is always imported through `load()`.
"""

from __future__ import annotations

from parity.models.tv_compat import import_torchvision

# config keys that are not PretrainedConfig fields: they go to from_config
FROM_CONFIG_KEYS = ("attn_implementation",)
# arch.head -> the transformers Auto class that builds it (parity.config.params.HF_HEADS lists the same keys:
# config validates at compose without importing this layer; tests/test_decoders.py keeps them equal)
HEADS = {"base": "AutoModel", "causal_lm": "AutoModelForCausalLM"}


def load():
    """The transformers module, imported after torchvision's CPU workaround."""
    try:
        import_torchvision()
    except ImportError:
        pass  # no torchvision installed: transformers does not need it
    import transformers  # lazy: only after tv_compat's torchvision workaround; +4.64 s (BENCHMARKS 22)

    return transformers


def build(name: str, kwargs: dict, head: str = "base"):
    """The model of type `name` with config `kwargs` (the base model, or with `head`), seeded by
    the caller."""
    _head(head)
    tf = load()
    kw = dict(kwargs)
    extra = {k: kw.pop(k) for k in FROM_CONFIG_KEYS if k in kw}
    try:
        cfg = tf.AutoConfig.for_model(name, **kw)
    except ValueError as e:  # unknown model type: transformers lists the valid ones
        raise ValueError(f"unknown Hugging Face model type '{name}': {str(e).splitlines()[0]}") from e
    default = type(cfg)()
    unknown = sorted(k for k in kw if not hasattr(default, k))
    if unknown:  # transformers keeps unknown keys as plain attributes: a typo would silently do nothing
        known = sorted(k for k in default.to_dict() if not k.startswith("_"))
        raise ValueError(f"unknown {type(cfg).__name__} key(s) {', '.join(unknown)} in arch.kwargs. "
                         f"Valid: {', '.join(known)}")
    cfg.use_cache = False
    model = getattr(tf, HEADS[head]).from_config(cfg, **extra)
    return model


def _head(head: str) -> str:
    if head not in HEADS:
        raise ValueError(f"unknown Hugging Face head '{head}'. Valid: {', '.join(sorted(HEADS))}")
    return HEADS[head]


def _extra(kwargs: dict | None) -> dict:
    """The from_config / from_pretrained keyword arguments a checkpoint model takes from arch.kwargs
    (attn_implementation; parity.config.params refuses other keys beside arch.path)."""
    return {k: v for k, v in (kwargs or {}).items() if k in FROM_CONFIG_KEYS}


def checkpoint_config(path: str, head: str = "base", kwargs: dict | None = None):
    """The architecture of the checkpoint in `path` from its config.json alone, cache off, no weights
    read (under `torch.device("meta")` nothing is allocated)."""
    tf = load()
    cls = _head(head)
    cfg = tf.AutoConfig.from_pretrained(path, local_files_only=True)
    cfg.use_cache = False
    return getattr(tf, cls).from_config(cfg, **_extra(kwargs))


def from_checkpoint(path: str, head: str = "base", kwargs: dict | None = None, use_cache: bool = False):
    """The checkpoint in `path` as a fp32 model with its trained weights (ValueError listing what
    does not fit); `use_cache` on for generation (parity.pipeline.generate)."""
    import torch  # lazy: torch +1.84 s (BENCHMARKS 22); parity.models is imported by ORT stages too

    tf = load()
    cls = getattr(tf, _head(head))
    from parity.models.weights import mismatch  # lazy: the checkpoint path only

    verbosity = tf.logging.get_verbosity()
    tf.logging.set_verbosity_error()  # its load report and progress bar: the error below says what matters
    tf.logging.disable_progress_bar()
    try:
        model, info = cls.from_pretrained(path, local_files_only=True, dtype=torch.float32, use_cache=use_cache,
                                          output_loading_info=True, **_extra(kwargs))
    except (OSError, ValueError, RuntimeError) as e:  # no weights file, an unknown model type, a bad shard
        msg = " ".join(str(e).split())
        raise ValueError(f"path: {path}: transformers cannot load it: {msg[:400]}") from None
    finally:
        tf.logging.set_verbosity(verbosity)
        tf.logging.enable_progress_bar()
    missing, shaped = sorted(info.get("missing_keys") or ()), list(info.get("mismatched_keys") or ())
    if missing or shaped:
        want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        got = {k: want[k] for k in want if k not in missing}
        for item in shaped:  # (key, checkpoint shape, model shape)
            key, ck = (item[0], tuple(item[1])) if isinstance(item, tuple) and len(item) == 3 else (str(item), ())
            got[key] = ck
        raise ValueError(mismatch(f"{path}", type(model).__name__, got, want).replace("weights: ", "path: ", 1))
    return model.eval()
