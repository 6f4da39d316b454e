"""PyTorch eager on a CUDA GPU: fp32 with TF32 off (`fp32`) and on (`tf32`) as separate precision
modes, fp16, bf16 (cast) and autocast (`amp_fp16`, `amp_bf16`). Same code as torch_cpu
(parity.backends.torch_cpu.TorchRunner) on `options.device`. Run on an NVIDIA H200 with torch 2.11
(mlp + resnet18, every mode): docs/gpu-verification.md."""

from __future__ import annotations

from parity.backends.torch_cpu import TorchRunner


def cuda_availability(device: str) -> str | None:
    """None if torch can run on `device` here, else why not. Imports torch (only torch cells call it)."""
    try:
        import torch  # optional: a missing torch is an UNAVAILABLE status
    except ImportError as e:
        return f"torch is not installed ({e})"
    if not torch.cuda.is_available():
        build = torch.version.cuda
        why = ("this torch is a CPU-only build (torch.version.cuda is None)" if build is None
               else f"torch {torch.__version__} (CUDA {build}) sees no GPU: torch.cuda.is_available() is False")
        return f"no CUDA device: {why}"
    idx = int(device.partition(":")[2] or 0)
    if idx >= torch.cuda.device_count():
        return f"{device} requested but torch sees {torch.cuda.device_count()} CUDA device(s)"
    return None


class TorchCudaRunner(TorchRunner):
    device = "cuda"
    options_schema = {"device": "torch_device"}

    @classmethod
    def availability(cls, job):
        return cuda_availability((job.provider_cfg.get("options") or {}).get("device", cls.device))
