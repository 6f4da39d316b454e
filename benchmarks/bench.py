"""parity benchmarks: medians over several runs, with ratios against a baseline measured in the same run.

Every benchmark interleaves its two sides (A B A B ...) after one warm-up pair, so machine drift hits
both alike; a ratio is computed per pair (A_i / B_i) and its median reported. Whole processes are
timed with time.perf_counter around subprocess.run. Nothing here asserts a timing.

  dvc      no-op `dvc repro` vs `dvc status`, on a repo after a full run.
  capture  per-layer capture + diff of resnet18 fp32 on ort_cpu: the two stage processes with the
           command lines DVC runs (read from dvc.yaml through DVC, whatever they are on the checkout
           measured; run in place, outputs restored with `dvc checkout` at the end) vs Polygraphy's
           per-layer run of the same plain ONNX (`polygraphy run model.onnx --onnxrt --onnx-outputs
           mark all --save-outputs`, pinned in the dev extra) and a plain onnxruntime inference of
           it as one process. Ratios against Polygraphy.
  store    in process: parity.core.store write/read of the real resnet18 reference tensors (~60 layers x
           2 samples) vs np.savez (uncompressed .npz) / np.load of the same arrays. Throughput in
           MB/s (1 MB = 1e6 bytes of tensor data); "touch" reads one element per tensor, "sum" runs
           np.sum over every tensor (forces a full read). Files sit in the page cache (warm reads).
  cold     `dvc repro -f diff@resnet18-fp32-ort_cpu` (forces every upstream stage; includes DVC
           caching the outputs) vs benchmarks/floor.py (one process: the same seeded model, torch
           forward hooks, ONNX export with every layer an output, ORT, a numpy diff; no DVC), and
           the re-run after a real tolerance change: each run sets dtypes.fp32.tol.atol in
           params.yaml to a value never used before (a counter from the clock), so DVC's run-cache
           cannot restore it, and the script checks DVC's log that diff@<cell> ran ("Running
           stage", not "is cached - skipping run"). params.yaml is restored and the cell re-synced
           at the end.
  diff     in process: parity.core.compare.compare_layer over every layer of the cell (capture vs fp32
           reference, as the diff stage pairs them) vs one numpy pass (np.add.reduce) over the same
           arrays, in GB/s of compared bytes (both float32 arrays); and the diff stage as a whole
           process (command from dvc.yaml), so compare_layer's share of the stage is known.
  help     `python -m stages.<s> --help` of the light stages (env, inputs, diff, report) vs a bare
           `python -c pass`.
  parallel every cell of the default config (8: mlp + resnet18 x fp32, fp16 x torch_cpu, ort_cpu)
           re-run by a sequential `dvc repro` vs `python -m parity.commands.parallel -j 2` (what
           `parity repro -j 2` runs). Each run first sets capture.warmup and diff.max_mismatch in
           params.yaml to new values and empties DVC's run-cache (.dvc/cache/runs, so nothing is
           restored): every capture and diff re-runs, plus env and the report; upstream does not.
           params.yaml is restored and the pipeline re-synced at the end.
  oracle   diff of resnet18 fp32 ort_cpu in oracle mode (vs fp64 relative to the baseline), with and
           without each layer's own error, vs the tolerance-only diff (today's diff) on the same
           capture; and the capture stage with own error (--reference) vs without.

Every benchmark records the load average (1/5/15 min) before and after it: absolute seconds move
2-3x with load on a shared machine; same-run ratios much less.

The benchmarks run in a scratch clone (default /tmp/parity-bench, a `git clone` of this checkout's
HEAD, reused if present) so this checkout's artifacts are never touched; if the clone has no
artifacts yet, a full `dvc repro` runs there first. PATH starts with this interpreter's bin dir, so
`python` in dvc.yaml commands is the same (virtualenv) python.

    python benchmarks/bench.py [--repo PATH] [--runs 5] [--only dvc,capture,cold,diff,help,...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import yaml
from dvc.repo import Repo

from parity.core import compare, store

HERE = Path(__file__).resolve().parent.parent
CELL = "resnet18-fp32-ort_cpu"
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
BASELINE_ORT = (  # one plain inference of MODEL_ONNX on a random input of the model's input shape
    "import numpy as np, onnxruntime as ort; "
    "s = ort.InferenceSession('MODEL_ONNX', providers=['CPUExecutionProvider']); i = s.get_inputs()[0]; "
    "s.run(None, {i.name: np.random.default_rng(0).standard_normal([d if isinstance(d, int) else 1 for d in i.shape], "
    "dtype=np.float32)})")


def run(cmd: list[str] | str, cwd: Path) -> tuple[float, str]:
    """Run one whole process (a string runs through the shell, as DVC runs a stage's cmd); return
    its wall time in seconds and its output. A failure aborts the benchmark."""
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       shell=isinstance(cmd, str))
    dt = time.perf_counter() - t0
    if r.returncode:
        shown = cmd if isinstance(cmd, str) else " ".join(cmd)
        sys.exit(f"bench: {shown} failed ({r.returncode}):\n{r.stdout[-3000:]}")
    return dt, r.stdout


def sh(cmd: list[str] | str, cwd: Path) -> float:
    return run(cmd, cwd)[0]


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def stage(repo: Path, name: str):
    """(cmd, outs) of a stage as DVC reads it from the checkout's dvc.yaml (interpolated): the
    benchmark runs what the pipeline runs, whatever that is on the revision measured."""
    with Repo(str(repo)) as r:
        try:
            st = r.stage.collect(name)[0]
        except Exception as e:  # noqa: BLE001 - DVC raises several kinds; say which stage
            sys.exit(f"bench: no stage {name!r} in {repo}/dvc.yaml ({type(e).__name__}: {e})")
        return st.cmd, [str(o.def_path) for o in st.outs]


def ran_stage(out: str, name: str) -> bool:
    """DVC's log says `name` really ran (not restored from the run-cache, not skipped)."""
    return f"Running stage '{name}'" in out and f"Stage '{name}' is cached" not in out


def stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def paired(runs: int, sides: dict, base: str | None) -> dict:
    """Call each side's function once per run, in order (warm-up first, discarded); each returns a
    dict of named values. Ratios are per run (value / `base` value of the same run), then summarized.
    The load average before and after is kept under "load"."""
    before = load()
    for f in sides.values():
        f()
    vals: dict[str, list[float]] = {}
    for _ in range(runs):
        for f in sides.values():
            for k, v in f().items():
                vals.setdefault(k, []).append(v)
    out = {k: stats(v) for k, v in vals.items()}
    for k in vals:
        if base in vals and k != base:
            out[k]["ratio"] = stats([a / b for a, b in zip(vals[k], vals[base])])
    out["load"] = {"before": before, "after": load()}
    return out


def ratio_of(res: dict, a: str, b: str) -> dict:
    """Per-run a / b of two rows measured in the same runs, summarized."""
    return stats([x / y for x, y in zip(res[a]["runs"], res[b]["runs"])])


def table(title: str, res: dict, unit: str, ratio_label: str) -> None:
    print(f"\n{title}")
    print(f"  {'':34} {'median':>9} {'min':>9} {'max':>9}   {ratio_label} (median [min-max])")
    for k, s in res.items():
        if k == "load":
            continue
        r = s.get("ratio")
        rt = f"{r['median']:.2f}x [{r['min']:.2f}-{r['max']:.2f}]" if r else "(baseline)"
        print(f"  {k:34} {s['median']:>8.4f}{unit} {s['min']:>8.4f}{unit} {s['max']:>8.4f}{unit}   {rt}")
    if "load" in res:
        print(f"  load average (1/5/15 min) before {res['load']['before']}, after {res['load']['after']}")


def ensure_repo(repo: Path) -> None:
    if not (repo / ".git").exists():
        print(f"bench: cloning {HERE} (HEAD) into {repo}")
        subprocess.run(["git", "clone", "-q", str(HERE), str(repo)], check=True)
    if not (repo / "artifacts" / "diff" / CELL / "metrics.json").exists():
        print(f"bench: {repo} has no artifacts; running a full `dvc repro` there first (minutes)")
        t = sh(["dvc", "repro"], repo)
        print(f"bench: full dvc repro took {t:.1f}s")


def bench_dvc(repo: Path, runs: int) -> dict:
    res = paired(runs, {"dvc repro (no-op)": lambda: {"dvc repro (no-op)": sh(["dvc", "repro"], repo)},
                        "dvc status": lambda: {"dvc status": sh(["dvc", "status"], repo)}}, "dvc status")
    table("1. no-op dvc repro vs dvc status (s, whole processes; ratio = repro / status)", res, "s", "ratio")
    return res


def bench_oracle(repo: Path, runs: int) -> dict:
    """The extra cost of the oracle verdict and of each layer's own error, per cell (resnet18 fp32
    ort_cpu), as ratios against today's diff (the tolerance check alone) and the capture without
    own error. Whole processes, command lines as in dvc.yaml, outputs in a temp dir."""
    tmp = Path(tempfile.mkdtemp(prefix="parity-bench-oracle-"))
    model, dtype, prov = CELL.split("-")
    p = yaml.safe_load((repo / "params.yaml").read_text())
    p.setdefault("diff", {})["verdict"] = "tolerance"
    (tmp / "tolerance.yaml").write_text(yaml.safe_dump(p))
    cell = ["--model", model, "--dtype", dtype, "--provider", prov]
    capture = ["python", "-m", "stages.capture", *cell, "--model-dir", f"artifacts/models/{model}",
               "--inputs", f"artifacts/inputs/{model}.parquet", "--timing", str(tmp / "timing.json")]
    ref = ["--reference", f"artifacts/reference/{model}/fp64.parquet"]
    diff = ["python", "-m", "stages.diff", *cell, "--reference", f"artifacts/reference/{model}",
            "--baseline", f"artifacts/baseline/{model}/{dtype}", "--model-dir", f"artifacts/models/{model}"]
    sh(capture + ["--out", str(tmp / "plain")], repo)
    sh(capture + ref + ["--out", str(tmp / "own")], repo)
    res = paired(runs, {
        "tol": lambda: {"diff, tolerance only": sh(diff + ["--params", str(tmp / "tolerance.yaml"), "--capture",
                                                            str(tmp / "own"), "--out", str(tmp / "d1")], repo)},
        "acc": lambda: {"diff, oracle (accumulated)": sh(diff + ["--capture", str(tmp / "plain"), "--out",
                                                                 str(tmp / "d2")], repo)},
        "own": lambda: {"diff, oracle + own error": sh(diff + ["--capture", str(tmp / "own"), "--out",
                                                               str(tmp / "d3")], repo)},
    }, "diff, tolerance only")
    table(f"6a. diff of {CELL}: oracle verdict vs today's tolerance-only diff (s, whole processes)", res, "s", "ratio")
    res2 = paired(runs, {
        "plain": lambda: {"capture": sh(capture + ["--out", str(tmp / "c1")], repo)},
        "own": lambda: {"capture + own error": sh(capture + ref + ["--out", str(tmp / "c2")], repo)},
    }, "capture")
    table(f"6b. capture of {CELL} with and without each layer's own error (s, whole processes)", res2, "s", "ratio")
    return {"diff": res, "capture": res2}


def bench_store(repo: Path, runs: int) -> dict:
    sys.path.insert(0, str(repo))

    src = repo / "artifacts" / "reference" / "resnet18" / "fp32.parquet"
    tensors = [store.Tensor(t.sample, t.name, t.order, np.array(t.array)) for t in store.read(src)]
    nbytes = sum(t.array.nbytes for t in tensors)
    arrays = {f"{t.sample}/{t.name}": t.array for t in tensors}
    tmp = Path(tempfile.mkdtemp(prefix="parity-bench-store-"))
    pq, npz = tmp / "t.parquet", tmp / "t.npz"

    def timed(f) -> float:
        t0 = time.perf_counter()
        f()
        return nbytes / (time.perf_counter() - t0) / 1e6

    def touch_store():
        return sum(float(t.array.flat[0]) for t in store.read(pq))

    def touch_npz():
        with np.load(npz) as z:
            return sum(float(z[k].flat[0]) for k in z.files)

    def sum_store():
        return sum(float(np.sum(t.array)) for t in store.read(pq))

    def sum_npz():
        with np.load(npz) as z:
            return sum(float(np.sum(z[k])) for k in z.files)

    res = paired(runs, {
        "store": lambda: {"write": timed(lambda: store.write(pq, tensors)),
                          "read (touch)": timed(touch_store), "read + np.sum": timed(sum_store)},
        "npz": lambda: {"npz write": timed(lambda: np.savez(npz, **arrays)),
                        "npz read (touch)": timed(touch_npz), "npz read + np.sum": timed(sum_npz)},
    }, base=None)
    for k in ("write", "read (touch)", "read + np.sum"):
        base = res[f"npz {k}"]["runs"]
        res[k]["ratio"] = stats([a / b for a, b in zip(res[k]["runs"], base)])
    table(f"3. Parquet tensor store vs np.savez/np.load ({len(tensors)} tensors, {nbytes / 1e6:.1f} MB; "
          "MB/s, higher is faster; ratio = store / npz throughput)", res, "", "ratio")
    return {"tensors": len(tensors), "bytes": nbytes, **res}


def restore(repo: Path, *stages: str) -> None:
    """Put the stages' outputs back as DVC cached them (benchmarks run stage commands in place)."""
    subprocess.run(["dvc", "checkout", "-f", *stages], cwd=repo, env=ENV, stdout=subprocess.DEVNULL,
                   stderr=subprocess.STDOUT)


def plain_onnx(repo: Path, model: str) -> str:
    """The shipped (plain) ONNX of `model`: the export stage's model.onnx (an out, or in an out folder)."""
    _, outs = stage(repo, f"export@{model}")
    found = [o for o in outs if o.endswith("model.onnx")] + [f"{o}/model.onnx" for o in outs
                                                             if (repo / o / "model.onnx").is_file()]
    return found[0] if found else sys.exit(f"bench: export@{model} has no model.onnx among its outs {outs}")


def bench_capture(repo: Path, runs: int) -> dict:
    model = CELL.split("-")[0]
    capture, _ = stage(repo, f"capture@{CELL}")
    diff, _ = stage(repo, f"diff@{CELL}")
    onnx = plain_onnx(repo, model)
    polygraphy = Path(sys.executable).parent / "polygraphy"
    if not polygraphy.exists():
        print(f"\n2. skipped: no {polygraphy} (pip install -e '.[dev]' pins polygraphy)")
        return {}
    tmp = Path(tempfile.mkdtemp(prefix="parity-bench-poly-"))
    poly = [str(polygraphy), "run", onnx, "--onnxrt", "--onnx-outputs", "mark", "all",
            "--save-outputs", str(tmp / "outputs.json")]
    ort_one = BASELINE_ORT.replace("MODEL_ONNX", onnx)

    def pipeline():
        c, d = sh(capture, repo), sh(diff, repo)
        return {"capture + diff (stage processes)": c + d, "  capture": c, "  diff": d}

    try:
        res = paired(runs, {"pipeline": pipeline,
                            "poly": lambda: {"polygraphy run, every tensor": sh(poly, repo)},
                            "ort": lambda: {"plain ORT inference": sh(["python", "-c", ort_one], repo)}},
                     "polygraphy run, every tensor")
    finally:
        restore(repo, f"capture@{CELL}", f"diff@{CELL}")
    table(f"2. per-layer capture + diff of {CELL} vs Polygraphy's per-layer run of {onnx} "
          "(s, whole processes; ratio = x Polygraphy)", res, "s", "ratio")
    print(f"  goal: capture + diff <= 0.5x Polygraphy; measured "
          f"{res['capture + diff (stage processes)']['ratio']['median']:.2f}x")
    return res


def new_atol(params: Path, original: str, value: float) -> None:
    """params.yaml with dtypes.<fp32>.tol.atol = value (the cell's dtype), everything else as it was."""
    p = yaml.safe_load(original)
    p["dtypes"][CELL.split("-")[1]]["tol"]["atol"] = value
    params.write_text(yaml.safe_dump(p, sort_keys=False))


def bench_cold(repo: Path, runs: int) -> dict:
    params = repo / "params.yaml"
    original = params.read_text()
    target = f"diff@{CELL}"
    counter = [time.time_ns() // 1000 % 10**9]  # never a value an earlier run used: no run-cache hit
    floor = ["python", str(HERE / "benchmarks" / "floor.py"), "--model", CELL.split("-")[0]]

    def cold():
        t, out = run(["dvc", "repro", "-f", target], repo)
        if not ran_stage(out, target):
            sys.exit(f"bench: `dvc repro -f {target}` did not run {target}:\n{out[-2000:]}")
        return {"cold cell (dvc repro -f)": t}

    def retol():
        counter[0] += 1
        new_atol(params, original, float(f"1.{counter[0]:09d}e-4"))
        t, out = run(["dvc", "repro", target], repo)
        if not ran_stage(out, target):
            sys.exit(f"bench: after a new atol, `dvc repro {target}` did not run {target}:\n{out[-2000:]}")
        return {"re-run after a new atol": t}

    try:
        res = paired(runs, {"cold": cold, "floor": lambda: {"floor.py (one process)": sh(floor, repo)},
                            "retol": retol}, "floor.py (one process)")
    finally:
        params.write_text(original)
        sh(["dvc", "repro", target], repo)
    res["re-run after a new atol"]["ratio"] = ratio_of(res, "re-run after a new atol", "cold cell (dvc repro -f)")
    table(f"4. single cell {target}: cold vs the floor script; re-run after a tolerance change vs cold "
          "(s, whole processes; ratios: cold / floor, re-run / cold)", res, "s", "ratio")
    print(f"  goals: cold <= 1.5x floor (measured {res['cold cell (dvc repro -f)']['ratio']['median']:.2f}x), "
          f"re-run <= 0.3x cold (measured {res['re-run after a new atol']['ratio']['median']:.2f}x); "
          f"every re-run checked in DVC's log: {target} ran, not restored")
    return res


def bench_diff(repo: Path, runs: int) -> dict:
    """compare_layer's throughput in process on the cell's real tensors, and its share of the diff
    stage (a whole process, as DVC runs it)."""
    sys.path.insert(0, str(repo))

    cmd, _ = stage(repo, f"diff@{CELL}")
    args = shlex.split(cmd)
    cap, ref = Path(args[args.index("--capture") + 1]), Path(args[args.index("--reference") + 1])
    act = store.read_dict(repo / cap / "layers.parquet")
    exp = store.read_dict(repo / ref / "fp32.parquet")
    pairs: dict[str, list] = {}
    for (s, name), t in act.items():
        r = exp.get((s, store.reference_name(name)))
        if r is not None and r.array.shape == t.array.shape:
            pairs.setdefault(name, []).append((s, t.array, r.array))
    nbytes = sum(a.nbytes + b.nbytes for ps in pairs.values() for _, a, b in ps)

    def fused():
        t0 = time.perf_counter()
        for i, (name, ps) in enumerate(pairs.items()):
            compare.compare_layer(name, i, ps, 1e-5, 1e-3, "bench")
        return {"compare_layer, every layer": time.perf_counter() - t0}

    def one_pass():
        t0 = time.perf_counter()
        for ps in pairs.values():
            for _, a, b in ps:
                np.add.reduce(a, axis=None)
                np.add.reduce(b, axis=None)
        return {"one numpy pass (np.add.reduce)": time.perf_counter() - t0}

    try:
        res = paired(runs, {"fused": fused, "pass": one_pass,
                            "stage": lambda: {"diff stage (whole process)": sh(cmd, repo)}},
                     "diff stage (whole process)")
    finally:
        restore(repo, f"diff@{CELL}")
    shown = [k for k in ("compare_layer, every layer", "one numpy pass (np.add.reduce)") if k in res]
    for k in shown:
        res[k]["GB/s"] = stats([nbytes / t / 1e9 for t in res[k]["runs"]])
    table(f"3b. diff of {CELL}: {len(pairs)} layers, {nbytes / 1e6:.1f} MB compared "
          "(s; ratio = share of the diff stage process)", res, "s", "share")
    for k in shown:
        g = res[k]["GB/s"]
        print(f"  {k}: {g['median']:.2f} GB/s [{g['min']:.2f}-{g['max']:.2f}]")
    res["bytes"] = nbytes
    return res


LIGHT = ("env", "inputs", "diff", "report")


def bench_help(repo: Path, runs: int) -> dict:
    sides = {s: (lambda s=s: {f"stages.{s} --help": sh(["python", "-m", f"stages.{s}", "--help"], repo)})
             for s in LIGHT}
    sides["bare"] = lambda: {"python -c pass": sh(["python", "-c", "pass"], repo)}
    res = paired(runs, sides, "python -c pass")
    table("7. light stages: `python -m stages.<s> --help` (s, whole processes; ratio = x bare python)",
          res, "s", "ratio")
    print("  goal: <= 0.2 s each; measured medians " + ", ".join(
        f"{s} {res[f'stages.{s} --help']['median']:.3f} s" for s in LIGHT))
    return res


def bench_parallel(repo: Path, runs: int) -> dict:
    params = repo / "params.yaml"
    original = params.read_text()
    warm, mism = "  warmup: 3\n", "  max_mismatch: 0.0\n"
    if original.count(warm) != 1 or original.count(mism) != 1:
        print("\n5. skipped: cannot find capture.warmup / diff.max_mismatch in params.yaml")
        return {}
    n = [0]

    def stale_cells():
        # new values every run, and no run-cache: it would restore outputs of earlier runs
        shutil.rmtree(repo / ".dvc" / "cache" / "runs", ignore_errors=True)
        n[0] += 1
        params.write_text(original.replace(warm, f"  warmup: {3 + n[0]}\n")
                          .replace(mism, f"  max_mismatch: {n[0]}.0e-12\n"))

    def seq():
        stale_cells()
        return {"dvc repro (sequential)": sh(["dvc", "repro"], repo)}

    def par():
        stale_cells()
        return {"parity repro -j 2": sh(["python", "-m", "parity.commands.parallel", "-j", "2"], repo)}

    try:
        res = paired(runs, {"seq": seq, "par": par}, "dvc repro (sequential)")
    finally:
        params.write_text(original)
        sh(["dvc", "repro"], repo)
    table("5. every cell re-run (8 captures + 8 diffs + env + report): sequential `dvc repro` vs "
          "`parity repro -j 2` (s, whole processes; ratio = x sequential)", res, "s", "ratio")
    return res


def versions() -> dict:
    v = {"python": platform.python_version(), "nproc": os.cpu_count(), "machine": platform.machine()}
    for dist in ("numpy", "torch", "torchvision", "onnxruntime", "onnx", "pyarrow", "dvc"):
        try:
            v[dist] = version(dist)
        except PackageNotFoundError:
            v[dist] = "n/a"
    return v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", type=Path, default=Path(tempfile.gettempdir()) / "parity-bench",
                    help="scratch clone to benchmark in (cloned from this checkout if missing)")
    ap.add_argument("--runs", type=int, default=5, help="measured runs per side, after one warm-up")
    ap.add_argument("--only", default="dvc,capture,cold,diff,help",
                    help="comma-separated subset of dvc,capture,store,cold,diff,help,parallel,oracle")
    ap.add_argument("--json", type=Path, help="also write all figures here")
    ap.add_argument("--cell", default=CELL, help="the cell measured (default: %(default)s; a smaller one to "
                                                  "check the script quickly)")
    a = ap.parse_args()
    globals()["CELL"] = a.cell
    repo = a.repo.resolve()
    if repo == HERE:
        sys.exit("bench: --repo must be a scratch clone, not this checkout (benchmarks change artifacts)")
    ensure_repo(repo)
    out = {"repo": str(repo), "runs": a.runs, "versions": versions()}
    print("bench: " + ", ".join(f"{k} {v}" for k, v in out["versions"].items()) + f"; repo {repo}; "
          f"{a.runs} runs per side after 1 warm-up, interleaved")
    benches = {"dvc": bench_dvc, "capture": bench_capture, "store": bench_store, "cold": bench_cold,
               "diff": bench_diff, "help": bench_help, "parallel": bench_parallel, "oracle": bench_oracle}
    with tempfile.TemporaryDirectory(prefix="parity-bench-tmp-") as scratch:
        tempfile.tempdir = scratch  # every benchmark's temp folders go here and are removed at the end
        ENV["TMPDIR"] = scratch
        for name in a.only.split(","):
            out[name] = benches[name.strip()](repo, a.runs)
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
        print(f"\nbench: figures written to {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
