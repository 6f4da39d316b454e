"""Backend fingerprints for the env stage. Cheap: package metadata and driver files, no heavy imports.

A fingerprint holds versions and device identity, never timestamps, so an unchanged machine writes
byte-identical files and DVC re-runs nothing downstream. Each cell depends only on the fingerprint
of its provider (built from the provider's `uses:` list), each shared stage on its own
(STAGE_USES), so a driver bump re-runs only the cells that use the driver.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import os
import platform
import re
from pathlib import Path

# What the shared stages' results depend on (besides their inputs and params). `cpu`: the reference
# runs oneDNN/MKL/ATen kernels picked by the CPU's ISA, and the export's seeded weights come from
# ATen's `normal_`, whose AVX2 kernel draws other values than its default one (measured: the ONNX
# bytes change with ATEN_CPU_CAPABILITY; docs/sharing.md).
STAGE_USES = {
    "inputs": ["numpy"],
    "export": ["torch", "onnx", "cpu"],
    "reference": ["torch", "cpu"],
}

# Where `cpu` reads the CPU from; a test points PARITY_CPUINFO at a recorded copy.
CPUINFO = "/proc/cpuinfo"
CPUINFO_ENV = "PARITY_CPUINFO"
# Where `cuda` reads the NVIDIA driver from (its `version` file and `gpus/*/information`); the GPU check
# (scripts/gpu-check.sh) points PARITY_NVIDIA_PROC at an edited copy to rehearse a driver bump.
NVIDIA_ENV = "PARITY_NVIDIA_PROC"
# Feature flags (as /proc/cpuinfo names them) that select CPU kernels: oneDNN and MKL (torch),
# ATen's own dispatch (default/avx2/avx512), ONNX Runtime's MLAS (fp32 GEMM/conv, fp16, and the u8s8
# int8 GEMMs, which saturate without VNNI). x86 first, then aarch64 (`Features:` line).
ISA_FLAGS = (
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c",
    "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
    "avx512_fp16", "avx_vnni", "avx_vnni_int8", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16",
    "asimd", "asimdhp", "asimddp", "fphp", "bf16", "i8mm", "sve", "sve2", "sme",
)
# Environment variables that change which CPU kernels run (and so the numbers). Those measured to
# change bytes here are in docs/sharing.md; the rest are documented numerics switches of the same
# libraries (oneDNN's old name, fp32 math mode, MKL's reproducibility mode).
CPU_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY",
           "ONEDNN_DEFAULT_FPMATH_MODE", "MKL_CBWR")
# Identity fields of the first processor block (x86 names; aarch64 names after them). Never
# MHz, bogomips, microcode or per-core ids: they vary between runs or cores of one machine.
_CPU_FIELDS = {"vendor_id": "vendor", "model name": "model_name", "cpu family": "family",
               "model": "model", "stepping": "stepping",
               "CPU implementer": "implementer", "CPU part": "part", "CPU variant": "variant",
               "CPU architecture": "architecture"}


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
    root = Path(os.environ.get(NVIDIA_ENV) or "/proc/driver/nvidia")
    drv = root / "version"
    if not drv.exists():
        return {"available": False, "reason": f"no NVIDIA driver ({drv} is missing)"}
    m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", drv.read_text())
    gpus = []
    for info in sorted((root / "gpus").glob("*/information")):
        mm = re.search(r"^Model:\s*(.+)$", info.read_text(), re.M)
        if mm:
            gpus.append(mm.group(1).strip())
    return {"available": True, "driver": m.group(1) if m else "unknown", "gpus": gpus}


def cpu_identity(cpuinfo_path: str | Path | None = None) -> dict:
    """The CPU identity a CPU kernel's numbers depend on: vendor, model, the kernel-selecting ISA
    flags present (ISA_FLAGS order), and the CPU_ENV masking variables that are set. Reads
    `cpuinfo_path`, else $PARITY_CPUINFO, else /proc/cpuinfo (first processor block)."""
    path = Path(cpuinfo_path or os.environ.get(CPUINFO_ENV) or CPUINFO)
    try:
        text = path.read_text()
    except OSError as e:
        return {"available": False, "reason": f"cannot read {path}: {e.strerror}"}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields.get("processor") is not None and len(fields) > 1:
                break  # end of the first processor block
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    ident = {out: fields[k] for k, out in _CPU_FIELDS.items() if fields.get(k)}
    present = set((fields.get("flags") or fields.get("Features") or "").split())
    ident["isa"] = [f for f in ISA_FLAGS if f in present]
    ident["env"] = {k: os.environ[k] for k in CPU_ENV if os.environ.get(k)}
    return ident


# x86 flags whose presence gives ONNX Runtime (MLAS) integer dot-product kernels for u8 x s8 GEMMs:
# AVX-512 VNNI, AVX-VNNI (AVX2-class CPUs), AMX-INT8. Without one of them MLAS uses vpmaddubsw, which
# adds pairs of u8 x s8 products in int16 with saturation: 2 x 255 x 127 = 64770 > 32767, so
# full-range int8 weights can saturate, 7-bit ones (reduce_range) cannot (2 x 255 x 63 = 32130).
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
# The flags shown beside them: which u8 x s8 kernel family runs (MLAS dispatch order, best first).
INT8_KERNEL_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni", "avx512bw", "avx512f", "avx2", "sse4_1")
_X86_MARKERS = ("sse4_1", "avx", "avx2", "avx512f")


def int8_kernels(ident: dict | None = None) -> dict:
    """What selects ONNX Runtime's int8 CPU kernels on this CPU (from cpu_identity(), the same one
    function and $PARITY_CPUINFO fixture as the fingerprint): `vnni` true/false on x86, None where
    that question does not arise (aarch64, whose int8 kernels widen instead of saturating) or the
    CPU could not be read; `flags`: the INT8_KERNEL_FLAGS present; `reason` when unknown."""
    ident = cpu_identity() if ident is None else ident
    if ident.get("available") is False:
        return {"vnni": None, "flags": [], "reason": ident.get("reason", "CPU unknown")}
    isa = set(ident.get("isa") or [])
    flags = [f for f in INT8_KERNEL_FLAGS if f in isa]
    if not isa & set(_X86_MARKERS):
        return {"vnni": None, "flags": flags, "reason": "not an x86 CPU with SSE4.1 or later"}
    return {"vnni": bool(isa & set(VNNI_FLAGS)), "flags": flags}


def _torch() -> dict:
    v = _versions("torch", "torchvision")
    if v.get("torch"):
        v["torch_cuda"] = _torch_build_cuda()
    return v or {"available": False, "reason": "torch is not installed"}


def distributions(*dists: str, label: str | None = None):
    """A probe: the installed versions of these distributions (a library's fingerprint)."""
    def probe() -> dict:
        return _versions(*dists) or {"available": False, "reason": f"{label or dists[0]} is not installed"}

    return probe


# The built-in components (config.COMPONENTS names the same, for compose-time checks without this
# module). A backend that needs another one declares it on its runner (Runner.fingerprint_components:
# {name: (distribution, ...)}), so adding a library edits no file here.
PROBES = {
    "numpy": lambda: _versions("numpy"),
    "torch": _torch,
    "onnx": lambda: _versions("onnx", "onnxscript", "onnx-ir"),
    "onnxruntime": distributions("onnxruntime", "onnxruntime-gpu"),
    "cuda": _cuda,
    "cpu": cpu_identity,
    "tensorrt": distributions("tensorrt", "tensorrt-cu12", "tensorrt-cu13", "tensorrt_libs", label="TensorRT"),
}


def component(name: str, declared: dict | None = None) -> dict:
    """The fingerprint of a built-in component, or of one a runner declares ({name: distributions})."""
    if name in PROBES:
        return PROBES[name]()
    if declared and name in declared:
        return distributions(*declared[name])()
    raise KeyError(name)


def collect(components, declared: dict | None = None) -> dict:
    return {c: component(c, declared) for c in sorted(set(components))}


# Set only by `parity repro --cluster` (parity/commands/cluster.py) on the dvc processes it starts, so a run
# off a cluster writes the same bytes as before. NODE: JSON {hostname, ray_node_id} of the node that
# runs the cell. UNAVAILABLE: JSON {provider: reason} for providers no node of the cluster advertises.
CLUSTER_NODE_ENV = "PARITY_CLUSTER_NODE"
CLUSTER_UNAVAILABLE_ENV = "PARITY_CLUSTER_UNAVAILABLE"


def cluster_unavailable(provider: str) -> str | None:
    """Why no node of the cluster can run `provider` (the env probe writes it into provider-<name>.json,
    so such a cell is cached apart from real runs; the capture reports it as UNAVAILABLE), or None."""
    return json.loads(os.environ.get(CLUSTER_UNAVAILABLE_ENV) or "{}").get(provider)


def cluster_node(uses, declared: dict | None = None) -> dict | None:
    """The node a cluster cell runs on, for its status.json: hostname, Ray node id and this node's
    fingerprint of the components the provider uses. None off a cluster."""
    raw = os.environ.get(CLUSTER_NODE_ENV)
    return {**json.loads(raw), "fingerprint": collect(uses, declared)} if raw else None


# Thread-count variables of the libraries the backends run on (OpenMP, MKL, OpenBLAS).
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def host(os_release: str | Path = "/etc/os-release") -> dict:
    """The machine as a reader of the report wants it: OS, kernel, Python, logical CPUs and the ones
    this process may use, thread-count variables that are set. Not a fingerprint component (no stage
    depends on it: only the report shows it), but as stable: no load, clock or free memory."""
    try:
        rel = dict(line.split("=", 1) for line in Path(os_release).read_text().splitlines() if "=" in line)
    except OSError:
        rel = {}
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"os": rel.get("PRETTY_NAME", "").strip('"') or platform.system(),
            "kernel": f"{platform.system()} {platform.release()} {platform.machine()}",
            "python": platform.python_version(), "cpus_logical": os.cpu_count(), "cpus_usable": usable,
            "thread_env": {k: os.environ[k] for k in THREAD_ENV if os.environ.get(k)}}
