"""Start-up cost of importing each heavy third-party module parity uses, and of each parity entry
point (a DVC stage's `python -m stages.<x>`, the CLI's `parity --help`, each CLI command's module), as
whole fresh processes: the median wall time of `python -c 'import X'` over --runs runs, minus the
median of `python -c pass` (the bare interpreter). Also lists which heavy modules each entry point has
in sys.modules once imported (what it pays for at start).

The figures behind the `# lazy: ...` comments on the imports left inside functions (BENCHMARKS.md 22).

    .venv/bin/python benchmarks/import_cost.py [--runs 5] [--json out.json] [--only torch,stages.diff]
        [--modules parity.config.params,...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from parity.core import ui

ROOT = Path(__file__).resolve().parents[1]
# third-party modules parity imports (pyproject's dependencies, plus the optional ones it guards)
THIRD_PARTY = ("numpy", "ml_dtypes", "yaml", "pyarrow", "pyarrow.parquet", "rich", "rich.console", "shtab",
               "networkx", "omegaconf", "hydra", "dvc.repo", "onnx", "onnxruntime", "onnxscript", "torch",
               "torchvision", "transformers", "vl_convert", "ray")
# torchvision and transformers load on CPU torch only through parity.models' workaround (tv_compat.py, hf.py)
IMPORT = {"torchvision": "from parity.models.tv_compat import import_torchvision; import_torchvision()",
          "transformers": "from parity.models.hf import load; load()"}
HEAVY = ("numpy", "pyarrow", "rich", "networkx", "hydra", "dvc", "onnx", "onnxruntime", "onnxscript", "torch",
         "torchvision", "transformers", "vl_convert", "ray")
CLI_HELP = ("from parity.commands.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass")


def entry_points() -> list[tuple[str, str]]:
    """(label, code) of each entry point: every stage module, `parity --help`, every command module."""
    stages = sorted(f.stem for f in (ROOT / "stages").glob("*.py") if f.stem != "__init__")
    commands = sorted(f.stem for f in (ROOT / "parity/commands").glob("*.py") if f.stem != "__init__")
    return ([(f"stages.{s}", f"import stages.{s}") for s in stages] + [("parity --help", CLI_HELP)]
            + [(f"parity.commands.{c}", f"import parity.commands.{c}") for c in commands])


def _time(code: str, runs: int) -> tuple[float, float]:
    """Median wall and CPU (user + system) seconds of a fresh `python -c code`: CPU time is the figure
    that holds on a loaded machine, wall time the one a user waits."""
    wall, cpu = [], []
    for _ in range(runs):
        t, c = time.perf_counter(), _child_cpu()
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall.append(time.perf_counter() - t)
        cpu.append(_child_cpu() - c)
    return statistics.median(wall), statistics.median(cpu)


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _heavy_loaded(code: str) -> list[str] | None:
    probe = (f"{code}\nimport sys\nprint(','.join(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    p = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    return p.stdout.strip().splitlines()[-1].split(",") if p.returncode == 0 and p.stdout.strip() else (
        [] if p.returncode == 0 else None)


def measure(runs: int, only: set[str] | None, extra: list[str] = ()) -> dict:
    bare = _time("pass", runs)
    out = {"runs": runs, "bare_wall_s": round(bare[0], 3), "bare_cpu_s": round(bare[1], 3),
           "load": os.getloadavg()[0], "modules": {}, "entries": {}}

    def over_bare(code):
        wall, cpu = _time(code, runs)
        return {"wall_s": round(wall - bare[0], 3), "cpu_s": round(cpu - bare[1], 3)}

    for m in [*THIRD_PARTY, *extra]:
        if only and m not in only and m not in extra:
            continue
        code = IMPORT.get(m, f"import {m}")
        ok = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True).returncode == 0
        out["modules"][m] = over_bare(code) if ok else None
    for label, code in entry_points():
        if only and label not in only:
            continue
        out["entries"][label] = {**over_bare(code), "heavy": _heavy_loaded(code)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--only", default="", help="comma-separated module names / entry labels")
    ap.add_argument("--modules", default="", help="comma-separated further modules to time (e.g. parity ones)")
    args = ap.parse_args(argv)
    res = measure(args.runs, {x for x in args.only.split(",") if x} or None, [x for x in args.modules.split(",") if x])
    print(f"bare interpreter: wall {res['bare_wall_s']:.3f} s, CPU {res['bare_cpu_s']:.3f} s "
          f"(median of {args.runs}; subtracted below); load average {res['load']:.1f}")
    ui.table(["module", "wall (s)", "CPU (s)"],
             [[m, "-", "import failed"] if r is None else [m, f"{r['wall_s']:.3f}", f"{r['cpu_s']:.3f}"]
              for m, r in res["modules"].items()])
    ui.table(["entry point", "wall (s)", "CPU (s)", "heavy modules loaded at start"],
             [[e, f"{r['wall_s']:.3f}", f"{r['cpu_s']:.3f}",
               "import failed" if r["heavy"] is None else " ".join(r["heavy"]) or "-"]
              for e, r in res["entries"].items()])
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
