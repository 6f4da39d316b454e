"""The floor for a cold per-layer validation of one model on ORT CPU: the least a single hand-written
script does for the same job, in one process, with no DVC, no Parquet, no stage processes.

  build the model (parity.models.build: the same seeded weights as the pipeline), seeded inputs,
  torch reference per layer (forward hooks on leaf modules, each output cloned), export to ONNX with
  every leaf call an output (the pipeline's exporter unless --exporter), ORT CPU on it, and a numpy
  diff per layer (max |a-b| and ||a-b|| / ||b||, float64).

benchmarks/bench.py (`--only cold`) times it as a whole process against `dvc repro -f diff@<cell>`.
Nothing is written except a temporary ONNX file. Run from the repository root:

    python benchmarks/floor.py [--params params.yaml] [--model resnet18] [--exporter dynamo|legacy]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import yaml

sys.path.insert(0, os.getcwd())  # the checkout being measured (parity.models: the model builder)

from parity.models import build  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--exporter", help="dynamo or legacy (default: export.exporter in --params)")
    a = ap.parse_args()
    t0 = time.perf_counter()

    p = yaml.safe_load(Path(a.params).read_text())
    m = p["models"][a.model]
    exporter = a.exporter or p.get("export", {}).get("exporter", "dynamo")
    opset = int(p.get("export", {}).get("opset", 18))
    n_samples = int(p.get("inputs", {}).get("samples", 1))
    spec = m["input"][0]
    model = build(m["arch"], p.get("seed", 0)).eval()
    xs = [np.random.default_rng([p.get("seed", 0), s, 0]).standard_normal(spec["shape"]).astype(np.float32)
          for s in range(n_samples)]
    t_import = time.perf_counter() - t0

    leaves = [(n, mod) for n, mod in model.named_modules() if n and next(mod.children(), None) is None]
    captured: list = []
    for _, mod in leaves:
        mod.register_forward_hook(lambda _m, _i, out: captured.append(out.clone()) if torch.is_tensor(out) else None)

    class Recorder(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            captured.clear()
            out = self.inner(x)
            return (out, *captured)

    rec = Recorder(model).eval()
    ref = []
    with torch.no_grad():
        for x in xs:
            ref.append([t.numpy() for t in rec(torch.from_numpy(x))])
    t_ref = time.perf_counter() - t0 - t_import

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "layers.onnx"
        kw = dict(dynamo=True, external_data=False, verbose=False) if exporter == "dynamo" else dict(dynamo=False)
        with torch.no_grad():
            torch.onnx.export(rec, (torch.from_numpy(xs[0]),), str(path), input_names=["input"],
                              opset_version=opset, **kw)
        t_export = time.perf_counter() - t0 - t_import - t_ref
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        got = [sess.run(None, {"input": x}) for x in xs]
    t_ort = time.perf_counter() - t0 - t_import - t_ref - t_export

    worst = 0.0
    for r_s, g_s in zip(ref, got):
        assert len(r_s) == len(g_s), (len(r_s), len(g_s))
        for r, g in zip(r_s, g_s):
            d = g.astype(np.float64) - r.astype(np.float64)
            rel = float(np.sqrt(np.add.reduce(d.ravel() ** 2) / max(np.add.reduce(r.astype(np.float64).ravel() ** 2), 1e-300)))
            worst = max(worst, rel)
    t_diff = time.perf_counter() - t0 - t_import - t_ref - t_export - t_ort
    print(f"floor: {a.model} {len(leaves)} leaf modules, {len(ref[0])} tensors x {n_samples} samples, exporter {exporter}; "
          f"worst rel_l2 {worst:.3g}; import+build {t_import:.2f}s, torch reference {t_ref:.2f}s, "
          f"export {t_export:.2f}s, ORT {t_ort:.2f}s, diff {t_diff:.2f}s")
    sys.stdout.flush()
    os._exit(0)  # as the pipeline's torch stages: no interpreter teardown after torch


if __name__ == "__main__":
    raise SystemExit(main())
