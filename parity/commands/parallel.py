"""Parallel cells: `dvc repro` with N concurrent cells (DVC itself has no jobs flag).

  1. shared upstream  one `dvc repro -k <targets>`: every stage the selected cells depend on that is
                      not itself a stage of a selected cell (env, inputs@m, export@m, reference@m,
                      engine@m-d, ...). Sequential, in one process, so DVC handles the cascade and the
                      always_changed env probe (env/dvc.yaml:env) runs exactly once, as in a plain `dvc repro`.
  2. cells            `dvc status` picks the cells with a stale stage; each runs as
                      `dvc --wait-for-lock repro -s <its stages, in order>` (capture@cell diff@cell),
                      up to `jobs` at once, slowest (by last measured latency) first, each with its
                      share of the cores as OMP_NUM_THREADS. DVC drops its repo lock while a stage
                      command runs, and with -s no process touches an upstream stage, so no stage
                      runs twice.
  3. downstream       `dvc repro -s report` (every stage that depends on a cell stage), only when the
                      selection is every cell in params.yaml: a filtered run (a GPU box running its own
                      cells) leaves the report to whoever has all cells.

A cell is `model-dtype-provider`; its stages are the dvc.yaml stages named `<stage>@<cell>`. The DAG
comes from DVC's own index (`dvc.repo.Repo(...).index.graph`), so new stage kinds (an engine build per
model-dtype, another per-cell stage) need no change here. A failing cell is reported (which cell, which
stage, the tail of its log) and the others keep running; the run then exits 1. Progress goes to
stderr, one line per finished cell with its verdict (PASS, FAIL and the drift origin, or the status
of a cell that could not run: read from the cell's metrics file, which dvc.yaml names), and the
verdict counts at the end; on a terminal as a rich progress bar, elsewhere as plain lines.

Signals: every dvc child runs in its own session (process group), so the group holds the stage
processes DVC spawns too. SIGINT/SIGTERM to `parity repro` stops starting cells and sends SIGINT to
every group (DVC then stops its stage and releases its lock as on Ctrl-C); a group still alive after
GRACE_S gets SIGTERM, then SIGKILL; a second signal kills at once. parity waits for every group to be
gone and exits 128+signal (130, 143).

    python -m parity.commands.parallel -j 2 [--provider P ...] [--model M ...] [--dtype D ...]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence, TextIO

import yaml

from parity.commands import results
from parity.core import paths
from parity.core.status import PASSING, Status
from parity.core.ui import Progress, at_least

GRACE_S = 10.0   # after forwarding SIGINT, how long a dvc group may take to stop before SIGTERM
KILL_S = 5.0     # after SIGTERM, before SIGKILL
NOT_STARTED = "not started: parity repro was stopped"
RUNNING = re.compile(r"^Running stage '([^']+)'", re.M)
FAILED_STAGE = re.compile(r"failed to reproduce '([^']+)'")


@dataclass
class Plan:
    cells: list[str]                      # selected cells, params order
    all_cells: list[str]                  # every cell in params
    upstream: list[str]                   # shared stages the selected cells need, topological order
    cell_stages: dict[str, list[str]]     # cell -> its stages, topological order
    downstream: list[str]                 # stages fed by cell stages (report), topological order
    needs: dict[str, set[str]] = field(default_factory=dict)  # cell -> upstream stages it needs
    stage_needs: dict[str, set[str]] = field(default_factory=dict)  # upstream stage -> its upstream
    metrics: dict[str, list[str]] = field(default_factory=dict)  # cell -> its stages' metrics files

    @property
    def complete(self) -> bool:
        return set(self.cells) == set(self.all_cells)


@dataclass
class Result:
    returncode: int                       # 0 all ran; 1 a stage failed; 2 bad selection / no repo
    ran: list[str] = field(default_factory=list)          # stages DVC executed ("Running stage")
    failed: dict[str, str] = field(default_factory=dict)  # cell (or "upstream"/"report") -> reason
    cells_run: list[str] = field(default_factory=list)    # cells that had something to run
    report_skipped: bool = False
    seconds: float = 0.0


class SelectionError(ValueError):
    pass


def _env(threads: int | None = None) -> dict:
    """PATH starts with this interpreter's bin dir: `python` in dvc.yaml is this (virtualenv) python.
    threads: OpenMP threads per process for concurrent cells (unless the user set OMP_NUM_THREADS)."""
    e = dict(os.environ)
    e["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{e.get('PATH', '')}"
    e.setdefault("DVC_NO_ANALYTICS", "1")
    if threads:
        e.setdefault("OMP_NUM_THREADS", str(threads))
    return e


class Children:
    """The dvc processes this run started, each the leader of its own session/process group (so a
    signal reaches the stage processes DVC spawns). After stop(), nothing new starts."""

    def __init__(self):
        self.lock = threading.RLock()
        self.groups: dict[int, subprocess.Popen] = {}
        self.signum = 0
        self.timers: list[threading.Timer] = []

    def run(self, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        with self.lock:
            if self.signum:
                return subprocess.CompletedProcess(cmd, 128 + self.signum, "", NOT_STARTED)
            p = subprocess.Popen(cmd, start_new_session=True, **kw)
            self.groups[p.pid] = p
        try:
            out, err = p.communicate()
        finally:
            with self.lock:
                self.groups.pop(p.pid, None)
            _killpg(p.pid, signal.SIGKILL)  # the leader is gone: nothing of its group may outlive it
            _wait_gone(p.pid)
        return subprocess.CompletedProcess(cmd, p.returncode, out, err)

    def stop(self, signum: int, frame=None) -> None:
        """The signal handler: first signal SIGINT to every group and escalate on timers; a second
        signal SIGKILLs at once."""
        with self.lock:
            again = bool(self.signum)
            self.signum = self.signum or signum
            pgids = list(self.groups)
        if again:
            self._send(signal.SIGKILL)
            return
        for g in pgids:
            _killpg(g, signal.SIGINT)
        for delay, sig in ((GRACE_S, signal.SIGTERM), (GRACE_S + KILL_S, signal.SIGKILL)):
            t = threading.Timer(delay, self._send, (sig,))
            t.daemon = True
            t.start()
            self.timers.append(t)

    def _send(self, sig: int) -> None:
        with self.lock:
            pgids = list(self.groups)
        for g in pgids:
            _killpg(g, sig)

    def close(self) -> None:
        for t in self.timers:
            t.cancel()


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group `pgid`, from /proc (Linux; [] elsewhere)."""
    pids = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # state ppid pgrp session ...
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            pids.append(int(d.name))
    return pids


