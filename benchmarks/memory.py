"""Peak memory, time and disk of one model's cells, stage by stage (issue 23's method).

For each model, in a scratch repository of its own (this checkout's project files copied, `git init`,
`dvc init`, the committed .dvc/config), the pipeline is composed for that model and the given dtypes
and providers (`parity compose -S ...`), the stage commands DVC would run are read from `dvc repro
--dry` (resolved, in order), and each one of that model's stages runs under `/usr/bin/time -v`
(peak RSS = "Maximum resident set size", wall = "Elapsed"). No DVC process wraps the commands, so the
figures are the stage's own. Then `dvc commit -f` stores the outputs in the cache as `cache.type`
says, and `du -sb artifacts .dvc/cache` (one du: a hard link is counted once) is the disk the cells
take.

Per model it also measures, in a separate process, one forward pass of the plain graph (model.onnx)
on onnxruntime CPU with default session options: the median of 5 runs after one warm-up, on sample 0
of the inputs. "cell / forward" is the first cell's stage wall times (env probe excluded) over it.
W = the exported graph's initializer bytes (fp32 weights; read without loading the data), SA = the
bytes of every layer's fp32 output for all samples (values in the reference's fp32.parquet).

    python benchmarks/memory.py --models mlp,resnet18 [--dtypes fp32] [--providers ort_cpu]
        [--workdir /tmp/parity-mem] [--json out.json] [--keep]

Nothing here asserts a timing; the load average is printed beside every model.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import onnx

from parity.core import store

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PROJECT = ["dvc.yaml", "env", "conf", "stages", "parity", "hydra_plugins", ".dvcignore", "data"]
FORWARD = r"""
import sys, time, statistics, numpy as np, onnxruntime as ort
sys.path.insert(0, ".")
from parity.pipeline.inputs import load  # noqa: E402
sess = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
feed = {i.name: np.array(load(sys.argv[2])[0][i.name]) for i in sess.get_inputs()}
sess.run(None, feed)
ts = []
for _ in range(5):
    t0 = time.perf_counter(); sess.run(None, feed); ts.append(time.perf_counter() - t0)
