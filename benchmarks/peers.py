"""parity against its peers on the small model, measured in the same loop (issue 23's last acceptance line).

Both comparisons time whole processes, interleaved A B A B after one warm-up pair; the ratio is
taken per pair (A_i / B_i) and its median reported with min-max; the load average (1/5/15 min) is
recorded before and after each comparison (helpers from benchmarks/bench.py). Nothing asserts a timing.

  capture  A: `dvc repro -f -s capture@<cell> diff@<cell>` (whole process, DVC included; DVC's log
           is checked: both stages ran, "Running stage", not restored from the run-cache).
           B: `polygraphy run <copy of artifacts/models/<model>/model.onnx + weights.bin> --onnxrt
           --onnxrt --onnx-outputs mark all` (a copy: onnx.load refuses external data behind DVC's
           cache links; two ORT runners compared on every tensor; polygraphy is pinned in parity's
           dev extra, so it is in this venv).
  cold     A: `dvc repro -f diff@<cell>` (forces every upstream stage: DVC's log is checked against
           the stages `dvc repro -f --dry` lists, each must have run).
           B: export-validator's documented pipeline (`make pipeline`: `cli export` then `cli compare`,
           two processes, timed together) for resnet18 on seeded random weights: its checkout is given
           by path (--export-validator) and installed once into a venv of its own (default
           <checkout>/.venv, its Makefile's; `pip install -e` with this venv's torch/torchvision
           versions), reused on later runs. It loads torchvision's pretrained weights, which these
           machines cannot download: a seeded random state dict is saved under the file name
           torchvision expects (read from the weights enum) in a private TORCH_HOME; its CLI runs
           unchanged behind a prelude that makes torchvision's CUDA-built PyPI wheel import on CPU
           torch (as parity/models/tv_compat.py does). Its C++
           comparator is not built, so `--backend auto` uses its Python comparator (byte-identical
           JSON by its own tests). Without --export-validator this comparison is skipped.

The scratch repo is a `git clone` of this checkout at --rev (default HEAD: commit what you want measured), composed
to the one cell (`parity compose -S 'models=[resnet18]' -S 'dtypes=[fp32]' -S 'providers=[ort_cpu]'`)
and run once (`dvc repro`) before timing. Everything lives in one temp folder, removed at the end
unless --keep. PATH starts with this interpreter's bin dir, so `python` in dvc.yaml is this venv's.

    python benchmarks/peers.py [--runs 5] [--only capture,cold] [--export-validator PATH]
                               [--ev-venv PATH] [--json OUT] [--keep] [--rev REV] [--repo PATH] [--tmp DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402 - the sibling benchmark's helpers: interleaved pairs, medians, load, versions

HERE = bench.HERE
MODEL, DTYPE, PROVIDER = "resnet18", "fp32", "ort_cpu"
CELL = f"{MODEL}-{DTYPE}-{PROVIDER}"
COMPOSE = ["-S", f"models=[{MODEL}]", "-S", f"dtypes=[{DTYPE}]", "-S", f"providers=[{PROVIDER}]"]
SEED = 0  # the random state dict given to export-validator
# torchvision 0.28's PyPI wheel is CUDA-built: on CPU torch `import torchvision` fails ("operator
# torchvision::nms does not exist", pytorch/vision#9085; parity/models/tv_compat.py). export-validator's
# code is run unchanged behind this prelude, which defines the two schemas when the import fails; its
# CLI imports torch and torchvision anyway, so the prelude costs nothing measurable.
TV_COMPAT = """\
import sys, torch
try:
    import torchvision
