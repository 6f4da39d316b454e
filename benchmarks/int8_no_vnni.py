"""INT8 on a CPU without VNNI: what ONNX Runtime computes there, measured on this machine (a numerics
measurement, not a timing; docs/providers.md "INT8 on CPUs without VNNI" quotes its output).

The runner-contract model of tests/test_backends.py (mlp 16-32-8, two seeded [4, 16] samples, four
calibration samples) is quantized by parity's own ort_int8 runner (OrtInt8Runner._convert) in each
setting below (`reduce_range: auto` resolved from a recorded /proc/cpuinfo in the first two), then
every quantized graph runs twice in a child process that imports only
onnxruntime and numpy: natively, and under `qemu-x86_64 -cpu Haswell` (user-mode emulation of an
AVX2/FMA CPU without AVX-512 or VNNI, so MLAS dispatches its AVX2 u8 x s8 kernels). Per setting it
prints the largest per-layer rel_l2 against the fp32 graph, native and emulated, and whether the two
runs gave the same bytes. Needs qemu-user (Debian: `apt-get install qemu-user`); without it only the
native column is printed.

    .venv/bin/python benchmarks/int8_no_vnni.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from parity.backends.runner import CaptureJob  # noqa: E402
from parity.backends.ort_int8 import OrtInt8Runner  # noqa: E402
from parity.core import store  # noqa: E402
from parity.models import build  # noqa: E402
from parity.pipeline.layer_export import export_layers  # noqa: E402

ARCH = {"source": "parity", "name": "mlp", "kwargs": {"in_features": 16, "hidden": 32, "out_features": 8}}
SETTINGS = [  # (dtype, options), on top of conf/providers/ort_int8.yaml's (reduce_range: auto)
    # auto, resolved from a recorded /proc/cpuinfo: the AVX2 one describes the emulated CPU truly, the
    # VNNI one is what a result from a VNNI machine would carry there
    ("int8_dynamic", {"cpuinfo": "cpuinfo-avx2.txt"}),
    ("int8_dynamic", {"cpuinfo": "cpuinfo-avx512-vnni.txt"}),
    ("int8_dynamic", {"reduce_range": False}),
    ("int8_dynamic", {"reduce_range": True}),
    ("int8_dynamic", {"reduce_range": False, "per_channel": True}),
    ("int8_dynamic", {"reduce_range": False, "weight_type": "QUInt8"}),
    ("int8_static", {"reduce_range": False}),
    ("int8_static", {"reduce_range": True}),
    ("int8_static", {"reduce_range": False, "activation_type": "QUInt8"}),
    ("int8_static", {"reduce_range": True, "activation_type": "QUInt8"}),
]

CHILD = r"""
import hashlib, json, sys
import numpy as np, onnxruntime as ort
d = sys.argv[1]
feeds = np.load(d + "/feeds.npy")
out = {}
for f in sorted(json.load(open(d + "/models.json"))):
    s = ort.InferenceSession(f"{d}/{f}", providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    runs = [s.run(None, {"input": x}) for x in feeds]
    np.savez(f"{d}/{f}.{sys.argv[2]}.npz", **{f"{k}:{n}": v for k, r in enumerate(runs) for n, v in zip(names, r)})
print("ok")
"""


def _export(d: Path, feeds, calib) -> None:
    export_layers(build(ARCH, 0), (torch.from_numpy(feeds[0]),), ["input"], d / "layers.onnx", "dynamo", 18)
    onnx.save(onnx.load(str(d / "layers.onnx")), str(d / "model.onnx"))
    store.write(d / "calibration.parquet", [store.Tensor(k, "input", 0, c) for k, c in enumerate(calib)])


def _quantize(d: Path) -> dict:
    prov = yaml.safe_load((ROOT / "conf/providers/ort_int8.yaml").read_text())["ort_int8"]
    models = {"fp32.onnx": "fp32"}
    shutil.copy2(d / "layers.onnx", d / "fp32.onnx")
    for k, (dtype, opts) in enumerate(SETTINGS):
        opts = dict(opts)
        os.environ["PARITY_CPUINFO"] = str(ROOT / "tests/data" / opts.pop("cpuinfo", "cpuinfo-avx2.txt"))
        cfg = {**prov, "options": {**prov["options"], **opts}}
        dcfg = yaml.safe_load((ROOT / f"conf/dtypes/{dtype}.yaml").read_text())[dtype]
        job = CaptureJob(model="m", model_cfg={}, dtype=dtype, dtype_cfg=dcfg, provider="ort_int8",
                         provider_cfg=cfg, model_dir=d, calibration=d / "calibration.parquet")
        r = OrtInt8Runner(job)
        r._prepare()
        (d / f"q{k}.onnx").write_bytes(r._convert(d / "layers.onnx"))
        shown = opts or {"reduce_range": f"auto->{str(r.settings_['reduce_range']).lower()} "
                                          f"({Path(os.environ['PARITY_CPUINFO']).name})"}
        models[f"q{k}.onnx"] = f"{dtype} " + " ".join(f"{a}={b}" for a, b in shown.items())
    (d / "models.json").write_text(json.dumps(models))
    return models


def _child(d: Path, tag: str, prefix: list[str]) -> bool:
    (d / "child.py").write_text(CHILD)
    p = subprocess.run([*prefix, sys.executable, str(d / "child.py"), str(d), tag], capture_output=True, text=True)
    if p.returncode != 0:
        print(f"{tag}: failed: {p.stderr[-2000:]}", file=sys.stderr)
    return p.returncode == 0


def _worst_rel(d: Path, f: str, tag: str) -> tuple[float, bytes]:
    ref, got = np.load(d / f"fp32.onnx.{tag}.npz"), np.load(d / f"{f}.{tag}.npz")
    worst = max(float(np.linalg.norm(got[k] - ref[k]) / np.linalg.norm(ref[k])) for k in ref.files)
    return worst, b"".join(got[k].tobytes() for k in sorted(got.files))


def main() -> int:
    feeds = np.stack([np.random.default_rng(k).standard_normal((4, 16)).astype(np.float32) for k in range(2)])
    calib = [np.random.default_rng(100 + k).standard_normal((4, 16)).astype(np.float32) for k in range(4)]
    with tempfile.TemporaryDirectory(prefix="parity-int8-vnni-") as t:
        d = Path(t)
        np.save(d / "feeds.npy", feeds)
        _export(d, feeds, calib)
        models = _quantize(d)
        _child(d, "native", [])
        qemu = shutil.which("qemu-x86_64")
        emulated = bool(qemu) and _child(d, "avx2", [qemu, "-cpu", "Haswell"])
        print(f"{'setting':64s} {'native':>8s} {'AVX2 (qemu Haswell)':>20s}  same bytes")
        for f, name in models.items():
            if f == "fp32.onnx":
                continue
            nat, nb = _worst_rel(d, f, "native")
            if emulated:
                emu, eb = _worst_rel(d, f, "avx2")
                print(f"{name:64s} {nat:8.4f} {emu:20.4f}  {'yes' if nb == eb else 'no'}")
            else:
                print(f"{name:64s} {nat:8.4f} {'(no qemu-x86_64)':>20s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