print(statistics.median(ts))
"""


def env() -> dict:
    e = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", DVC_NO_ANALYTICS="1",
             GIT_AUTHOR_NAME="bench", GIT_COMMITTER_NAME="bench", GIT_AUTHOR_EMAIL="b@b",
             GIT_COMMITTER_EMAIL="b@b")
    e.pop("PYTHONPATH", None)
    return e


def sh(cmd, cwd: Path, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=cwd, shell=isinstance(cmd, str), env=env(), text=True, capture_output=True)
    if check and p.returncode:
        raise SystemExit(f"failed ({p.returncode}): {cmd}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p


def scratch(work: Path, model: str, dtypes: list[str], providers: list[str]) -> Path:
    repo = work / model
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    for name in PROJECT:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, repo / name)
    (repo / ".gitignore").write_text("/artifacts/\n__pycache__/\n")
    sh("git init -q && dvc init -q && dvc config hydra.enabled true", repo)
    if (ROOT / ".dvc/config").exists():
        shutil.copy2(ROOT / ".dvc/config", repo / ".dvc/config")
    sh([f"{BIN}/parity", "compose", "-S", f"models=[{model}]", "-S", f"dtypes=[{','.join(dtypes)}]",
        "-S", f"providers=[{','.join(providers)}]"], repo)
    sh("git add -A && git commit -qm init", repo)
    return repo


KINDS = ("inputs", "export", "reference", "baseline", "engine", "capture", "diff")
LIST = """
import json
from dvc.repo import Repo
print(json.dumps([[s.addressing, s.cmd] for s in Repo(".").index.stages]))
"""


def stage_commands(repo: Path) -> list[tuple[str, str]]:
    """(stage, resolved command) of the cell stages, in pipeline order (DVC's own resolution of
    dvc.yaml; the env probe runs first through DVC, since the other stages depend on its outputs)."""
    sh([f"{BIN}/dvc", "repro", "-q", "env/dvc.yaml:env"], repo)
    stages = json.loads(sh([sys.executable, "-c", LIST], repo).stdout)
    by = [(n, c) for n, c in stages if n.split("@")[0] in KINDS]
    return sorted(by, key=lambda nc: KINDS.index(nc[0].split("@")[0]))


def timed(cmd: str, repo: Path) -> dict:
    p = subprocess.run(["/usr/bin/time", "-v", "bash", "-c", cmd], cwd=repo, env=env(), text=True,
                       capture_output=True)
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1)) * 1024
    h, m, s = ([0, 0] + re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)",
                                   p.stderr).group(1).split(":"))[-3:]
    wall = int(h) * 3600 + int(m) * 60 + float(s)
    return {"rc": p.returncode, "rss": rss, "wall": wall, "tail": (p.stdout + p.stderr).strip().splitlines()[-3:]}


def weight_bytes(model_dir: Path) -> int:
    m = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    n = 0
    for t in m.graph.initializer:
        size = 1
        for d in t.dims:
            size *= d
        n += size * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    return n


def sa_bytes(path: Path) -> int:
    sys.path.insert(0, str(ROOT))

    return sum(t.array.nbytes for t in store.read(path) if not store.is_output(t.name))


def du(repo: Path) -> int:
    out = sh(["du", "-sb", "artifacts", ".dvc/cache"], repo, check=False).stdout
    return sum(int(line.split()[0]) for line in out.splitlines() if line.strip())


def measure(work: Path, model: str, dtypes: list[str], providers: list[str], keep: bool) -> dict:
    repo = scratch(work, model, dtypes, providers)
    stages = {}
    load0 = os.getloadavg()
    for name, cmd in stage_commands(repo):
        if name.startswith(("report", "suite")):
            continue
        r = timed(cmd, repo)
        stages[name] = r
        print(f"  {name}: rc {r['rc']}, {r['wall']:.1f} s, peak RSS {r['rss'] / 2**30:.2f} GiB", flush=True)
        if r["rc"]:
            print("    " + "\n    ".join(r["tail"]), flush=True)
    sh([f"{BIN}/dvc", "commit", "-f", "-q"], repo, check=False)
    mdir = repo / "artifacts/models" / model
    fwd = float(sh([sys.executable, "-c", FORWARD, str(mdir / "model.onnx"),
                    str(repo / f"artifacts/inputs/{model}.parquet")], repo).stdout.strip())
    w, sa = weight_bytes(mdir), sa_bytes(repo / f"artifacts/reference/{model}/fp32.parquet")
    first = f"{model}-{dtypes[0]}-{providers[0]}"
    cell = [n for n in stages if n.split("@")[-1] in (model, f"{model}-{dtypes[0]}", first)]
    cell_s = sum(stages[n]["wall"] for n in cell)
    peak = max((stages[n]["rss"], n) for n in stages)
    res = {"model": model, "W": w, "SA": sa, "forward_s": fwd, "cell_s": cell_s, "cell_over_forward": cell_s / fwd,
           "peak_rss": peak[0], "peak_stage": peak[1], "peak_over_W": peak[0] / w, "disk": du(repo),
           "stages": stages, "load": [load0, os.getloadavg()]}
    print(f"{model}: W {w / 2**20:.1f} MiB, SA {sa / 2**20:.1f} MiB, cell {cell_s:.1f} s = {res['cell_over_forward']:.0f}x "
          f"forward ({fwd * 1e3:.1f} ms), peak {peak[0] / 2**30:.2f} GiB ({peak[1]}) = {res['peak_over_W']:.1f}x W, "
          f"disk {res['disk'] / 2**20:.0f} MiB = {res['disk'] / w:.2f} W, load {load0[0]:.1f}", flush=True)
    if not keep:
        shutil.rmtree(repo, ignore_errors=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", required=True)
    ap.add_argument("--dtypes", default="fp32")
    ap.add_argument("--providers", default="ort_cpu")
    ap.add_argument("--workdir", default="/tmp/parity-mem")
    ap.add_argument("--json")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    work = Path(a.workdir)
    results = []
    for model in a.models.split(","):
        print(f"{model}:", flush=True)
        t0 = time.perf_counter()
        results.append(measure(work, model, a.dtypes.split(","), a.providers.split(","), a.keep))
        results[-1]["total_s"] = time.perf_counter() - t0
    print("\n| model | W | SA | cell s | cell / ORT forward | peak RSS (stage) | peak / W | disk | disk / (2W + 4SA) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['model']} | {r['W'] / 2**20:.0f} MiB | {r['SA'] / 2**20:.0f} MiB | {r['cell_s']:.0f} | "
              f"{r['cell_over_forward']:.0f}x | {r['peak_rss'] / 2**30:.2f} GiB ({r['peak_stage'].split('@')[0]}) | "
              f"{r['peak_over_W']:.1f}x | {r['disk'] / 2**20:.0f} MiB | {r['disk'] / (2 * r['W'] + 4 * r['SA']):.2f} |")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
