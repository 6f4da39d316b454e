"""Backend fingerprints for the env stage. Cheap: package metadata and driver files, no heavy imports.

A fingerprint holds versions and device identity, never timestamps, so an unchanged machine writes
byte-identical files and DVC re-runs nothing downstream. Each cell depends only on the fingerprint
of its provider (built from the provider's `uses:` list), each shared stage on its own
(STAGE_USES), so a driver bump re-runs only the cells that use the driver.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import re
from pathlib import Path

# What the shared stages' results depend on (besides their inputs and params).
STAGE_USES = {
    "inputs": ["numpy"],
    "export": ["torch", "onnx"],
    "reference": ["torch"],
}


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _versions(*dists: str) -> dict:
    return {d: _version(d) for d in dists if _version(d) is not None}


def _torch_build_cuda() -> str | None:
    """torch.version.cuda without importing torch (read torch/version.py)."""
    spec = importlib.util.find_spec("torch")
    if not spec or not spec.submodule_search_locations:
        return None
    f = Path(list(spec.submodule_search_locations)[0]) / "version.py"
    if not f.exists():
        return None
    m = re.search(r"^cuda\s*(?::\s*\S+)?\s*=\s*['\"]([^'\"]+)['\"]", f.read_text(), re.M)
    return m.group(1) if m else None


def _cuda() -> dict:
    drv = Path("/proc/driver/nvidia/version")
    if not drv.exists():
        return {"available": False, "reason": "no NVIDIA driver (/proc/driver/nvidia/version is missing)"}
    m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", drv.read_text())
    gpus = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        mm = re.search(r"^Model:\s*(.+)$", info.read_text(), re.M)
        if mm:
            gpus.append(mm.group(1).strip())
    return {"available": True, "driver": m.group(1) if m else "unknown", "gpus": gpus}


def component(name: str) -> dict:
    if name == "numpy":
        return _versions("numpy")
    if name == "torch":
        v = _versions("torch", "torchvision")
        if v.get("torch"):
            v["torch_cuda"] = _torch_build_cuda()
        return v or {"available": False, "reason": "torch is not installed"}
    if name == "onnx":
        return _versions("onnx", "onnxscript", "onnx-ir")
    if name == "onnxruntime":
        v = _versions("onnxruntime", "onnxruntime-gpu")
        return v or {"available": False, "reason": "onnxruntime is not installed"}
    if name == "cuda":
        return _cuda()
    if name == "tensorrt":
        v = {d: _version(d) for d in ("tensorrt", "tensorrt-cu12", "tensorrt-cu13", "tensorrt_libs")
             if _version(d)}
        return v or {"available": False, "reason": "TensorRT is not installed"}
    raise KeyError(name)


def collect(components) -> dict:
    return {c: component(c) for c in sorted(set(components))}
