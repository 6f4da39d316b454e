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
    if head not in HEADS:
        raise ValueError(f"unknown Hugging Face head '{head}'. Valid: {', '.join(sorted(HEADS))}")
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
