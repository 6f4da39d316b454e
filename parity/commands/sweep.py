"""`parity sweep 'dtypes=fp32,fp16,bf16' ['models=[mlp],[resnet18]' ...] [-j N] [--json]`: queue one
DVC experiment per combination, run them with N workers, show progress while they run, and print
one compact table instead of `dvc exp show`'s full width.

Expansion is DVC's own (dvc.utils.hydra.get_hydra_sweeps, what `dvc exp run --queue -S` uses):
Hydra's sweep grammar, so `models=[mlp],[resnet18]` is two experiments, `seed=range(1,4)` three,
and every experiment is known by name. With -j > 1 the first combination runs alone first
(`dvc exp run --temp`, its stages printed as they run), so the stages all experiments share
(inputs, export, reference) run once and the others restore them from DVC's run-cache instead of
racing to compute them.

Before anything runs or is queued, every combination is composed (DVC's compose_and_dump with the
parity Hydra plugin, as `parity compose` and `dvc exp run` do) into a temp file and validated: one
bad combination fails the sweep with its config error and nothing queued.

Progress (stderr) polls DVC's queue in-process every `poll` seconds (Repo.experiments.celery_queue:
what `dvc queue status` prints): each cell's verdict as its diff stage writes it in a running
experiment's workspace, each experiment's counts when it finishes, and on a plain (non-terminal)
stderr a status line every 4-6 s (4 s + one poll) while nothing else happens. `dvc queue start` runs with
its output in a file, not a pipe: the queue worker it forks inherits the output, and a pipe would
keep the parent waiting until every experiment had run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from dvc.exceptions import DvcException
from dvc.repo import Repo
from dvc.repo.experiments.executor.base import ExecutorInfo
from dvc.repo.experiments.utils import resolve_name
from dvc.utils.hydra import compose_and_dump, get_hydra_sweeps

from parity.commands import results
from parity.config import params as config
from parity.core import status
from parity.core.ui import Progress, dump_json, num, table

DONE = ("Success", "Failed")
STARTUP_S = 60.0  # how often (s) to ask whether a queue worker is alive while experiments wait


def expand(overrides: list[str]) -> list[list[str]]:
    """['dtypes=fp32,fp16', 'seed=1'] -> [['dtypes=fp32', 'seed=1'], ['dtypes=fp16', 'seed=1']], by
    DVC's Hydra sweep parser (lists `[a],[b]`, `range()`, `choice()`, quoted commas)."""
    for o in overrides:
        if "=" not in o and not o.startswith("~"):
            raise ValueError(f"sweep override '{o}' is not key=value (e.g. 'dtypes=fp32,fp16')")
    try:
        sweeps = get_hydra_sweeps({"params.yaml": list(overrides)})
    except Exception as e:  # Hydra's OverrideParseException, DVC's InvalidArgumentError (globs)
        cause = e.__cause__ or e
        raise ValueError(f"cannot parse {' '.join(map(repr, overrides))}: "
                         f"{' '.join(str(cause).split())}") from None
    return [list(s["params.yaml"]) for s in sweeps]


def keys_of(overrides: list[str]) -> list[str]:
    return [o.partition("=")[0].lstrip("+~") for o in overrides]


IDENTITY = ("parity sweep", "parity-sweep@localhost")  # who commits experiments when git knows nobody


def _git_config(key: str, cwd: str) -> str:
    try:
        p = subprocess.run(["git", "config", "--get", key], cwd=cwd, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL)
    except OSError:
        return ""
    return p.stdout.strip() if p.returncode == 0 else ""


def git_identity(cwd: str = ".") -> dict[str, str]:
    """GIT_AUTHOR_* / GIT_COMMITTER_* for DVC's experiment commits when git has no user.name or
    user.email (a fresh machine or container; DVC then fails with "Git user name and email must be
    configured"): what is configured, the rest from IDENTITY. {} when git has both, in its config or
    in those variables. Set only in the environment of the dvc processes parity starts."""
    if all(os.environ.get(f"GIT_{w}_{k}") for w in ("AUTHOR", "COMMITTER") for k in ("NAME", "EMAIL")):
        return {}
    name, email = _git_config("user.name", cwd), _git_config("user.email", cwd)
    if name and email:
        return {}
    return {f"GIT_{w}_{k}": os.environ.get(f"GIT_{w}_{k}") or v or dflt
            for w in ("AUTHOR", "COMMITTER") for k, v, dflt in (("NAME", name, IDENTITY[0]),
                                                                ("EMAIL", email, IDENTITY[1]))}


