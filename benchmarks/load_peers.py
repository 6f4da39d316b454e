"""Issue 38's loop: wall AND CPU time (user+sys of the whole process tree) against the peers, at the load there is.

Each row alternates its sides (A B A B ...) after one discarded warm-up round; per round it records each
side's wall time, its CPU time (resource.getrusage(RUSAGE_CHILDREN) delta around the process: user+sys
of it and of every descendant it waited for; DVC's detached analytics daemon is not waited for, so not
counted) and the 1-min load average before each side. Ratios are per round (A_i / B_i), reported as median [min-max].

  capture  A: `dvc repro -f -s capture@<cell> diff@<cell>` (DVC's log checked: both ran).
           B: `polygraphy run model.onnx --onnxrt --onnxrt --onnx-outputs mark all` (a plain copy of the
           cell's model.onnx + weights.bin), Polygraphy installed by this script in a venv of its own
           (python3.11 -m venv; pip install polygraphy onnxruntime onnx numpy, the versions parity pins),
           as its users install it: not parity's venv, where it imports whatever else is installed.
  direct   A: the same two stages' commands (read from dvc.yaml through DVC) run by a shell, no DVC.
           B: the same Polygraphy command. The workspace is re-synced (`dvc checkout`) at the end.
  noop     A: `dvc repro` with nothing changed (the env stage runs: always_changed). B: `dvc status`.
           With --before CLONE (the same pipeline on the code before a change, run there too), that
           clone's no-op `dvc repro` is a third side of the same rounds: before and after, one loop. With
           --floor CLONE (env/dvc.yaml's `always_changed: false`, run once since) DVC's own no-op, nothing run.
  cold     A: `dvc repro -f diff@<cell>` (every upstream stage forced: DVC's log checked against the stages
           `dvc repro -f --dry` lists). B: export-validator's pipeline (`cli export` then `cli compare`, two
           processes timed together) for resnet18 on seeded random weights, as benchmarks/peers.py runs it.
           export-validator is not on PyPI: give its checkout (--export-validator PATH, e.g. a clone of
           github.com/SAY-5/export-validator at d5c37b3); it is installed once into a venv of its own
           (--ev-venv; `pip install -e` + parity's torch/torchvision versions, from the pip index and
           find-links as configured) and never copied into this repository.

--repo is a scratch clone that has been run (`dvc repro`), e.g. the 8-cell default; <cell> must be in it.
Nothing asserts a timing.

    python benchmarks/load_peers.py --repo /tmp/x [--runs 5] [--only capture,direct,noop,cold] [--before /tmp/y] [--floor /tmp/z]
                                    [--peer-venv DIR] [--export-validator PATH] [--ev-venv DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402 - ENV, stage(), ran_stage(), versions()
import peers  # noqa: E402 - plain_onnx()

PEER_PINS = ("polygraphy==0.53.6", "onnxruntime", "onnx", "numpy")  # versions: parity's own, below
ROWS = ("capture", "direct", "noop", "cold")


def timed(cmd: list[str] | str, cwd: Path, what: str, env: dict | None = None) -> tuple[dict, str]:
    """One whole process: wall, cpu (user+sys of its tree), load1 before; a failure stops the benchmark."""
    load1 = os.getloadavg()[0]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env or bench.ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, shell=isinstance(cmd, str))
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        sys.exit(f"load_peers: {what} failed (exit {r.returncode}): {cmd}\n{r.stdout[-3000:]}")
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {"wall": wall, "cpu": cpu, "load1": load1}, r.stdout


def summary(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": [round(x, 4) for x in xs]}


def paired(runs: int, sides: dict) -> dict:
    """Warm-up round discarded, then `runs` rounds of every side in order; per-round ratios of wall and
    cpu of each side to the last one (the peer)."""
    for f in sides.values():
        f()
    rounds = [{k: f() for k, f in sides.items()} for _ in range(runs)]
    base = list(sides)[-1]
    out = {"sides": list(sides)}
    for side in sides:
        for k in ("wall", "cpu"):
            out[f"{side}_{k}"] = summary([r[side][k] for r in rounds])
            if side != base:
                out[f"{side}_ratio_{k}"] = summary([r[side][k] / r[base][k] for r in rounds])
    out["load1"] = summary([x["load1"] for r in rounds for x in r.values()])
    return out


def show(title: str, res: dict, commands: dict) -> None:
    print(f"\n{title}")
    for side in res["sides"]:
        print(f"  {side}: {commands[side]}")
        for k in ("wall", "cpu"):
            v, r = res[f"{side}_{k}"], res.get(f"{side}_ratio_{k}")
            rt = f"  {side}/{res['sides'][-1]} {r['median']:.2f}x [{r['min']:.2f}-{r['max']:.2f}]" if r else ""
            print(f"    {k:4s} {v['median']:.2f} s [{v['min']:.2f}-{v['max']:.2f}]{rt}")
    ld = res["load1"]
    print(f"  load (1 min) during: median {ld['median']:.1f} [{ld['min']:.1f}-{ld['max']:.1f}]")


def peer_venv(venv: Path) -> Path:
    """Polygraphy in a venv of its own (created once, reused): the peer and what it requires."""
    exe = venv / "bin" / "polygraphy"
    if not exe.exists():
        pins = [p if "==" in p else f"{p}=={bench.version(p)}" for p in PEER_PINS]
        print(f"load_peers: installing {' '.join(pins)} into {venv} (once)")
        subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *pins], check=True)
    return exe


def polygraphy_side(repo: Path, venv: Path, work: Path):
    cmd = [str(peer_venv(venv)), "run", str(peers.plain_onnx(repo, work)), "--onnxrt", "--onnxrt",
           "--onnx-outputs", "mark", "all"]

    def side():
        r, out = timed(cmd, repo, "polygraphy")
        if "PASSED" not in out:
            sys.exit(f"load_peers: polygraphy did not report PASSED:\n{out[-2000:]}")
        return r
    return side, " ".join(cmd[1:])


def row_capture(repo: Path, runs: int, poly) -> dict:
    stages = [f"capture@{peers.CELL}", f"diff@{peers.CELL}"]
    cmd = ["dvc", "repro", "-f", "-s", *stages]

    def side_a():
        r, out = timed(cmd, repo, "dvc repro -f -s")
        if missing := [s for s in stages if not bench.ran_stage(out, s)]:
            sys.exit(f"load_peers: {' '.join(cmd)} did not run {missing}:\n{out[-2000:]}")
        return r
    try:
        res = paired(runs, {"A": side_a, "B": poly[0]})
    finally:  # the forced stages wrote new timing files: the report is behind them until it runs (untimed)
        subprocess.run(["dvc", "repro", "-q"], cwd=repo, env=bench.ENV)
    res["commands"] = {"A": " ".join(cmd), "B": "polygraphy " + poly[1]}
    show("capture + diff through DVC / Polygraphy (own venv)", res, res["commands"])
    return res


def row_direct(repo: Path, runs: int, poly) -> dict:
    cmds = [bench.stage(repo, f"{s}@{peers.CELL}")[0] for s in ("capture", "diff")]
    line = " && ".join(cmds)
    try:
        res = paired(runs, {"A": lambda: timed(line, repo, "the two stage commands")[0], "B": poly[0]})
    finally:
        subprocess.run(["dvc", "checkout", "-f", "-q"], cwd=repo, env=bench.ENV)
    res["commands"] = {"A": line, "B": "polygraphy " + poly[1]}
    show("the two stage commands, no DVC / Polygraphy (own venv)", res, res["commands"])
    return res


def noop_side(repo: Path):
    def side():
        r, out = timed(["dvc", "repro"], repo, f"dvc repro in {repo}")
        if ran := [s for s in peers.ran(out) if "env" not in s]:
            sys.exit(f"load_peers: the no-op `dvc repro` in {repo} ran {ran}: the scratch repo is not up to date")
        return r
    return side


def row_noop(repo: Path, runs: int, before: Path | None, floor: Path | None = None) -> dict:
    """`dvc repro` / `dvc status`; with `before` (a clone of the code before a change, run too), its no-op
    `dvc repro` in the same rounds; with `floor` (a clone whose env/dvc.yaml has `always_changed: false`,
    run once since), DVC's own no-op `dvc repro` with no stage running at all: what parity cannot go under."""
    sides = {"before": noop_side(before)} if before else {}
    sides.update({"floor": noop_side(floor)} if floor else {})
    sides.update(A=noop_side(repo), B=lambda: timed(["dvc", "status"], repo, "dvc status")[0])
    res = paired(runs, sides)
    res["commands"] = {"before": f"dvc repro in {before}", "floor": f"dvc repro in {floor} (env stage not always_changed)",
                       "A": f"dvc repro in {repo}", "B": f"dvc status in {repo}"}
    show("no-op dvc repro / dvc status", res, res["commands"])
    return res