def _wait_gone(pgid: int, timeout: float = 10.0) -> None:
    """Until SIGKILL has taken every member of the group (a few ms; bounded)."""
    end = time.monotonic() + timeout
    while group_members(pgid) and time.monotonic() < end:
        time.sleep(0.02)


_CHILDREN = Children()


def _dvc(args: list[str], root: Path, threads: int | None = None) -> subprocess.CompletedProcess:
    return _CHILDREN.run([sys.executable, "-m", "dvc", *args], cwd=root, env=_env(threads),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _select(params: dict, kind: str, wanted: Sequence[str]) -> list[str]:
    have = list(params[kind])
    bad = [w for w in wanted if w not in have]
    if bad:
        raise SelectionError(f"unknown {kind[:-1]} {', '.join(map(repr, bad))}: params.yaml has "
                             f"{', '.join(have)}")
    return [h for h in have if not wanted or h in wanted]


def _address(stage, root: Path) -> str:
    name = getattr(stage, "name", None)
    if not name:
        return stage.addressing
    dvcfile = Path(stage.path).resolve()
    return name if dvcfile == root / "dvc.yaml" else f"{dvcfile.relative_to(root).as_posix()}:{name}"


def plan(root: Path = Path("."), *, providers: Sequence[str] = (), models: Sequence[str] = (),
         dtypes: Sequence[str] = (), params: str = "params.yaml") -> Plan:
    """Which stages run where, from params.yaml (cells) and DVC's stage graph (everything else)."""
    import networkx as nx  # lazy: +0.17 s (BENCHMARKS 22); `parity --help` builds this module's parser
    from dvc.repo import Repo  # lazy: dvc.repo +0.29 s (BENCHMARKS 22); `parity --help` builds this module's parser

    root = Path(root).resolve()
    p = yaml.safe_load((root / params).read_text())
    all_cells = ["-".join(c) for c in itertools.product(p["models"], p["dtypes"], p["providers"])]
    cells = ["-".join(c) for c in itertools.product(_select(p, "models", models), _select(p, "dtypes", dtypes),
                                                    _select(p, "providers", providers))]
    with warnings.catch_warnings(), Repo(str(root)) as repo:
        warnings.simplefilter("ignore", DeprecationWarning)  # dvc 3.67's trie lookups warn
        g = repo.index.graph  # edge: stage -> a stage it depends on
        # stage names as `dvc repro` / `dvc status` take and print them from the repo root: a stage
        # of ./dvc.yaml by its name ("export@mlp"), one of another dvc.yaml by its path and name
        # ("env/dvc.yaml:env"); s.addressing would be relative to this process's cwd
        names = {s: _address(s, root) for s in g.nodes}
        graph = nx.relabel_nodes(g, names)
        # a cell's verdict file: a `metrics:` out, or a plain out named metrics.json (parity.commands.results)
        metric_files = {names[s]: [str(o.fs_path) for o in s.outs if getattr(o, "metric", False)
                                   or Path(str(o.fs_path)).name == "metrics.json"] for s in g.nodes}
    order = list(reversed(list(nx.topological_sort(graph))))  # dependencies first
    pos = {s: i for i, s in enumerate(order)}
    of_cell = {s: s.split("@", 1)[1] for s in graph if "@" in s and s.split("@", 1)[1] in all_cells}
    cell_stages = {c: sorted((s for s, k in of_cell.items() if k == c), key=pos.__getitem__) for c in cells}
    missing = [c for c, st in cell_stages.items() if not st]
    if missing:
        raise SelectionError(f"no stage in dvc.yaml for cell(s) {', '.join(missing)} (params.yaml and "
                             "dvc.yaml disagree?)")
    needs: dict[str, set[str]] = {}
    for c, st in cell_stages.items():
        deps = set().union(*(nx.descendants(graph, s) for s in st)) - set(st)
        needs[c] = deps  # may include another cell's stage (a cross-cell dep): then it runs upstream
    upstream = sorted(set().union(*needs.values()) if needs else set(), key=pos.__getitem__)
    cell_any = set(of_cell)
    downstream = sorted({s for s in graph if s not in cell_any
                         and any(d in cell_any for d in nx.descendants(graph, s))}, key=pos.__getitem__)
    return Plan(cells, all_cells, upstream, cell_stages, downstream, needs,
                {s: set(nx.descendants(graph, s)) for s in upstream},
                {c: [f for s in st for f in metric_files.get(s, [])] for c, st in cell_stages.items()})


def cell_verdict(files: list[str]) -> tuple[str | None, str | None]:
    """(verdict, drift origin) from a cell's metrics files (its diff stage's metrics.json)."""
    for f in files:
        try:
            m = json.loads(Path(f).read_text())
        except (OSError, ValueError):
            continue
        if results.verdict(m):
            return results.verdict(m), results.drift_origin(m)
    return None, None


class _CellLog:
    """One line per finished cell with its verdict (PASS / FAIL at the drift origin / a status),
    and the verdict counts at the end, through the one progress helper (parity.core.ui.Progress:
    a rich bar on a terminal, plain lines elsewhere)."""

    def __init__(self, total: int, out: TextIO, metrics: dict[str, list[str]] | None = None):
        self.failed = 0
        self.metrics = metrics or {}
        self.verdicts: dict[str, str] = {}
        self.ui = Progress(total, out, "parity repro")
        self.lock = threading.Lock()

    def cell(self, cell: str, ok: bool, secs: float, ran: list[str], why: str = "") -> None:
        with self.lock:
            self.failed += not ok
            what = ", ".join(s.split("@")[0] for s in ran) or "up to date"
            if ok:
                v, origin = cell_verdict(self.metrics.get(cell, []))
                self.verdicts[cell] = v or "ran"
                state = (v or "ok") + (f" (drift origin {origin})" if v == Status.FAIL and origin else "")
            else:
                self.verdicts[cell] = "FAILED"
                state = f"FAILED ({why})"
            fails = f", {self.failed} failed" if self.failed else ""
            self.ui.line(f"parity: {self.ui.done + 1}/{self.ui.total}{fails}  {cell}: {state} in {secs:.1f}s ({what})",
                         advance=1)

    def summary(self) -> str:
        """'3 PASS, 1 FAIL (tiny_mlp-fp16-ort_cpu)' over the cells reported so far."""
        by: dict[str, list[str]] = {}
        for c, v in self.verdicts.items():
            by.setdefault(v, []).append(c)
        order = sorted(by, key=lambda v: (v != Status.PASS, v))
        named = lambda v: v not in PASSING  # noqa: E731  (cells named only when they did not pass)
        return ", ".join(f"{len(by[v])} {v}" + (f" ({', '.join(by[v])})" if named(v) else "") for v in order)

    def close(self) -> None:
        self.ui.close()


def _tail(text: str, n: int = 15) -> str:
    return "\n".join("    | " + ln for ln in text.rstrip().splitlines()[-n:])


def repro(jobs: int = 1, *, providers: Sequence[str] = (), models: Sequence[str] = (),
          dtypes: Sequence[str] = (), root: Path | str = ".", report: bool | None = None,
          progress: TextIO | None = None) -> Result:
    """Reproduce the pipeline with up to `jobs` cells at once; see the module docstring.

    providers/models/dtypes: keep only cells with these values (empty = all); an unknown value is a
    SelectionError-style failure (returncode 2, message on `progress`). report: run the downstream
    stages (report): None = only when every cell is selected; True/False force it.
    Returns a Result; its returncode is what `parity repro` should exit with (128+signal when
    SIGINT/SIGTERM stopped it: every dvc process group it started is gone by then).
    """
    global _CHILDREN
    out = progress if progress is not None else sys.stderr
    _CHILDREN = kids = Children()
    old = {}
    if threading.current_thread() is threading.main_thread():
        old = {sig: signal.signal(sig, kids.stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with repo_lock(Path(root)):
            res = _repro(jobs, providers, models, dtypes, Path(root), report, out)
    except Locked as e:
        print(f"parity: repro: {e}", file=out, flush=True)
        res = Result(2)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        kids.close()
    if kids.signum:
        name = signal.Signals(kids.signum).name
        res.returncode = 128 + kids.signum
        print(f"parity: stopped by {name}: no dvc process left running "
              f"({len(res.failed)} cell(s) or phase(s) not completed)", file=out, flush=True)
    return res


LOCK_FILE = ".dvc/tmp/parity-repro.lock"  # held (flock) by a running `parity repro`; freed when it exits


class Locked(RuntimeError):
    """Another `parity repro` holds the repository."""


@contextlib.contextmanager
def repo_lock(root: Path):
    """Hold the repository for one `parity repro` (an exclusive flock on LOCK_FILE; the kernel frees
    it when the process dies, so a killed run never leaves it stale). Locked at once if held."""
    path = Path(root) / LOCK_FILE
    if not path.parent.parent.is_dir():  # not a DVC repository: plan() says so
        yield
        return
    path.parent.mkdir(exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            who = f.read().strip() or "another process"
            raise Locked(f"the repository is locked by another run ({who}, {LOCK_FILE}): wait for it to "
                         "finish, or stop it; no cell was run") from None
        f.seek(0)
        f.truncate()
        f.write(f"parity repro pid {os.getpid()}")
        f.flush()
        try:
            yield
        finally:
            f.truncate(0)
            fcntl.flock(f, fcntl.LOCK_UN)


def _stopped() -> bool:
    return bool(_CHILDREN.signum)


def _upstream(pl, res: Result, root: Path, out: TextIO) -> tuple[set[str], set[str]] | None:
    """Run the shared upstream stages (one `dvc repro -k`). (cells blocked by a failed upstream stage,
    the failed stages); None when a signal stopped it."""
    if not pl.upstream:
        return set(), set()
    t = time.perf_counter()
    r = _dvc(["repro", "-k", *pl.upstream], root)
    ran = RUNNING.findall(r.stdout)
    res.ran += ran
    if r.returncode and _stopped():
        res.failed["upstream"] = f"stopped by {signal.Signals(_CHILDREN.signum).name}"
        return None
    blocked: set[str] = set()
    bad: set[str] = set()
    if r.returncode:
        bad = set(FAILED_STAGE.findall(r.stdout)) or set(pl.upstream)
        res.failed["upstream"] = f"{', '.join(sorted(bad))} failed"
        print(f"parity: upstream FAILED: {', '.join(sorted(bad))}\n{_tail(r.stdout)}", file=out, flush=True)
        # -k skipped every stage downstream of a failed one: cells needing either cannot run
        bad |= {s for s in pl.upstream if pl.stage_needs[s] & bad}
        blocked = {c for c in pl.cells if pl.needs[c] & bad}
    print(f"parity: upstream: {len(ran)} stage(s) ran in {time.perf_counter() - t:.1f}s "
          f"({', '.join(ran) or 'none'})", file=out, flush=True)
    return blocked, (bad if blocked else set())


def _downstream(pl, res: Result, root: Path, report: bool | None, out: TextIO) -> None:
    """The report stage(s): when every cell is selected (or `report` forces it) and no cell failed."""
    run_down = pl.complete if report is None else report
    cell_failed = [c for c in pl.cells if c in res.failed]
    if pl.downstream and run_down and cell_failed:
        res.report_skipped = True
        print(f"parity: {', '.join(pl.downstream)} not run: {len(cell_failed)} cell(s) failed", file=out, flush=True)
    elif pl.downstream and run_down:
        t = time.perf_counter()
        r = _dvc(["repro", "-s", *pl.downstream], root)
        ran = RUNNING.findall(r.stdout)
        res.ran += ran
        if r.returncode:
            res.failed["report"] = f"{', '.join(pl.downstream)} exited {r.returncode}"
            print(f"parity: {', '.join(pl.downstream)} FAILED\n{_tail(r.stdout)}", file=out, flush=True)
        else:
            print(f"parity: {', '.join(pl.downstream)}: {'ran' if ran else 'up to date'} in "
                  f"{time.perf_counter() - t:.1f}s", file=out, flush=True)
    elif pl.downstream:
        res.report_skipped = True
        print(f"parity: {', '.join(pl.downstream)} not run: {len(pl.cells)} of {len(pl.all_cells)} cells "
              "selected (run it where every cell is in: `dvc repro` after `dvc pull`)", file=out, flush=True)


def _repro(jobs: int, providers: Sequence[str], models: Sequence[str], dtypes: Sequence[str], root: Path,
           report: bool | None, out: TextIO) -> Result:
    root = Path(root).resolve()
    t0 = time.perf_counter()
    res = Result(0)
    try:
        pl = plan(root, providers=providers, models=models, dtypes=dtypes)
    except (SelectionError, FileNotFoundError, KeyError) as e:
        print(f"parity: repro: {e}", file=out)
        return Result(2)
    if _stopped():
        return res
    if not pl.cells:
        print("parity: repro: the filters select no cell", file=out)
        return Result(2)
    jobs = max(1, int(jobs))
    filt = "" if pl.complete else f" (of {len(pl.all_cells)}; filtered)"
    print(f"parity: {len(pl.cells)} cells{filt}, {len(pl.upstream)} shared upstream stages, -j {jobs}",
          file=out, flush=True)

    # 1. shared upstream, sequential, one process
    up = _upstream(pl, res, root, out)
    if up is None or _stopped():
        return res
    blocked, bad = up

    # 2. cells: only those with a stale stage get a process
    runnable = [c for c in pl.cells if c not in blocked]
    stale = _stale(root, [s for c in runnable for s in pl.cell_stages[c]])
    if stale is None:  # status failed: run them all, DVC skips what is up to date
        todo = runnable
    else:
        todo = [c for c in runnable if any(s in stale for s in pl.cell_stages[c])]
    prog = _CellLog(len(pl.cells), out, pl.metrics)
    try:
        _cells(pl, res, prog, root, jobs, todo, blocked, bad)
    finally:
        prog.close()
    todo = res.cells_run
    if _stopped():
        return res
    # 3. downstream (report)
    _downstream(pl, res, root, report, out)

    res.seconds = time.perf_counter() - t0
    res.returncode = 1 if res.failed else 0
    verdicts = f"verdicts: {prog.summary()}"
    if res.failed:
        print(f"parity: {len(res.failed)} failed: {', '.join(res.failed)} ({res.seconds:.1f}s); {verdicts}",
              file=out, flush=True)
    else:
        print(f"parity: done: {len(todo)} of {len(pl.cells)} cells ran, {len(res.ran)} stages, "
              f"{res.seconds:.1f}s; {verdicts}", file=out, flush=True)
    return res


def _cells(pl: Plan, res: Result, prog: _CellLog, root: Path, jobs: int, todo: list[str], blocked: set[str],
           bad: set[str]) -> None:
    """Phase 2: run the stale cells, up to `jobs` at once; every cell's verdict on `prog`."""
    for c in pl.cells:
        if c in blocked:
            why = f"upstream {', '.join(sorted(pl.needs[c] & bad))} did not complete"
            res.failed[c] = why
            prog.cell(c, False, 0.0, [], why)
        elif c not in todo:
            prog.cell(c, True, 0.0, [])
    res.cells_run = list(todo)
    todo = _longest_first(root, todo)

    # N torch processes with one OpenMP thread per core each oversubscribe the CPU (spinning threads
    # wait on descheduled ones: -j 2 on 2 cores measured 1.6x slower than sequential); give each cell
    # its share of the cores. Values do not depend on it (captures byte-identical at 1 and 2
    # threads); latency does, so -j N latency figures are per-share, not whole-machine.
    threads = max(1, (os.cpu_count() or 1) // min(jobs, len(todo))) if jobs > 1 and len(todo) > 1 else None

    def one(cell: str) -> tuple[str, subprocess.CompletedProcess, float]:
        t = time.perf_counter()
        r = _dvc(["--wait-for-lock", "repro", "-s", *pl.cell_stages[cell]], root, threads)
        return cell, r, time.perf_counter() - t

    if todo:
        with ThreadPoolExecutor(max_workers=min(jobs, len(todo))) as ex:
            futs = [ex.submit(one, c) for c in todo]
            for f in as_completed(futs):
                cell, r, secs = f.result()
                ran = RUNNING.findall(r.stdout)
                res.ran += ran
                if r.returncode and _stopped():
                    sig = signal.Signals(_CHILDREN.signum).name
                    res.failed[cell] = f"not started ({sig})" if r.stderr == NOT_STARTED else f"stopped by {sig}"
                    prog.cell(cell, False, secs, ran, res.failed[cell])
                elif r.returncode:
                    stage = (FAILED_STAGE.findall(r.stdout) or [ran[-1] if ran else pl.cell_stages[cell][0]])[0]
                    res.failed[cell] = f"{stage} exited {r.returncode}"
                    prog.cell(cell, False, secs, ran, res.failed[cell])
                    prog.ui.line(_tail(r.stdout))
                else:
                    prog.cell(cell, True, secs, ran)


def _longest_first(root: Path, cells: list[str]) -> list[str]:
    """Start the slowest cells first (a long cell started last is the tail of the whole run).
    Estimate: the cell's last measured latency x (warmup + repeats) (artifacts/timing/<cell>.json),
    else its model's ONNX size (graph + weights.bin); ties keep params order. Only the order changes, never the results."""
    def cost(cell: str) -> tuple[float, int]:
        try:
            t = json.loads((root / paths.timing(cell)).read_text())
            ms = float(t["median_ms"]) * (int(t.get("warmup", 0)) + int(t.get("repeats", 1)))
        except (OSError, ValueError, KeyError, TypeError):
            ms = 0.0
        d = root / paths.model_dir(cell.split("-")[0])  # the graph and its weights (weights.bin)
        return ms, sum(f.stat().st_size for f in (d / "model.onnx", d / "weights.bin") if f.exists())

    return sorted(cells, key=cost, reverse=True)


def _stale(root: Path, stages: list[str]) -> set[str] | None:
    """Stages `dvc status` calls changed (deps/params/outs/never run), or None if status failed."""
    if not stages:
        return set()
    r = _CHILDREN.run([sys.executable, "-m", "dvc", "status", "--json", *stages], cwd=root, env=_env(),
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode:
        return None
    try:
        return set(json.loads(r.stdout or "{}"))
    except json.JSONDecodeError:
        return None


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The `parity repro` options (for parity/commands/cli.py to reuse)."""
    ap.add_argument("-j", "--jobs", type=at_least(1), default=os.cpu_count() or 1,
                    help="cells run at once (default: number of CPUs)")
    ap.add_argument("--provider", action="append", default=[], metavar="P", help="only cells of provider P (repeatable)")
    ap.add_argument("--model", action="append", default=[], metavar="M", help="only cells of model M (repeatable)")
    ap.add_argument("--dtype", action="append", default=[], metavar="D", help="only cells of dtype D (repeatable)")
    rep = ap.add_mutually_exclusive_group()
    rep.add_argument("--report", dest="report", action="store_true", default=None,
                     help="run the report even when filters select only some cells")
    rep.add_argument("--no-report", dest="report", action="store_false", help="never run the report")


def run_from_args(args: argparse.Namespace) -> int:
    return repro(args.jobs, providers=args.provider, models=args.model, dtypes=args.dtype,
                 report=args.report).returncode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m parity.commands.parallel", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    return run_from_args(ap.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
