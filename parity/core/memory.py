"""Know before you run out: a heavy stage's peak memory, estimated before it allocates, and measured
after it ran.

Estimate: peak RSS ~= a * W + b * SA + base, with W the model's fp32 weight bytes and SA the bytes of
every layer's fp32 output over all samples (`inputs.samples` x the per-sample sum). The per-stage
coefficients are the one table COEFFICIENTS below (fitted from measured peaks; change them there).
Each stage entry (stages/*.py) sizes its cell the cheapest way it can before it builds anything:
  torch models (export, reference, baseline): parity.pipeline.memsize (the model built on torch's `meta`
  device, no weight bytes allocated, and run once on meta inputs through the layer recorder);
  from artifacts (capture, baseline): the ONNX graph's initialisers (external data never loaded) and
  the reference's fp32.parquet value bytes (Parquet metadata, no values read).
When the estimate exceeds what is available (MemAvailable, and a cgroup v2 limit when one is set) the
stage prints ONE line (stage, cell, estimate with W and SA, what is available, how to lower it) and
exits non-zero before writing anything.

Knobs (environment):
  PARITY_MEMORY_CHECK=0            skip the check (you know the estimate is pessimistic for your model)
  PARITY_MEMORY_AVAILABLE=<bytes>  pretend only this much is available (a testing knob: makes a
                                   refusal deterministic)

Measured: record() writes the stage's peak RSS (its VmHWM and its waited-for children's ru_maxrss,
KiB) and its wall seconds since the process started (imports included: process_seconds),
with the estimate beside them, into the stage's timing file, apart from the values (a
non-deterministic measurement must never re-run a diff); the report shows it per stage per cell.
Light: stdlib only at import (onnx and pyarrow inside the functions that read those files); no
project module beyond parity.core.io, so the light diff stage can record its peak too.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

from parity.core.io import read_json, write_json

GiB = 1 << 30
# peak RSS ~= a * W + b * SA + base GiB (W: fp32 weight bytes; SA: every layer's fp32 outputs, all samples).
# Fitted on the streaming stages (issue 23, BENCHMARKS.md section 17): llama_1b (W 4.1 GiB, SA 0.61 GiB)
# measured export 4.92, reference 7.11, baseline 10.70 (fp32) / 8.17 (fp16), torch capture 10.73 GiB;
# resnet18 reference 0.71 GB. Before streaming: export 7.7 W, reference 2.65 W + 17.4 SA, baseline
# 0.9 W + 14.3 SA, capture 4.2 W + 13.9 SA.
# Refitted (issue 36 item 7: peak / estimate 1.20 export@resnet18, 1.23 capture@resnet18-fp32-torch_cpu with a
# base of 0.6 GiB): on this code, 2 cores, torch 2.13 CPU, each stage's VmHWM (and /usr/bin/time -v) in MiB:
# export (folding reference + baseline, sized like baseline) mlp 513 (W 18.0, SA 0.5), resnet18 993-1017
# (W 44.6, SA 57.1); capture mlp torch_cpu 342 / ort_cpu 180, resnet18 torch_cpu 974-1034 / ort_cpu 805.
# What a small model needs is the interpreter with torch, onnx and onnxruntime loaded (~0.5 GiB) plus the
# per-stage transients: the base is 1.0 GiB, so resnet18's estimate (1.21 GiB) is 1.20x its largest measured
# peak; llama_1b's estimates move by +0.4 GiB and stay above its peaks (tests/test_hardening.py test_36_7_memory_*).
COEFFICIENTS: dict[str, tuple[float, float, float]] = {
    "export": (1.3, 0.0, 1.0),
    "reference": (1.5, 2.0, 1.0),
    "baseline": (2.2, 2.0, 1.0),
    "capture": (2.2, 2.0, 1.0),
}
CHECK_ENV = "PARITY_MEMORY_CHECK"
AVAILABLE_ENV = "PARITY_MEMORY_AVAILABLE"
_CGROUP = Path("/sys/fs/cgroup")


def estimate(stage: str, w: int, sa: int) -> int:
    """The estimated peak RSS of `stage` in bytes for W = `w`, SA = `sa` (COEFFICIENTS)."""
    a, b, base = COEFFICIENTS[stage]
    return int(a * w + b * sa + base * GiB)


def available() -> tuple[int, str]:
    """(bytes available to a new allocation, where that figure comes from)."""
    forced = os.environ.get(AVAILABLE_ENV)
    if forced:
        return int(forced), AVAILABLE_ENV
    avail, src = _meminfo("MemAvailable"), "MemAvailable"
    limit = _read_int(_CGROUP / "memory.max")  # cgroup v2; "max" (no limit) reads as None
    if limit is not None:
        left = limit - (_read_int(_CGROUP / "memory.current") or 0)
        if avail is None or left < avail:
            avail, src = left, "cgroup memory.max - memory.current"
    return (avail if avail is not None else sys.maxsize), src


def _meminfo(key: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _gib(n: int | float) -> str:
    return f"{n / GiB:.2f} GiB"


def refusal(stage: str, cell: str, model: str, w: int, sa: int | None, samples: int | None,
            like: str | None = None) -> str | None:
    """The one line refusing `stage` of `cell` when its estimate (by the coefficients of stage `like`,
    default `stage`: a stage doing another's work too) exceeds what is available; None when it fits
    (or the check is off: PARITY_MEMORY_CHECK=0)."""
    if os.environ.get(CHECK_ENV, "1").strip() == "0":
        return None
    like = like or stage
    est, (avail, src) = estimate(like, w, sa or 0), available()
    if est <= avail:
        return None
    a, b, base = COEFFICIENTS[like]
    sa_txt = _gib(sa) if sa is not None else "unknown (not counted)"
    ways = [f"a smaller model (models.{model}.arch)"] if b == 0 else [
        f"fewer samples (inputs.samples{f'={samples}' if samples else ''})",
        f"a shorter sequence / smaller input shape (models.{model}.input)",
        "a lower precision dtype (dtypes)"]
    return (f"{stage}@{cell}: refused before allocating: estimated peak {_gib(est)} "
            f"(= {a:g} x W {_gib(w)} + {b:g} x SA {sa_txt} + {base:g} GiB; parity/core/memory.py) > {_gib(avail)} "
            f"available ({src}); lower it with {', '.join(ways)}, or set {CHECK_ENV}=0 to run anyway")


def guard(stage: str, cell: str, model: str, w: int | None, sa: int | None, samples: int | None,
          like: str | None = None) -> dict | None:
    """Print the refusal line to stderr and return None when the stage must not run; otherwise the
    estimate (for record()). W unknown (a model that cannot be sized): no check, estimate None.
    `like`: estimate by that stage's coefficients (refusal)."""
    if w is None:
        return {"w_bytes": None, "sa_bytes": sa, "estimate_bytes": None}
    line = refusal(stage, cell, model, w, sa, samples, like)
    if line:
        print(line, file=sys.stderr)
        return None
    return {"w_bytes": w, "sa_bytes": sa, "estimate_bytes": estimate(like or stage, w, sa or 0)}


# ---- sizing: W and SA without allocating them ----

def guard_graph(stage: str, cell: str, samples: int, model: str, graph: Path, values: Path | None) -> dict | None:
    """guard() for a stage that runs the exported graph (`samples`: inputs.samples): W from `graph`'s
    initialisers, SA from the reference's fp32 values (`values`, a store file)."""
    return guard(stage, cell, model, onnx_weight_bytes(graph), parquet_value_bytes(values) if values else None,
                 int(samples))


def onnx_weight_bytes(path: Path) -> int | None:
    """W of an exported graph: its initialisers' fp32 bytes, read without loading external data. A
    graph that embeds its weights (file over 64 MiB) is sized by the file instead: parsing it would
    allocate the weights before the check."""
    if not path.is_file():
        return None
    if path.stat().st_size > 64 << 20:
        return path.stat().st_size
    import onnx  # lazy: +0.23 s (BENCHMARKS 22); the diff and baseline stages import this module for Parquet sizes

    g = onnx.load(str(path), load_external_data=False).graph
    n = 0
    for t in g.initializer:
        k = 1
        for d in t.dims:
            k *= d
        n += k * 4
    return n


def parquet_value_bytes(path: Path) -> int | None:
    """SA from a store file (the reference's fp32.parquet): its value columns' uncompressed bytes,
    read from the Parquet footer (no values are read)."""
    if not path.is_file():
        return None
    # lazy: `stages.diff --help` loads no pyarrow (+0.15 s, BENCHMARKS 22; tests/test_light_stages.py)
    import pyarrow.parquet as pq

    md = pq.ParquetFile(path).metadata
    paths = [md.schema.column(c).path for c in range(md.num_columns)]
    cols = [c for c, name in enumerate(paths) if name in ("data", "f4.list.element", "f8.list.element")]
    if not cols:
        return None
    return sum(md.row_group(i).column(c).total_uncompressed_size for i in range(md.num_row_groups) for c in cols)


# ---- measured peak ----

def peak_rss_kib() -> dict:
    """This process's peak RSS and its waited-for children's (largest child), KiB. Its own from VmHWM in
    /proc/self/status (the high-water mark of this program's memory since exec): ru_maxrss keeps the
    RSS of the process it was forked from (a `dvc repro` or a pytest worker of hundreds of MiB) when
    that was larger. ru_maxrss where /proc has no VmHWM."""
    own = _vm_hwm_kib() or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"peak_rss_kib": max(own, kids), "self_rss_kib": own, "children_rss_kib": kids}


def _vm_hwm_kib() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def record(path: str | Path | None, stage: str, cell: str, t0: float, sized: dict | None = None,
           merge: bool = False) -> None:
    """Write the stage's peak RSS, wall time and estimate to its timing file `path` (atomically).
    `merge`: add them to the JSON object already there (capture's latency file)."""
    if not path:
        return

    path = Path(path)
    base = read_json(path) if merge and path.exists() else {}
    write_json(path, {**base, "stage": stage, "cell": base.get("cell", cell), **peak_rss_kib(),
                      "stage_s": round(process_seconds(t0), 3), **(sized or {})})


def process_seconds(t0: float) -> float:
    """Wall seconds since this process started (interpreter start-up and module imports included, as a
    user waits for them; Linux's /proc), else since `t0` (a time.perf_counter() taken in main)."""
    try:
        start = int(open("/proc/self/stat").read().rpartition(")")[2].split()[19])  # starttime, clock ticks
        uptime = float(open("/proc/uptime").read().split()[0])
        return max(uptime - start / os.sysconf("SC_CLK_TCK"), time.perf_counter() - t0)
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - t0
