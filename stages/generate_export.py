"""generate_export@model: a Hugging Face causal LM (models.<m>.arch, source hf) exported as one decode
step with an explicit KV cache (parity.pipeline.decoder): --out/decoder.onnx (input_ids,
attention_mask, position_ids, past.<i>.key/value -> logits, present.<i>.key/value; past may be empty:
the prefill), decoder_layers.onnx (the same plus every leaf module's output, for the drift origin)
and decoder.json (names, cache shape, leaf order). Only for models in `generate.models`.
"""

from __future__ import annotations

from pathlib import Path

from parity.config import params as config
from parity.core.io import exit_now
from parity.pipeline.generate import export_model


def main(argv=None) -> int:
    ap = config.stage_parser("stages.generate_export", __doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    p = config.load_or_die(a.params)

    info = export_model(p, a.model, Path(a.out))
    print(f"generate_export@{a.model}: {info['n_layers']} layers, cache [1, {info['kv_heads']}, past, "
          f"{info['head_dim']}], {len(info['layers'])} leaf outputs -> {a.out}/decoder.onnx")
    exit_now(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
