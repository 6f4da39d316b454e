"""The cold export stage (export@model: the torch -> ONNX export, the fp32 and fp64 references and the
fp32 baseline made in the same process, parity.pipeline.fold) measured phase by phase: CPU time
(user+sys) and wall time of each phase, and of the whole process (issue 38).

    python benchmarks/export_phases.py --models bert_base[,llama_1b] [--runs 3] [--src A,B] [--json out.json]

For each checkout in --src (default: this one) a scratch repository under /tmp gets that checkout's
pipeline files, `parity compose -S models=[<m>]` and the inputs stage; then `python -m stages.export`
runs there, cold (its outputs removed first), --runs times per model. With several checkouts the runs
alternate (A, B, A, B, ...) in one loop, so each pair sees the same load; the load average is recorded
before each run. Each run is a child process of this script that wraps the functions named in PHASES
with timers (CPU of the whole process, every thread, during the call; a phase on a writer thread uses
that thread's CPU) and then calls stages.export's main(); its total CPU is the child's own rusage
(os.wait4: the process and what it waited for). Phases nest (indented): a phase's time includes the
phases under it. A phase a checkout does not have (renamed, removed) is left blank. The md5 of every
file the export wrote (artifacts/models/<m>, the staged reference and baseline included; the timing
file is not among them) is compared across runs and checkouts: "identical" or the files that differ.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PROJECT_FILES = ["dvc.yaml", "env", "conf", "stages", "parity", "hydra_plugins", ".dvcignore", "data"]

# (label, "module:attribute.path", depth); {dtype} in a label is filled from the call (reference runs)
PHASES = [
    ("memory guard (meta-device sizing)", "parity.pipeline.memsize:guard", 0),
    ("export_model", "parity.pipeline.export:export_model", 0),
    ("build model", "parity.pipeline.export:build", 1),
    ("input samples (one per shape)", "parity.pipeline.export:model_samples", 1),
    ("layers.onnx (export_checked)", "parity.pipeline.layer_export:export_checked", 1),
    ("input check + recorder forward + torch.onnx.export", "parity.pipeline.layer_export:export_layers", 2),
    ("torch.onnx.export", "torch.onnx:export", 3),
    ("torch.export trace (capture strategy)",
     "torch.onnx._internal.exporter._capture_strategies:CaptureStrategy.__call__", 4),
    ("decompositions", "torch.onnx._internal.exporter._core:_prepare_exported_program_for_export", 4),
    ("translate FX -> ONNX IR", "torch.onnx._internal.exporter._core:_exported_program_to_onnx_program", 4),
    ("onnxscript optimize", "torch.onnx._internal.exporter._onnx_program:ONNXProgram.optimize", 4),
    ("ONNXProgram.save", "torch.onnx._internal.exporter._onnx_program:ONNXProgram.save", 4),
    ("load exported graph", "parity.models.onnx_weights:load_graph", 2),
    ("graph of the unsaved program", "parity.models.onnx_weights:unsaved_graph", 2),
    ("strip paths", "parity.pipeline.layer_export:strip_paths", 2),
    ("pack weights.bin", "parity.models.onnx_weights:pack", 2),
    ("write + check graph (write_checked)", "parity.models.onnx_weights:write_checked", 1),
    ("onnx.checker (full, shape inference)", "onnx.checker:check_model", 2),
    ("prune to model.onnx", "parity.models.onnx_graph:prune_outputs", 1),
    ("layers.json regions", "parity.pipeline.layer_export:layer_regions", 1),
    ("module types", "parity.models.layers:module_types", 1),
    ("op inventory", "parity.models.onnx_graph:op_inventory", 1),
    ("reference + fp32 baseline (fold)", "parity.pipeline.fold:in_export", 0),
    ("reference run {dtype}", "parity.pipeline.reference:stream", 1),
    ("prime fp64 rows", "parity.core.store:Rows.prime", 1),
    ("fp32 baseline (torch_baseline)", "parity.pipeline.baseline_torch:torch_baseline", 1),
    ("plain forward", "parity.backends.torch_cpu:TorchRunner.infer_plain", 2),
    ("per-layer forward", "parity.backends.torch_cpu:TorchRunner.infer", 2),
    ("own-error passes (2)", "parity.backends.torch_cpu:TorchRunner.infer_own", 2),
    ("oracle sums + layers rows", "parity.pipeline.sink:StoreSink.sample", 2),
    ("own rows + sums", "parity.pipeline.sink:StoreSink.own", 2),
    ("Parquet row groups (writer thread)", "parity.core.store:Writer._write", 1),
    ("Parquet publish", "parity.core.store:Writer.publish", 1),
    ("stage for publishing", "parity.pipeline.publish:stage_for", 1),
    ("timing file", "parity.core.memory:record", 0),
]
THREAD_CPU = {"parity.core.store:Writer._write"}  # runs on a writer thread beside the others


def _cpu(thread: bool) -> float:
    r = resource.getrusage(resource.RUSAGE_THREAD if thread else resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _resolve(target: str):
    """(owner, attribute name, value) of "module:a.b", or None where this checkout has none."""
    import importlib

    mod, _, path = target.partition(":")
    try:
        owner = importlib.import_module(mod)
        *parents, name = path.split(".")
        for p in parents:
            owner = getattr(owner, p)
        return owner, name, getattr(owner, name)
    except (ImportError, AttributeError):
        return None


def _timed(fn, label: str, target: str, totals: dict):
    thread = target in THREAD_CPU

    def wrapper(*args, **kwargs):
        lab = label
        if "{dtype}" in label:
            lab = label.format(dtype=next((a for a in args if a in ("float32", "float64")), "?"))
        c0, t0 = _cpu(thread), time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            e = totals.setdefault(lab, [0.0, 0.0, 0])
            e[0] += _cpu(thread) - c0
            e[1] += time.perf_counter() - t0
            e[2] += 1

    wrapper.__wrapped__ = fn
    return wrapper


def install(totals: dict) -> list[str]:
    """Wrap every PHASES function that this checkout has, wherever a loaded module holds it (a
    `from x import f` copy too); the targets it could not find."""
    missing = []
    for label, target, _ in PHASES:
        found = _resolve(target)
        if found is None:
            missing.append(target)
            continue
        owner, name, fn = found
        w = _timed(fn, label, target, totals)
        setattr(owner, name, w)
        if isinstance(owner, type):
            continue
        for m in list(sys.modules.values()):
            d = getattr(m, "__dict__", None)
            if d is None:
                continue
            for k, v in list(d.items()):
                if v is fn:
                    d[k] = w
    return missing


def child(argv: list[str]) -> None:
    """One export run in this process, phases timed; writes the phases JSON to argv[0]."""
    out, stage_args = argv[0], argv[1:]
    c0, t0 = _cpu(False), time.perf_counter()
    import stages.export as stage

    for m in ("parity.pipeline.fold", "parity.backends.torch_cpu", "parity.pipeline.sink",
              "parity.pipeline.baseline_torch", "torch.onnx._internal.exporter._core", "onnx.checker"):
        __import__(m)
    totals: dict = {}
    missing = install(totals)
    totals["imports (stage + timed modules)"] = [_cpu(False) - c0, time.perf_counter() - t0, 1]
    rc = stage.main(stage_args)
    Path(out).write_text(json.dumps({"rc": rc, "phases": totals, "missing": missing}))
    sys.stdout.flush()
    os._exit(rc)


def scratch(src: Path, model: str, base: Path) -> Path:
    """A scratch repository of checkout `src`'s pipeline files composed for `model`, inputs made."""
    repo = base / f"{src.name}-{hashlib.md5(str(src).encode()).hexdigest()[:6]}-{model}"
    if not repo.exists():
        repo.mkdir(parents=True)
        for n in PROJECT_FILES:
            s = src / n
            if s.is_dir():
                shutil.copytree(s, repo / n, ignore=shutil.ignore_patterns("__pycache__"))
            elif s.exists():
                shutil.copy2(s, repo / n)
        shutil.copy2(Path(__file__), repo / "export_phases.py")
        _sh([str(BIN / "parity"), "compose", "-S", f"models=[{model}]", "-S", "dtypes=[fp32]",
             "-S", "providers=[ort_cpu]"], repo)
        _sh([sys.executable, "-m", "stages.inputs", "--model", model, "--out", f"artifacts/inputs/{model}.parquet",
             "--calibration", f"artifacts/inputs/{model}.calibration.parquet"], repo)
    return repo