def _env(cwd: str = ".") -> dict:
    """PATH starts with this interpreter's bin dir: the queue worker DVC spawns runs `dvc` from PATH,
    and dvc.yaml's `python` is this (virtualenv) python. A git identity when none is configured."""
    e = dict(os.environ)
    e["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{e.get('PATH', '')}"
    e.setdefault("DVC_NO_ANALYTICS", "1")
    e.update(git_identity(cwd))
    return e


def _dvc(args: list[str], cwd: str) -> str:
    p = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, env=_env(cwd))
    if p.returncode != 0:
        raise RuntimeError(f"`dvc {' '.join(args)}` failed:\n{(p.stderr or p.stdout).strip()}")
    return p.stdout


def _dvc_detached(args: list[str], cwd: str) -> str:
    """A dvc command that forks a long-lived child (`queue start`): output through a file, so
    waiting for the command does not wait for the child that holds its output open."""
    with tempfile.TemporaryFile("w+") as f:
        p = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, stdout=f, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL, text=True, env=_env(cwd))
        f.seek(0)
        out = f.read()
    if p.returncode != 0:
        raise RuntimeError(f"`dvc {' '.join(args)}` failed:\n{out.strip()}")
    return out


def check_combo(combo: list[str], cwd: str = ".") -> str | None:
    """The one-line config error composing conf/ with these overrides gives, or None (composed into a
    temp file, validated with parity.config.params; params.yaml is not touched)."""
    root = Path(cwd).resolve()
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td) / "params.yaml"
        try:
            compose_and_dump(tmp, str(root / "conf"), None, "config", str(root), list(combo))
            config.load(tmp)
        except Exception as e:  # Hydra/OmegaConf raise several types; all mean a bad config
            msg = " ".join(str(e).split())
            return msg if msg.startswith("parity:") else f"parity: config error: {msg}"
    return None


def check_all(combos: list[list[str]], cwd: str = ".") -> None:
    """Raise ValueError naming the first combination that does not compose."""
    for combo in combos:
        msg = check_combo(combo, cwd)
        if msg:
            raise ValueError(f"{' '.join(combo)}: {msg} (nothing queued)")


def _sets(combo: list[str]) -> list[str]:
    return [a for o in combo for a in ("-S", o)]


class Queue:
    """DVC's experiment queue, read in-process (no `dvc` process per poll)."""

    def __init__(self, cwd: str, since: float | None = None):
        self.cwd = str(Path(cwd).resolve())
        # running experiment's workspace -> (its params.yaml's mtime, its cells' files)
        self._files: dict[str, tuple[int, dict]] = {}
        # a verdict is live when its file was written after this (the sweep's start): an experiment's
        # workspace starts with the base commit's outputs, other cells' and stale ones
        self.since = time.time() - 1.0 if since is None else since

    def _repo(self):
        return Repo(self.cwd)

    def status(self) -> tuple[dict[str, str], dict[str, str]]:
        """({name: Queued|Running|Success|Failed}, {name of a running experiment: its workspace})."""
        with warnings.catch_warnings(), self._repo() as repo:
            warnings.simplefilter("ignore", DeprecationWarning)
            q = repo.experiments.celery_queue
            st = {e["name"]: e["status"] for e in q.status() if e.get("name")}
            where = {}
            for entry in q.iter_active():
                try:
                    where[entry.name] = ExecutorInfo.load_json(q.get_infofile_path(entry.stash_rev)).root_dir
                except (OSError, ValueError, TypeError, KeyError, DvcException):
                    # the info file is written in place by the running executor: a read in the middle
                    # of that write is a JSONFileCorruptedError (a DvcException); the next poll reads it
                    pass
        return st, where

    def workers(self) -> int:
        """Live queue workers (a celery broadcast: ~1 s, so asked rarely)."""
        with warnings.catch_warnings(), self._repo() as repo:
            warnings.simplefilter("ignore", DeprecationWarning)
            return len(repo.experiments.celery_queue.worker_status())

    def live_verdicts(self, workspace: str) -> dict[str, str | None]:
        """{cell: verdict or None (not diffed yet)} in a running experiment's workspace: its cells as
        its params.yaml names them (resolved again when DVC writes the experiment's params), each
        verdict from a metrics file written since the sweep started (a diff restored from DVC's
        run-cache keeps its old time and shows at the end only)."""
        try:
            stamp = (Path(workspace) / "params.yaml").stat().st_mtime_ns
        except OSError:
            return {}
        if self._files.get(workspace, (None,))[0] != stamp:
            try:
                self._files[workspace] = (stamp, results.cell_files(workspace))
            except Exception:  # the workspace is being set up or already gone: try again next poll
                return {}
        out = {}
        for cell, f in self._files[workspace][1].items():
            try:
                fresh = f.metrics.stat().st_mtime >= self.since
                out[cell] = results.verdict(json.loads(f.metrics.read_text())) if fresh else None
            except (OSError, ValueError):
                out[cell] = None
        return out

    @staticmethod
    def activity(where: dict[str, str]) -> float:
        """The newest modification time of a file in a running experiment's artifacts/ (0.0: none):
        evidence a worker is alive that needs no celery broadcast."""
        newest = 0.0
        for ws in where.values():
            for d, _, files in os.walk(Path(ws) / "artifacts"):
                for f in files:
                    try:
                        newest = max(newest, os.stat(os.path.join(d, f)).st_mtime)
                    except OSError:  # removed while we looked
                        pass
        return newest

    def committed(self, names: list[str]) -> set[str]:
        """The experiments among `names` DVC has committed (an experiment ref exists: it succeeded)."""
        if not names:
            return set()
        with warnings.catch_warnings(), self._repo() as repo:
            warnings.simplefilter("ignore", DeprecationWarning)
            return {n for n, r in resolve_name(repo.scm, names).items() if r is not None}

    def metrics(self, names: list[str]) -> dict[str, dict]:
        """{experiment: {metrics path: data}} of finished experiments (DVC's metrics of their commits)."""
        with warnings.catch_warnings(), self._repo() as repo:
            warnings.simplefilter("ignore", DeprecationWarning)
            refs = resolve_name(repo.scm, names)
            revs = {n: repo.scm.get_ref(str(r)) for n, r in refs.items() if r is not None}
            shown = repo.metrics.show(revs=list(revs.values()), hide_workspace=True) if revs else {}
        out = {}
        for n, rev in revs.items():
            data = shown.get(rev, {}).get("data") or {}
            out[n] = {p: (d or {}).get("data") or {} for p, d in data.items() if "error" not in (d or {})}
        return out


