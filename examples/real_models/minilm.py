"""A Hugging Face checkpoint folder loaded by the user's own code: the way to run a trained checkpoint
before parity had `arch: {source: hf, path: <dir>}` (issue 34). `transformers.AutoModel.from_pretrained`
on a local folder (config.json + model.safetensors); the real-model set's fallback for all-MiniLM-L6-v2.
"""

from __future__ import annotations


def from_folder(path: str):
    """The checkpoint's base model (BertModel for all-MiniLM-L6-v2), fp32, eval mode, eager attention."""
    # the venv's CUDA-built torchvision wheel fails to import on CPU, and transformers imports it:
    # parity's own workaround first (parity/models/tv_compat.py), as parity.models.hf does
    from parity.models.tv_compat import import_torchvision

    import_torchvision()
    from transformers import AutoModel

    return AutoModel.from_pretrained(path, attn_implementation="eager").float().eval()