def row_cold(repo: Path, runs: int, checkout: Path, venv: Path, work: Path) -> dict:
    """A cold cell (every stage up to diff@<cell> forced) / export-validator's export + compare."""
    py = peers.ev_venv(checkout.resolve(), venv)
    home, out_dir = work / "torch-home", work / "ev-out"
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("EXPORT_VALIDATOR_BINARY", "PYTHONPATH")}
    env.update(TORCH_HOME=str(home), HF_HUB_OFFLINE="1")
    timed([str(py), "-c", peers.WEIGHTS, str(home), str(peers.SEED)], work, "writing the random weights", env)
    (work / "ev_cli.py").write_text(peers.EV_CLI)
    cli, m = f"{py} {work / 'ev_cli.py'}", peers.MODEL
    onnx, lmap = out_dir / f"{m}.onnx", out_dir / f"{m}_layer_map.json"
    b_cmd = (f"{cli} export --model {m} --out {onnx} --layer-map {lmap} && {cli} compare --model {m} --onnx {onnx} "
             f"--layer-map {lmap} --report-base {out_dir / f'{m}_fp32'} --tolerance 1e-4 --backend auto")
    target = f"diff@{peers.CELL}"
    a_cmd = ["dvc", "repro", "-f", target]
    expected = peers.ran(timed([*a_cmd, "--dry"], repo, "dvc repro --dry")[1])

    def side_a():
        r, out = timed(a_cmd, repo, " ".join(a_cmd))
        if missing := [s for s in expected if not bench.ran_stage(out, s)]:
            sys.exit(f"load_peers: {' '.join(a_cmd)} did not run {missing}:\n{out[-2000:]}")
        return r

    def side_b():
        r, out = timed(b_cmd, out_dir, "export-validator's pipeline", env)
        if "compared via" not in out:
            sys.exit(f"load_peers: export-validator printed no 'compared via' line:\n{out[-2000:]}")
        return r
    res = paired(runs, {"A": side_a, "B": side_b})
    res["commands"] = {"A": " ".join(a_cmd) + f" ({len(expected)} stages: {', '.join(expected)})", "B": b_cmd}
    res["export_validator"] = {"checkout": str(checkout), "commit": peers.head(checkout, dirty_note=False)}
    show(f"cold cell / export-validator {res['export_validator']['commit']} (own venv)", res, res["commands"])
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", type=Path, required=True, help="a scratch clone, already run (`dvc repro`)")
    ap.add_argument("--runs", type=int, default=5, help="measured pairs after one warm-up pair")
    ap.add_argument("--only", default="capture,direct,noop", help=f"comma-separated subset of {','.join(ROWS)}")
    ap.add_argument("--peer-venv", type=Path, default=Path(tempfile.gettempdir()) / "parity-polygraphy-venv",
                    help="Polygraphy's own venv (created once if missing; default: %(default)s)")
    ap.add_argument("--before", type=Path, help="noop: a second scratch clone (the code before a change, run "
                    "too), whose no-op `dvc repro` is timed in the same rounds")
    ap.add_argument("--floor", type=Path, help="noop: a scratch clone whose env/dvc.yaml says `always_changed: "
                    "false` (run once since): DVC's no-op `dvc repro` with no stage to run, timed in the same rounds")
    ap.add_argument("--export-validator", type=Path, metavar="PATH", help="cold: an export-validator checkout")
    ap.add_argument("--ev-venv", type=Path, default=Path(tempfile.gettempdir()) / "parity-export-validator-venv",
                    help="export-validator's own venv (created once if it cannot import it; default: %(default)s)")
    ap.add_argument("--json", type=Path, help="also write every figure here")
    a = ap.parse_args()
    only = [s.strip() for s in a.only.split(",") if s.strip()]
    if bad := [s for s in only if s not in ROWS]:
        sys.exit(f"load_peers: --only: unknown {bad}; valid: {', '.join(ROWS)}")
    if "cold" in only and not (a.export_validator and (a.export_validator / "pyproject.toml").is_file()):
        sys.exit("load_peers: --only cold needs --export-validator PATH (a checkout with its pyproject.toml)")
    repo = a.repo.resolve()
    if repo == bench.HERE or not (repo / "artifacts" / "diff" / peers.CELL).is_dir():
        sys.exit(f"load_peers: --repo {repo}: not a scratch clone with artifacts/diff/{peers.CELL} "
                 "(run `dvc repro` there)")
    out = {"commit": peers.head(repo, dirty_note=False), "runs": a.runs, "versions": bench.versions(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(f"load_peers: {out['date']}, {repo} at {out['commit']}, {a.runs} pairs after a warm-up pair")
    with tempfile.TemporaryDirectory(prefix="parity-load-peers-") as work:
        poly = polygraphy_side(repo, a.peer_venv, Path(work)) if {"capture", "direct"} & set(only) else None
        rows = {"capture": lambda: row_capture(repo, a.runs, poly), "direct": lambda: row_direct(repo, a.runs, poly),
                "noop": lambda: row_noop(repo, a.runs, a.before and a.before.resolve(), a.floor and a.floor.resolve()),
                "cold": lambda: row_cold(repo, a.runs, a.export_validator, a.ev_venv, Path(work))}
        for name in only:
            out[name] = rows[name]()
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
