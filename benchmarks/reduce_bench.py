"""Reduction time for issue 10's acceptance case: a fault injected deep in resnet50's exported graph
(the ort_cpu diagnostic option `fault`, parity/backends/fault.py) reduced by reduce@resnet50-fp32-ort_cpu.

Builds a temp repo (tests.conftest.make_repo: resnet50, fp32, ort_cpu), runs the pipeline once with
analysis.reduce=true and the fault on the 5th-last Conv (layer4), then times the reduce stage's own
command (as dvc.yaml runs it) --runs times: whole-process wall time and the stage's in-process time
(artifacts/timing/reduce-<cell>.json). Then runs repro.py in a fresh venv holding only numpy and
onnxruntime (the project's pins): exit code on reduced.onnx (faulted) and on reduced.source.onnx.

    .venv/bin/python benchmarks/reduce_bench.py [--runs 5] [--venv /tmp/reprovenv] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy
import onnx
import onnxruntime

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import make_repo  # noqa: E402
CELL = "resnet50-fp32-ort_cpu"


def bare_venv(path: Path) -> str:
    if not (path / "bin/python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    subprocess.run([str(path / "bin/pip"), "install", "-q", f"numpy=={numpy.__version__}",
                    f"onnxruntime=={onnxruntime.__version__}"], check=True)
    return str(path / "bin/python")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--venv", default="/tmp/reprovenv")
    ap.add_argument("--json")
    a = ap.parse_args()

    load0 = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="parity-reduce-bench-"))
    r = make_repo(tmp / "repo", models=("resnet50",), dtypes=("fp32",), providers=("ort_cpu",))
    r.repro("export@resnet50")
    m = onnx.load(str(r.path / "artifacts/models/resnet50/model.onnx"))
    convs = [n.name for n in m.graph.node if n.op_type == "Conv"]
    target = convs[-5]
    t0 = time.perf_counter()
    r.exp_run("analysis.reduce=true", f"+providers.ort_cpu.options.fault={{node: {target}, scale: 1.05}}")
    pipeline_s = time.perf_counter() - t0
    red = json.loads((r.path / f"artifacts/reduce/{CELL}/reduce.json").read_text())
    cmd = [sys.executable, "-m", "stages.reduce", "--model", "resnet50", "--dtype", "fp32", "--provider", "ort_cpu",
           "--model-dir", "artifacts/models/resnet50", "--inputs", "artifacts/inputs/resnet50.parquet",
           "--diff", f"artifacts/diff/{CELL}", "--out", f"artifacts/reduce/{CELL}",
           "--timing", f"artifacts/timing/reduce-{CELL}.json"]
    wall, inproc = [], []
    for _ in range(a.runs):
        t = time.perf_counter()
        subprocess.run(cmd, cwd=r.path, check=True, capture_output=True)
        wall.append(time.perf_counter() - t)
        inproc.append(json.loads((r.path / f"artifacts/timing/reduce-{CELL}.json").read_text())["seconds"])
    py = bare_venv(Path(a.venv))
    cell = r.path / f"artifacts/reduce/{CELL}"
    rc = {name: subprocess.run([py, "repro.py", *([name] if name != "reduced.onnx" else [])], cwd=cell,
                               capture_output=True, text=True) for name in ("reduced.onnx", "reduced.source.onnx")}
    res = {
        "cell": CELL, "fault": {"node": target, "scale": 1.05}, "graph_nodes": red["graph_nodes"],
        "reduced_nodes": red["nodes"], "op_types": red["op_types"], "trials": red["trials"],
        "runs": a.runs, "stage_wall_s": [round(x, 2) for x in wall], "stage_wall_median_s": round(statistics.median(wall), 2),
        "reduce_inproc_median_s": round(statistics.median(inproc), 2),
        "first_pipeline_with_reduce_s": round(pipeline_s, 1),
        "repro_exit": {k: v.returncode for k, v in rc.items()},
        "repro_last_line": {k: v.stdout.strip().splitlines()[-1] if v.stdout.strip() else v.stderr[-200:]
                            for k, v in rc.items()},
        "bare_venv_packages": subprocess.run([py, "-m", "pip", "list", "--format=freeze"], capture_output=True,
                                             text=True).stdout.split(),
        "loadavg_before": load0, "loadavg_after": os.getloadavg(), "cpus": os.cpu_count(),
    }
    print(json.dumps(res, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