except RuntimeError as e:
    if "torchvision::" not in str(e):
        raise
    for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
        del sys.modules[k]
    _lib = torch.library.Library("torchvision", "FRAGMENT")
    for op in ("nms", "qnms"):
        _lib.define(op + "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import torchvision
"""
EV_CLI = TV_COMPAT + """\
import runpy
sys.argv[0] = "export_validator.cli"
runpy.run_module("export_validator.cli", run_name="__main__", alter_sys=True)
"""
WEIGHTS = TV_COMPAT + """\
from pathlib import Path
from torchvision.models import ResNet18_Weights
torch.manual_seed(int(sys.argv[2]))
url = ResNet18_Weights.DEFAULT.url
out = Path(sys.argv[1]) / "hub" / "checkpoints" / url.rsplit("/", 1)[-1]
out.parent.mkdir(parents=True, exist_ok=True)
torch.save(torchvision.models.resnet18().state_dict(), out)
print(out)
"""


def timed(cmd: list[str] | str, cwd: Path, env: dict | None = None, what: str = "") -> tuple[float, str]:
    """One whole process, wall time and output (stdout + stderr); a failure stops the benchmark with
    the command and the tail of its output."""
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env or bench.ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, shell=isinstance(cmd, str))
    dt = time.perf_counter() - t0
    if r.returncode:
        shown = cmd if isinstance(cmd, str) else " ".join(map(str, cmd))
        sys.exit(f"peers: {what or 'command'} failed (exit {r.returncode}): {shown}\n{r.stdout[-3000:]}")
    return dt, r.stdout


def ran(out: str) -> list[str]:
    """The stages DVC's log says it ran."""
    return re.findall(r"Running stage '([^']+)'", out)


def check_ran(out: str, expected: list[str], cmd: str) -> None:
    """Every expected stage ran (not skipped, not restored from the run-cache)."""
    missing = [s for s in expected if not bench.ran_stage(out, s)]
    if missing:
        sys.exit(f"peers: `{cmd}` did not run {', '.join(missing)} (ran: {ran(out)}):\n{out[-2000:]}")


def scratch_repo(repo: Path, rev: str) -> Path:
    """A clone of this checkout at `rev` (unless `repo` is one already) composed to the one cell,
    with every stage run once."""
    if not (repo / ".git").exists():
        print(f"peers: cloning {HERE} into {repo} at {rev}")
        timed(["git", "clone", "-q", "--no-checkout", str(HERE), str(repo)], repo.parent, what="git clone")
        timed(["git", "checkout", "-q", rev], repo, what=f"git checkout {rev} (a commit of {HERE})")
    else:
        print(f"peers: reusing {repo} (HEAD {head(repo, dirty_note=False)})")
    timed([str(Path(sys.executable).parent / "parity"), "compose", *COMPOSE], repo, what="parity compose")
    t, _ = timed(["dvc", "repro"], repo, what="first dvc repro of the scratch repo")
    print(f"peers: composed to {CELL}; first `dvc repro` took {t:.1f} s")
    return repo


def head(path: Path, dirty_note: bool = True) -> str:
    """The commit checked out at `path` (a note if tracked files differ from it)."""
    r = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if not dirty_note:
        return r.stdout.strip()
    dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return r.stdout.strip() + (" (uncommitted changes not measured)" if dirty else "")


def plain_onnx(repo: Path, work: Path) -> Path:
    """model.onnx and its weights.bin copied out of the workspace for Polygraphy: DVC links the workspace's
    files to its cache (cache.type hardlink,symlink) and onnx.load (onnx 1.23 here, which Polygraphy calls)
    refuses external data behind a hard or symbolic link ("potential hardlink attack"): a user runs
    `dvc unprotect artifacts/models/<model>` first, which makes the same copies in place."""
    src = repo / "artifacts" / "models" / MODEL
    if not (src / "model.onnx").is_file():
        sys.exit(f"peers: no {src / 'model.onnx'} after `dvc repro` (export@{MODEL}'s plain graph is expected there)")
    dst = work / "polygraphy-model"
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("model.onnx", "weights.bin"):
        shutil.copyfile(src / name, dst / name)
    return dst / "model.onnx"


def bench_capture(repo: Path, runs: int, work: Path) -> dict:
    stages = [f"capture@{CELL}", f"diff@{CELL}"]
    a_cmd = ["dvc", "repro", "-f", "-s", *stages]
    polygraphy = Path(sys.executable).parent / "polygraphy"
    if not polygraphy.exists():
        sys.exit(f"peers: no {polygraphy} (pip install -e '.[dev]' pins polygraphy)")
    b_cmd = [str(polygraphy), "run", str(plain_onnx(repo, work)), "--onnxrt", "--onnxrt", "--onnx-outputs", "mark", "all"]
    a_key, b_key = "parity: dvc repro -f -s capture diff", "polygraphy run --onnxrt --onnxrt, mark all"

    def side_a():
        t, out = timed(a_cmd, repo, what="side A")
        check_ran(out, stages, " ".join(a_cmd))
        return {a_key: t}

    def side_b():
        t, out = timed(b_cmd, repo, what="polygraphy")
        if "PASSED" not in out:
            sys.exit(f"peers: polygraphy did not report PASSED:\n{out[-2000:]}")
        return {b_key: t}

    res = bench.paired(runs, {"a": side_a, "b": side_b}, b_key)
    bench.table(f"1. {CELL} capture + diff through DVC vs Polygraphy's two-runner per-tensor run of the same "
                "model.onnx (s, whole processes; ratio = A / B per pair)", res, "s", "ratio")
    res["commands"] = {"A": " ".join(a_cmd), "B": " ".join(b_cmd)}
    print(f"  goal (issue 23): <= 1.5x; measured {res[a_key]['ratio']['median']:.2f}x")
    return res


def ev_venv(checkout: Path, venv: Path) -> Path:
    """export-validator installed in a venv of its own (created once, reused), same torch versions."""
    py = venv / "bin" / "python"
    if py.exists() and subprocess.run([str(py), "-c", "import export_validator, torch"],
                                      capture_output=True).returncode == 0:
        return py

    pins = [f"{d}=={version(d).split('+')[0]}" for d in ("torch", "torchvision")]
    print(f"peers: installing {checkout} into {venv} ({', '.join(pins)}; minutes, once)")
    timed(["python3.11", "-m", "venv", str(venv)], checkout, what="python3.11 -m venv")
    timed([str(py), "-m", "pip", "install", "-q", "-e", str(checkout), *pins], checkout,
          what="pip install export-validator")
    return py


def bench_cold(repo: Path, runs: int, checkout: Path, venv: Path, work: Path) -> dict:
    py = ev_venv(checkout, venv)
    home, out_dir = work / "torch-home", work / "ev-out"
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("EXPORT_VALIDATOR_BINARY", "PYTHONPATH")}
    env.update(TORCH_HOME=str(home), HF_HUB_OFFLINE="1")
    _, weights = timed([str(py), "-c", WEIGHTS, str(home), str(SEED)], work, env, "writing the random weights")
    print(f"peers: export-validator {head(checkout, dirty_note=False)} in {venv}; random weights (seed {SEED}) at {weights.strip()}")
    onnx, lmap, rep = out_dir / f"{MODEL}.onnx", out_dir / f"{MODEL}_layer_map.json", out_dir / f"{MODEL}_fp32"
    shim = work / "ev_cli.py"
    shim.write_text(EV_CLI)
    cli = f"{py} {shim}"
    b_cmd = (f"{cli} export --model {MODEL} --out {onnx} --layer-map {lmap} && "
             f"{cli} compare --model {MODEL} --onnx {onnx} --layer-map {lmap} --report-base {rep} "
             "--tolerance 1e-4 --backend auto")
    target = f"diff@{CELL}"
    a_cmd = ["dvc", "repro", "-f", target]
    expected = ran(timed([*a_cmd, "--dry"], repo, what="dvc repro --dry")[1])
    if target not in expected:
        sys.exit(f"peers: `dvc repro -f --dry {target}` lists no {target}: {expected}")
    a_key, b_key = "parity: dvc repro -f diff (cold cell)", "export-validator export + compare"
    last = {}

    def side_a():
        t, out = timed(a_cmd, repo, what="side A")
        check_ran(out, expected, " ".join(a_cmd))
        return {a_key: t}

    def side_b():
        t, out = timed(b_cmd, out_dir, env, "export-validator's pipeline")
        if "compared via" not in out:
            sys.exit(f"peers: export-validator printed no 'compared via' line:\n{out[-2000:]}")
        last["out"] = out.strip().splitlines()
        return {b_key: t}

    res = bench.paired(runs, {"a": side_a, "b": side_b}, b_key)
    bench.table(f"2. cold {CELL} ({len(expected)} stages forced) vs export-validator's pipeline on random "
                "weights (s, whole processes; ratio = A / B per pair)", res, "s", "ratio")
    res["commands"] = {"A": " ".join(a_cmd), "B": b_cmd, "stages_forced": expected}
    res["export_validator"] = {"commit": head(checkout, dirty_note=False), "last_output": last.get("out", [])}
    print(f"  export-validator said: {' | '.join(l for l in last.get('out', []) if 'compared via' in l)}")
    print(f"  goal (issue 23): <= 2x; measured {res[a_key]['ratio']['median']:.2f}x")
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="measured pairs after one warm-up pair")
    ap.add_argument("--only", default="capture,cold", help="comma-separated subset of capture,cold")
    ap.add_argument("--export-validator", type=Path, metavar="PATH", help="an export-validator checkout "
                    "(needed for `cold`; without it that comparison is skipped)")
    ap.add_argument("--ev-venv", type=Path, metavar="PATH", help="export-validator's venv (default "
                    "PATH/.venv; created and installed once if it cannot import export_validator)")
    ap.add_argument("--json", type=Path, help="also write every figure here")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder (repo, outputs) and print it")
    ap.add_argument("--rev", default="HEAD", help="the commit of this checkout measured (default: %(default)s)")
    ap.add_argument("--repo", type=Path, help="reuse this scratch clone (cloned here if missing; never removed) "
                    "instead of a fresh one in the scratch folder")
    ap.add_argument("--tmp", type=Path, help="where the scratch folder is made (default: the system temp dir)")
    a = ap.parse_args()
    only = [s.strip() for s in a.only.split(",") if s.strip()]
    if bad := [s for s in only if s not in ("capture", "cold")]:
        sys.exit(f"peers: --only: unknown {bad}; valid: capture, cold")
    if a.runs < 1:
        sys.exit("peers: --runs must be >= 1")
    if "cold" in only and a.export_validator is None:
        print("peers: no --export-validator PATH: the cold comparison is skipped")
        only.remove("cold")
    if a.repo and a.repo.resolve() == HERE:
        sys.exit("peers: --repo must be a scratch clone, not this checkout (the benchmark forces stages there)")
    if "cold" in only and not (a.export_validator / "src" / "export_validator" / "cli.py").is_file():
        sys.exit(f"peers: --export-validator {a.export_validator} is not an export-validator checkout "
                 "(no src/export_validator/cli.py)")
    if a.json:
        a.json = a.json.resolve()  # before anything changes directory
    work = Path(tempfile.mkdtemp(prefix="parity-peers-", dir=a.tmp))
    out = {"commit": head(HERE), "cell": CELL, "runs": a.runs, "versions": bench.versions()}
    print("peers: " + ", ".join(f"{k} {v}" for k, v in out["versions"].items()) +
          f"; {a.runs} pairs after 1 warm-up pair, interleaved; scratch {work}")
    try:
        bench.ENV["TMPDIR"] = str(work)
        repo = scratch_repo(a.repo.resolve() if a.repo else work / "repo", a.rev)
        out["commit"] = head(repo, dirty_note=False)  # the scratch clone: params.yaml composed
        if "capture" in only:
            out["capture"] = bench_capture(repo, a.runs, work)
        if "cold" in only:
            ck = a.export_validator.resolve()
            out["cold"] = bench_cold(repo, a.runs, ck, (a.ev_venv or ck / ".venv").resolve(), work)
    finally:
        if a.keep:
            print(f"peers: kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
        print(f"\npeers: figures written to {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