def experiment_row(metrics: dict[str, dict]) -> dict:
    """Cell verdicts and counts of one experiment from its metrics files ({path: data})."""
    cells = results.experiment_cells(metrics)
    worst = max((v for v in (results.worst_ratio(m) for m in cells.values()) if v is not None), default=None)
    origins: dict[str, int] = {}
    for m in cells.values():
        o = results.drift_origin(m)
        if o:
            origins[o] = origins.get(o, 0) + 1
    verdicts = {c: results.verdict(m) for c, m in sorted(cells.items())}
    return {"cells": verdicts, "passed": sum(v == status.S.PASS for v in verdicts.values()),
            "failed": sum(v == status.S.FAIL for v in verdicts.values()),
            "not_run": sum(v not in status.VERDICTS for v in verdicts.values()),
            # issue 36 item 10: BASELINE (and NOT_EXERCISED) cells were in no count of the final table
            "baseline": sum(v == status.S.BASELINE for v in verdicts.values()),
            "not_exercised": sum(v == status.S.NOT_EXERCISED for v in verdicts.values()),
            "worst": worst, "drift_origins": dict(sorted(origins.items()))}


COUNTS = ("passed", "failed", "baseline", "not_exercised", "not_run")  # a cell's verdict, counted


def _counts(row: dict) -> str:
    return (f"{row['passed']} passed, {row['failed']} failed, {row['baseline']} baseline, "
            f"{row['not_exercised']} not exercised, {row['not_run']} not run")


def _run_first(combo: list[str], cwd: str, prog: Progress) -> str:
    """`dvc exp run --temp` in the foreground, its stages printed as they start; its name."""
    p = subprocess.Popen([sys.executable, "-m", "dvc", "exp", "run", "--temp", *_sets(combo)], cwd=cwd,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                         env=_env(cwd))
    lines = []
    for line in p.stdout:
        lines.append(line)
        m = re.match(r"Running stage '([^']+)'", line)
        if m:
            prog.line(f"parity sweep: {' '.join(combo)}: {m.group(1)}")
    if p.wait() != 0:
        raise RuntimeError(f"`dvc exp run --temp {' '.join(combo)}` failed:\n{''.join(lines[-15:]).strip()}")
    m = re.search(r"Ran experiment\(s\): (\S+)", "".join(lines))
    return m.group(1) if m else "?"