def _env(repo: Path) -> dict:
    e = dict(os.environ, PYTHONPATH=str(repo), DVC_NO_ANALYTICS="1")
    e["PATH"] = f"{BIN}{os.pathsep}{e.get('PATH', '')}"
    return e


def _sh(cmd: list[str], repo: Path) -> None:
    p = subprocess.run(cmd, cwd=repo, env=_env(repo), capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}) in {repo}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")


def one_run(repo: Path, model: str) -> dict:
    """A cold export in `repo`: its phases, the process's CPU and wall, the load before, the md5s."""
    for d in (f"artifacts/models/{model}", f"artifacts/timing/export/{model}.json"):
        p = repo / d
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    out = repo / "phases.json"
    cmd = [sys.executable, "export_phases.py", "--child", str(out), "--model", model,
           "--out", f"artifacts/models/{model}", "--inputs", f"artifacts/inputs/{model}.parquet",
           "--reference-out", f"artifacts/reference/{model}", "--baseline-out", f"artifacts/baseline/{model}/fp32",
           "--timing", f"artifacts/timing/export/{model}.json"]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=repo, env=_env(repo), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    text = proc.stdout.read().decode(errors="replace")
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    rc = os.waitstatus_to_exitcode(status)
    if rc:
        sys.exit(f"export of {model} in {repo} failed ({rc}):\n{text[-3000:]}")
    res = json.loads(out.read_text())
    res.update(cpu=ru.ru_utime + ru.ru_stime, user=ru.ru_utime, sys=ru.ru_stime, wall=wall, load=load,
               rss_mib=ru.ru_maxrss / 1024, md5=_md5s(repo / "artifacts" / "models" / model))
    return res


