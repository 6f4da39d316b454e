"""Pipeline-speed benchmarks (issue 13 items 1, 2, 4): medians of interleaved whole-process runs.

  noop     no-op `dvc repro` vs `dvc status` in each --repo (after a full run there), interleaved
           repo by repo (status, repro, status, repro, ...), one warm-up round discarded. Ratio per
           round (repro_i / status_i of the same repo), then the median. Also says whether dvc.lock
           changed (its sha256 before and after the runs).
  capture  `python -m stages.capture` of one cell (command line as dvc.yaml writes it, outputs to a
           temp dir) in each --repo with its own code and params (capture.latency per --latency;
           code that predates the key always times), interleaved; ratio second repo / first.
  store    in process: parity.core.store.write vs the earlier write (each tensor's bytes copied into a
           Python `bytes`, then again into Arrow's column) of the same tensors: --parquet's tensors
           if given, else 2 x 60 float32 tensors of resnet18's layer sizes. Page cache, tmpfs-like.
  export   `python -m stages.export` + `python -m stages.reference` of one model (two processes, as
           the pipeline runs them) with export.exporter dynamo vs legacy, outputs to a temp dir.

The load average is recorded before and after. Nothing here asserts a timing.

    python benchmarks/bench_pipe.py noop --repo /tmp/a --repo /tmp/b [--runs 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from parity.core import store

ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def sh(cmd: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    dt = time.perf_counter() - t0
    if r.returncode:
        sys.exit(f"bench_pipe: {' '.join(cmd)} in {cwd} failed ({r.returncode}):\n{r.stdout[-3000:]}")
    return dt


def med(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3),
            "runs": [round(x, 3) for x in xs]}


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()[:16] if p.exists() else "-"


def noop(repos: list[Path], runs: int) -> dict:
    res = {str(r): {"status": [], "repro": [], "ratio": [], "lock_before": sha(r / "dvc.lock")} for r in repos}
    for i in range(runs + 1):
        for r in repos:
            s = sh(["dvc", "status"], r)
            p = sh(["dvc", "repro"], r)
            if i:  # round 0 warms the page cache and DVC's state db
                d = res[str(r)]
                d["status"].append(s)
                d["repro"].append(p)
                d["ratio"].append(p / s)
    for r in repos:
        d = res[str(r)]
        d["lock_after"] = sha(r / "dvc.lock")
        for k in ("status", "repro", "ratio"):
            d[k] = med(d[k])
    return res


def capture(repos: list[Path], runs: int, cell: str, latency: str, params_files: list[Path] | None) -> dict:
    """One cell's capture process per repo (its own code and params.yaml, or the --params file given
    for it; capture.latency set to `latency`: on/off; code without the key always times),
    interleaved repo by repo."""
    model, dtype, provider = cell.split("-")
    res: dict = {}
    for i in range(runs + 1):
        for j, r in enumerate(repos):
            with tempfile.TemporaryDirectory() as d:
                params = Path(d) / "params.yaml"
                text = (params_files[j] if params_files else r / "params.yaml").read_text()
                text = text.replace("latency: false", "latency: true") if latency == "on" else text
                params.write_text(text)
                t = sh(["python", "-m", "stages.capture", "--params", str(params), "--model", model,
                        "--dtype", dtype, "--provider", provider, "--model-dir", f"artifacts/models/{model}",
                        "--inputs", f"artifacts/inputs/{model}.parquet",
                        "--calibration", f"artifacts/inputs/{model}.calibration.parquet",
                        "--reference", f"artifacts/reference/{model}/fp64.parquet",
                        "--out", f"{d}/cap", "--timing", f"{d}/t.json"], r)
            if i:
                res.setdefault(str(r), []).append(t)
    out = {k: med(v) for k, v in res.items()}
    if len(repos) == 2:
        a, b = (res[str(r)] for r in repos)
        out["ratio_second_to_first"] = med([y / x for x, y in zip(a, b)])
    return out


def export(repo: Path, runs: int, model: str) -> dict:
    """stages.export of `model` with each exporter (the repo's params.yaml, export.exporter swapped;
    dynamo's opset is kept, legacy's is the same number), interleaved; plus what each one's
    layers.json holds (layer outputs, `regions`: the ops between leaves, from node metadata)."""
    res: dict = {}
    info: dict = {}
    for i in range(runs + 1):
        for exporter in ("dynamo", "legacy"):
            with tempfile.TemporaryDirectory() as d:
                params = Path(d) / "params.yaml"
                text = (repo / "params.yaml").read_text()
                params.write_text(text.replace("exporter: dynamo", f"exporter: {exporter}"))
                t = sh(["python", "-m", "stages.export", "--params", str(params), "--model", model,
                        "--out", f"{d}/m"], repo)
                lj = json.loads((Path(d) / "m" / "layers.json").read_text())
                info[exporter] = {"layer_outputs": len(lj["layers"]), "regions": len(lj.get("regions") or {}),
                                  "onnx_bytes": (Path(d) / "m" / "model.onnx").stat().st_size}
            if i:
                res.setdefault(exporter, []).append(t)
    out = {k: med(v) for k, v in res.items()}
    out["ratio_legacy_to_dynamo"] = med([b / a for a, b in zip(res["dynamo"], res["legacy"])])
    out["layers_json"] = info
    return out


def _copying_write(path, tensors, metadata):
    """store.write before this change (two copies per tensor), for the comparison."""
    cols = {k: [] for k in store.SCHEMA.names}
    for t in tensors:
        a = np.ascontiguousarray(t.array)
        for k, v in zip(store.SCHEMA.names, (t.sample, t.name, t.order, a.dtype.str.lstrip("<|="),
                                             list(a.shape), a.tobytes())):
            cols[k].append(v)
    pq.write_table(pa.table(cols, schema=store.SCHEMA.with_metadata(metadata)), path, compression="none",
                   use_dictionary=False, write_statistics=False, store_schema=True)


def store_bench(runs: int, parquet: Path | None) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

    if parquet:
        ts = [store.Tensor(t.sample, t.name, t.order, np.array(t.array)) for t in store.read(parquet)]
    else:
        rng = np.random.default_rng(0)
        shapes = [(1, 64, 112, 112)] * 4 + [(1, 64, 56, 56)] * 20 + [(1, 128, 28, 28)] * 14 + \
                 [(1, 256, 14, 14)] * 12 + [(1, 512, 7, 7)] * 9 + [(1, 1000)]
        ts = [store.Tensor(s, f"l{i}", i, rng.standard_normal(sh, dtype=np.float32))
              for s in range(2) for i, sh in enumerate(shapes)]
    mb = sum(t.array.nbytes for t in ts) / 1e6
    res: dict = {"new": [], "copying": []}
    with tempfile.TemporaryDirectory() as d:
        for i in range(runs + 1):
            for side in ("copying", "new"):
                t0 = time.perf_counter()
                (store.write if side == "new" else _copying_write)(Path(d) / f"{side}.parquet", ts, {})
                if i:
                    res[side].append(time.perf_counter() - t0)
        same = (Path(d) / "new.parquet").read_bytes() == (Path(d) / "copying.parquet").read_bytes()
    out = {k: med(v) for k, v in res.items()}
    out["ratio_new_to_copying"] = med([b / a for a, b in zip(res["copying"], res["new"])])
    out["MB"] = round(mb, 1)
    out["same_bytes"] = same
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["noop", "capture", "export", "store"])
    ap.add_argument("--repo", action="append", type=Path, default=[])
    ap.add_argument("--parquet", type=Path, help="store: a tensor file to write again")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cell", default="resnet18-fp32-ort_cpu")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--latency", choices=["on", "off"], default="off", help="capture: capture.latency")
    ap.add_argument("--params", action="append", type=Path, help="capture: a params file per --repo")
    ap.add_argument("--json")
    a = ap.parse_args()
    load0 = os.getloadavg()
    if a.what == "noop":
        out = noop(a.repo, a.runs)
    elif a.what == "store":
        out = store_bench(a.runs, a.parquet)
    elif a.what == "capture":
        out = capture(a.repo, a.runs, a.cell, a.latency, a.params)
    else:
        out = export(a.repo[0], a.runs, a.model)
    out = {"what": a.what, "runs": a.runs, "loadavg_before": load0, "loadavg_after": os.getloadavg(),
           "results": out}
    text = json.dumps(out, indent=2)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