def log_tail(name: str, cwd: str, lines: int = 15) -> list[str]:
    """The last lines of a finished experiment's log (`dvc queue logs NAME`): why it failed, printed
    where the user looks; [] if DVC no longer has it."""
    try:
        out = _dvc(["queue", "logs", name], cwd)
    except RuntimeError:
        return []
    return [ln.rstrip() for ln in out.splitlines() if ln.strip()][-lines:]


class Liveness:
    """Whether the queue has no live worker (issue 36 item 10: "no DVC queue worker is alive" printed
    mid-sweep under load, then a normal finish). A worker busy on a loaded machine can miss celery's ~1 s
    broadcast, so one empty answer means nothing: dead only after two checks in a row that both found
    no worker and no progress since the check before (no verdict, no experiment done or started, no
    file written in a running experiment's workspace)."""

    def __init__(self):
        self.silent, self.last = 0, None

    def dead(self, workers: int, progress: tuple) -> bool:
        self.silent = self.silent + 1 if workers == 0 and progress == self.last else 0
        self.last = progress
        return self.silent >= 2


class Settle:
    """Which experiments are done, from DVC's queue status read once per poll (issue 36 item 10: an
    experiment printed "done: FAILED" 9 s in, while `dvc queue status` showed it Running, then ended
    Success). DVC's status is not atomic: a task between celery's queues is in none of them for a
    moment, and a task whose result file is not written yet reads as Failed. So an experiment is done
    only when the status is final: Success (or gone from the queue: DVC collected it) with its
    experiment committed (or Success read on CONFIRM polls in a row); Failed read on CONFIRM polls in
    a row with nothing committed; or gone from the queue with nothing committed for GONE polls in a row."""

    CONFIRM, GONE = 2, 15

    def __init__(self):
        self.reads: dict[str, tuple] = {}  # name -> (status read, on how many polls in a row)

    def update(self, st: dict[str, str | None], committed: set[str]) -> dict[str, str]:
        """{name: Success|Failed} of the experiments that are done now, from {name: queue status or None
        (not in the queue)} of those not yet done and the names DVC has committed."""
        done = {}
        for n, s in st.items():
            if s in ("Success", None) and n in committed:
                done[n] = "Success"
            elif s in DONE or s is None:  # final only when read the same on consecutive polls
                last, k = self.reads.get(n, (s, 0))
                self.reads[n] = (s, k + 1 if last == s else 1)
                if self.reads[n][1] >= (self.GONE if s is None else self.CONFIRM):
                    done[n] = s or "Failed"  # Success without a commit: its metrics are missing, said so
            else:
                self.reads.pop(n, None)  # Queued or Running: not done
        return done


def _watch(q: Queue, names: list[str], combos: dict[str, list[str]], prog: Progress, poll: float,
           first: dict[str, dict]) -> dict[str, str]:
    """Poll the queue until every experiment is done; print cell verdicts and experiment results as
    they come. Returns {name: final status}."""
    t0, seen, ended, warned = time.monotonic(), {}, dict.fromkeys(first, "Success"), False
    checked, alive, settle = t0, Liveness(), Settle()
    for n, row in first.items():
        prog.line(f"parity sweep: {n} ({' '.join(combos[n])}) done: {_counts(row)}", advance=1)
    while True:
        st, where = q.status()
        mine = {n: st.get(n) for n in names}  # None: not in the queue (collected, or between its lists)
        for n, ws in where.items():
            if n not in mine:
                continue
            for cell, v in q.live_verdicts(ws).items():
                if v and seen.get((n, cell)) != v:
                    seen[n, cell] = v
                    prog.line(f"parity sweep: {n}: {cell}: {v}")
        pending = {n: mine[n] for n in names if n not in ended}
        final = settle.update(pending, q.committed([n for n, s in pending.items() if s in (*DONE, None)]))
        new = [n for n in names if n in final]
        if new:
            rows = q.metrics([n for n in new if final[n] == "Success"])
            for n in new:
                ended[n] = final[n]
                what = _counts(experiment_row(rows[n])) if n in rows else "FAILED (`dvc queue logs " + n + "`)"
                prog.line(f"parity sweep: {n} ({' '.join(combos[n])}) done: {what}", advance=1)
                if n not in rows:
                    for ln in log_tail(n, q.cwd):
                        prog.line(f"parity sweep:   {n} | {ln}")
        running = [n for n in names if mine[n] == "Running"]
        status = (f"parity sweep: {len(ended)}/{len(names)} done, {len(running)} running, "
                  f"{sum(mine[n] == 'Queued' for n in names)} queued, {time.monotonic() - t0:.0f}s")
        for n in running:
            cells = [k for (e, k) in seen if e == n]
            status += f"; {n}: {len(cells)} cell(s) diffed"
        if len(ended) == len(names):
            return ended
        if not warned and time.monotonic() - checked > STARTUP_S:
            checked = time.monotonic()
            if alive.dead(q.workers(), (len(seen), len(ended), len(running), q.activity(where))):
                warned = True
                waiting = [n for n in names if n not in ended]
                prog.line(f"parity sweep: no DVC queue worker is alive while {', '.join(waiting)} wait(s): "
                          f"`dvc queue start -j N` starts one; a task shown Running without a worker needs "
                          f"`dvc queue kill NAME` and a new sweep")
        prog.heartbeat(status)
        time.sleep(poll)