def _md5s(folder: Path) -> dict:
    return {str(f.relative_to(folder)): hashlib.md5(f.read_bytes()).hexdigest()
            for f in sorted(folder.rglob("*")) if f.is_file()}


def _fmt(xs: list[float]) -> str:
    if not xs:
        return ""
    return f"{statistics.median(xs):7.1f} [{min(xs):.1f}-{max(xs):.1f}]" if len(xs) > 1 else f"{xs[0]:7.1f}"


def table(model: str, runs: dict[str, list[dict]]) -> str:
    """The phase table of `model`: per checkout, median [range] of CPU and wall seconds per phase."""
    srcs = list(runs)
    depth = {label.split(" {")[0]: d for label, _, d in PHASES}
    labels = ["imports (stage + timed modules)"]
    for r in (x for rs in runs.values() for x in rs):
        labels += [k for k in r["phases"] if k not in labels]
    labels.sort(key=lambda k: [i for i, (lab, _, _) in enumerate(PHASES) if k.startswith(lab.split(" {")[0])][:1]
                or [-1])
    head = f"| {model}: phase | " + " | ".join(f"{s} CPU s | {s} wall s" for s in srcs) + " |"
    lines = [head, "|" + "---|" * (1 + 2 * len(srcs))]
    for k in labels:
        ind = "&nbsp;" * 2 * depth.get(k.split(" float")[0], 0)
        cells = []
        for s in srcs:
            got = [r["phases"][k] for r in runs[s] if k in r["phases"]]
            cells += [_fmt([g[0] for g in got]), _fmt([g[1] for g in got])]
        lines.append(f"| {ind}{k} | " + " | ".join(cells) + " |")
    for name, key in (("**whole process** (rusage)", "cpu"), ("user", "user"), ("sys", "sys")):
        lines.append(f"| {name} | " + " | ".join(f"{_fmt([r[key] for r in runs[s]])} | " + (
            _fmt([r["wall"] for r in runs[s]]) if key == "cpu" else "") for s in srcs) + " |")
    lines.append("| load average (1 min) before each run | " + " | ".join(
        ", ".join(f"{r['load']:.1f}" for r in runs[s]) + " | " for s in srcs) + " |")
    lines.append("| peak RSS MiB | " + " | ".join(f"{_fmt([r['rss_mib'] for r in runs[s]])} | " for s in srcs) + " |")
    return "\n".join(lines)


def compare(model: str, runs: dict[str, list[dict]]) -> str:
    """Ratios of the first checkout's medians to each other's, and whether every run wrote the same bytes."""
    srcs, out = list(runs), []
    first = runs[srcs[0]]
    for s in srcs[1:]:
        for key in ("cpu", "wall"):
            a, b = statistics.median(r[key] for r in first), statistics.median(r[key] for r in runs[s])
            out.append(f"{model}: {key} {srcs[0]} / {s} = {a / b:.2f}x ({a:.1f} s / {b:.1f} s)")
    ref = first[0]["md5"]
    diff = sorted({f for rs in runs.values() for r in rs for f in set(ref) | set(r["md5"])
                   if ref.get(f) != r["md5"].get(f)})
    out.append(f"{model}: artifacts of every run ({len(ref)} files) "
               + ("identical" if not diff else f"DIFFER: {', '.join(diff)}"))
    return "\n".join(out)


def main(argv=None) -> int:
    if argv is None and sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="bert_base")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--src", default=str(ROOT), help="checkouts, comma-separated (runs alternate between them)")
    ap.add_argument("--json", help="every run's figures")
    ap.add_argument("--keep", help="scratch folder to keep (default: a temp folder, deleted)")
    a = ap.parse_args(argv)
    srcs = [Path(s).resolve() for s in a.src.split(",")]
    base = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="parity-export-phases-"))
    every: dict = {}
    try:
        for model in a.models.split(","):
            repos = {str(s): scratch(s, model, base) for s in srcs}
            names = {str(s): (s.name if len({x.name for x in srcs}) == len(srcs) else str(s)) for s in srcs}
            runs: dict[str, list[dict]] = {names[s]: [] for s in repos}
            for i in range(a.runs):
                for s, repo in repos.items():
                    r = one_run(repo, model)
                    runs[names[s]].append(r)
                    print(f"# {model} run {i + 1} {names[s]}: CPU {r['cpu']:.1f} s, wall {r['wall']:.1f} s, "
                          f"load {r['load']:.1f}", flush=True)
            print(table(model, runs))
            print(compare(model, runs), flush=True)
            every[model] = runs
    finally:
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps(every, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