def sweep(overrides: list[str], jobs: int = 1, cwd: str = ".", poll: float = 2.0, err=sys.stderr,
          out=sys.stdout, as_json: bool = False) -> int:
    combos = expand(overrides)
    keys = keys_of(overrides)
    check_all(combos, cwd)
    prog = Progress(len(combos), err, "parity sweep", every=4.0)
    try:
        prog.line(f"parity sweep: {len(combos)} experiments over {', '.join(keys)} with {jobs} worker(s)")
        ident = git_identity(cwd)
        if ident:
            prog.line(f"parity sweep: git has no user.name/user.email here: DVC commits the experiments as "
                      f"'{ident['GIT_AUTHOR_NAME']} <{ident['GIT_AUTHOR_EMAIL']}>' (`git config user.name NAME` "
                      f"and `git config user.email EMAIL` to use yours)")
        names, by_name, first = [], {}, {}
        rest = combos
        q = Queue(cwd)
        if jobs > 1 and len(combos) > 1:
            prog.line(f"parity sweep: running {' '.join(combos[0])} first, so shared stages run once")
            n = _run_first(combos[0], cwd, prog)
            names.append(n)
            by_name[n] = combos[0]
            first = {n: experiment_row(q.metrics([n]).get(n, {}))}
            rest = combos[1:]
        for combo in rest:
            log = _dvc(["exp", "run", "--queue", *_sets(combo)], cwd)
            m = re.search(r"Queued experiment '([^']+)'", log)
            if not m:
                raise RuntimeError(f"could not read the queued experiment's name from:\n{log}")
            names.append(m.group(1))
            by_name[m.group(1)] = combo
            prog.line(f"parity sweep: queued {m.group(1)} ({' '.join(combo)})")
        if rest:
            _dvc_detached(["queue", "start", "-j", str(jobs)], cwd)
        ended = _watch(q, names, by_name, prog, poll, first)
    finally:
        prog.close()
    rows = q.metrics([n for n in names if ended[n] == "Success"])
    return _finish(names, by_name, keys, ended, rows, as_json, out, err)


def _value(combo: list[str], key: str) -> str:
    for o in combo:
        k, _, v = o.partition("=")
        if k.lstrip("+~") == key:
            return v.strip("[]") if v.count("[") == 1 else v
    return "-"


def _finish(names, by_name, keys, ended, rows, as_json, out, err) -> int:
    exps = []
    for n in names:
        row = experiment_row(rows[n]) if n in rows else None
        exps.append({"name": n, "overrides": by_name[n], "status": ended[n] if row else "Failed",
                     **(row or {"cells": {}, **dict.fromkeys(COUNTS),
                                "worst": None, "drift_origins": {}})})
    failed = [e["name"] for e in exps if e["status"] != "Success"]
    if as_json:
        dump_json({"overrides": keys, "experiments": exps}, out)
    else:
        head = ["experiment", *keys, *(k.replace("_", " ") for k in COUNTS), "worst excess/limit", "drift origins"]
        table(head, [[e["name"], *(_value(e["overrides"], k) for k in keys),
                      *(str(e[k]) if e[k] is not None else "-" for k in COUNTS),
                      num(e["worst"]),
                      ", ".join(f"{o} ({c})" if c > 1 else o for o, c in e["drift_origins"].items()) or "-"]
                     for e in exps], out)
    tot = {k: sum(e[k] or 0 for e in exps) for k in COUNTS}
    print(f"parity sweep: {len(exps) - len(failed)}/{len(exps)} done: {tot['passed']} cells passed, "
          f"{tot['failed']} failed, {tot['baseline']} baseline, {tot['not_exercised']} not exercised, "
          f"{tot['not_run']} not run", file=err)
    if failed:
        print(f"parity sweep: experiments that did not finish: {', '.join(failed)} "
              f"(`dvc queue logs NAME` shows why)", file=err)
        return 1
    return 0
