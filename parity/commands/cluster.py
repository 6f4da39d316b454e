"""Cells across machines on Ray: `parity repro --cluster ADDRESS` and `parity worker` (docs/cluster.md).

A node joins with `parity worker --address HEAD` (a `ray start` whose custom resources this module
computes from what the env probe finds on the node): `provider:<name>` for every provider whose runner
is available there, and `gpu:<model>` per GPU model. `parity worker --resources` prints that JSON
for a plain `ray start --resources`.

The driver (`parity repro --cluster ADDRESS`, `auto` = the running local Ray instance, or a new one
advertising this machine's providers):
  1. upstream   `dvc repro -k` of the shared stages (env, inputs, export, reference, baseline), here, as
                `parity repro -j N` does; then `dvc push --run-cache` of them to the default DVC remote.
  2. cells      one Ray task per stale cell, asking for `provider:<its provider>` (a tiny share: the
                task's `num_cpus` limits how many run at once on a node), so a cell lands only on a
                node that advertises its provider. The task, on that node, in a work dir of its own
                ($PARITY_WORKDIR, set by `parity worker --workdir`, else ~/.cache/parity/cluster/<node>):
                checks out the driver's commit from a `git bundle` shipped through Ray (no shared git
                server needed, and the commit is exactly the driver's), writes the driver's dvc.lock
                files and .dvc/config.local (the remote), `dvc pull`s the upstream outputs the cell
                needs, runs `dvc repro --pull -s <its stages>` and `dvc push --run-cache` them, and
                returns the cell's verdict with the time of each phase. Tensors travel through the DVC
                remote, never through Ray's object store (only the bundle and a few lock files do).
  3. restore    `dvc repro --pull -s <every cell stage>` here: each restores from the run-cache that
                the nodes pushed ("is cached - skipping run"); then the report (a complete selection).
Faults: a node that dies mid-cell fails its task with a system error, and Ray retries it (max_retries)
on another node that advertises the provider; the dead attempt pushed nothing, or the same bytes.
A provider no alive node advertises is not submitted (Ray would wait for it forever): its cells run
here with PARITY_CLUSTER_UNAVAILABLE set, which the env probe records in provider-<name>.json (a dep,
so the run-cache never mixes it with a real run) and the capture turns into UNAVAILABLE "no node
advertises provider:<name>" (`strict: true` then fails the report naming the cell). Ctrl-C cancels
every remote task (force: the task's dvc dies with its worker) and exits 130.
Each remote cell's capture status.json gains `node` (hostname, Ray node id, the node's fingerprint of
the provider's components): PARITY_CLUSTER_NODE, set only here, so a run off a cluster writes the
same bytes as before.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Sequence, TextIO

import yaml

from parity.backends import CaptureJob, fingerprint, load_runner
from parity.commands import parallel
from parity.backends.fingerprint import CLUSTER_NODE_ENV, CLUSTER_UNAVAILABLE_ENV
from parity.core.io import write_json
from parity.core.ui import Progress, at_least

RES = "provider:"
GPU_RES = "gpu:"
CELL_SHARE = 0.001        # of a provider resource (a node advertises 1.0) that one cell asks for
MAX_RETRIES = 3           # Ray re-runs a task whose node or worker died this many times
CANCEL_WAIT_S = 30.0      # Ctrl-C: how long to wait for cancelled tasks to be gone
WORKDIR_ENV = "PARITY_WORKDIR"
MARKER = "running.json"   # in the node's work dir: the cell and phase its task is in (progress, tests)
LOCK_FILES = ("dvc.lock", "env/dvc.lock")
CACHED = re.compile(r"^Stage '([^']+)' is cached - skipping run", re.M)


# ---------------------------------------------------------------- node side: resources, worker

def _providers(root: Path) -> dict[str, dict]:
    """Every provider the project knows: conf/providers/*.yaml (the registry), else params.yaml's."""
    out: dict[str, dict] = {}
    for f in sorted((root / "conf" / "providers").glob("*.yaml")):
        out.update(yaml.safe_load(f.read_text()) or {})
    if not out and (root / "params.yaml").exists():
        out = yaml.safe_load((root / "params.yaml").read_text()).get("providers", {})
    return out


def provider_availability(name: str, pc: dict) -> str | None:
    """None if this machine can run provider `name`, else why not (its runner's own availability probe;
    for `engine: true` providers the runner's engine_availability)."""
    try:
        cls = load_runner(pc["runner"], pc.get("import"))
        if pc.get("engine"):
            return cls.engine_availability()
        dt = (pc.get("dtypes") or ["fp32"])[0]
        job = CaptureJob(model="probe", model_cfg={}, dtype=dt, dtype_cfg={}, provider=name, provider_cfg=pc,
                         model_dir=Path("."))
        return cls.availability(job)
    except Exception as e:  # a probe that raises means: not available here
        return f"{type(e).__name__}: {e}"


def node_resources(root: Path | str = ".") -> tuple[dict[str, float], dict[str, str]]:
    """({resource: amount} this node advertises, {provider: why not} for the ones it does not)."""
    res: dict[str, float] = {}
    missing: dict[str, str] = {}
    for name, pc in sorted(_providers(Path(root)).items()):
        why = provider_availability(name, pc)
        if why:
            missing[name] = why
        else:
            res[RES + name] = 1.0
    cuda = fingerprint.component("cuda")
    for gpu in cuda.get("gpus", []) if cuda.get("available") else []:
        key = GPU_RES + gpu.replace(" ", "_")
        res[key] = res.get(key, 0.0) + 1.0
    return res, missing


def worker_main(args: argparse.Namespace) -> int:
    """`parity worker`: print this node's resources, or `ray start` with them (joining --address)."""
    why = reachable(args.address, args.connect_timeout) if args.address else None
    if why:
        print(f"parity worker: no Ray head answers at {args.address!r}: {why}; start one with `parity worker "
              "--head` there (--connect-timeout S to wait longer)", file=sys.stderr)
        return 2
    res, missing = node_resources(args.root)
    if args.resources:
        print(json.dumps(res, sort_keys=True))
        return 0
    for name, why in sorted(missing.items()):
        print(f"parity worker: not advertising provider:{name}: {why}", file=sys.stderr)
    print(f"parity worker: advertising {', '.join(sorted(res)) or 'nothing'}", file=sys.stderr)
    cmd = [str(Path(sys.executable).parent / "ray"), "start", f"--resources={json.dumps(res, sort_keys=True)}"]
    cmd += ["--head"] if args.head else [f"--address={args.address}"]
    if args.num_cpus is not None:
        cmd.append(f"--num-cpus={args.num_cpus}")
    env = dict(os.environ)
    if args.workdir:
        env[WORKDIR_ENV] = str(Path(args.workdir).resolve())  # the raylet's env: its workers inherit it
    print("parity worker: " + " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.call(cmd, env=env)


def add_timeout_argument(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--connect-timeout", type=float, default=CONNECT_TIMEOUT_S, metavar="S",
                    help="seconds to wait for the Ray head to answer (default %(default)s)")


def add_worker_arguments(ap: argparse.ArgumentParser) -> None:
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--address", help="the Ray head to join, e.g. 10.0.0.1:6379")
    where.add_argument("--head", action="store_true", help="start a head node instead of joining one")
    where.add_argument("--resources", action="store_true",
                       help="only print this node's resources as JSON (for `ray start --resources`)")
    ap.add_argument("--workdir", help="where this node's checkouts live (default ~/.cache/parity/cluster/<node>)")
    ap.add_argument("--num-cpus", type=at_least(1), help="cells this node runs at once (default: Ray's CPU count)")
    ap.add_argument("--root", default=".", help="the project checkout whose conf/providers to probe (default .)")
    add_timeout_argument(ap)
    ap.set_defaults(fn=worker_main)


# ---------------------------------------------------------------- the task (runs on a node)

# Kills the process group argv[1] unless the Ray worker running the cell says "done" on stdin: a node
# that dies, or a task cancelled by Ctrl-C on the driver, closes the pipe without it (EOF), and no dvc
# and no stage process is left behind. It forks off at once, so it is not a child of the worker: on
# a cancel Ray kills the worker's own children (dvc's main process among them), but not dvc's stage
# command in dvc's process group, which this kills.
_WATCHDOG = """import os, signal, sys
if os.fork():
    os._exit(0)
if sys.stdin.buffer.read(1) != b"x":
    try:
        os.killpg(int(sys.argv[1]), signal.SIGKILL)
    except OSError:
        pass
"""


def _run(cmd: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`cmd` in a process group of its own, watched: if this worker dies, the whole group is killed."""
    p = subprocess.Popen(cmd, cwd=cwd, env=env or parallel._env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    w = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(p.pid)], stdin=subprocess.PIPE,
                         start_new_session=True)
    w.wait()  # the watchdog's first half; the second half holds the pipe's read end until we are done
    try:
        out, _ = p.communicate()
        if p.returncode < 0:  # dvc was killed (a cancel, the OOM killer): its stage commands may live on
            with contextlib.suppress(OSError):
                os.killpg(p.pid, signal.SIGKILL)
    finally:
        with contextlib.suppress(OSError):
            w.stdin.write(b"x")
            w.stdin.close()
    return subprocess.CompletedProcess(cmd, p.returncode, out, None)


@contextlib.contextmanager
def _slot(base: Path):
    """One checkout per concurrent task on a node: the first free base/slot-<k> (an flock)."""
    base.mkdir(parents=True, exist_ok=True)
    for k in range(1024):
        f = open(base / f"slot-{k}.lock", "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            continue
        try:
            yield base / f"slot-{k}"
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
            f.close()
        return
    raise RuntimeError(f"no free checkout slot under {base}")


def _checkout(repo: Path, base: Path, bundle: bytes, commit: str, files: dict[str, str]) -> None:
    """The driver's commit in `repo` (cloned from, then fetched from, the bundle), plus its lock files
    and .dvc/config.local. Outputs already in the workspace stay: `dvc pull` / `repro` update them."""
    b = base / "bundles" / f"{commit}.bundle"
    if not b.exists():
        b.parent.mkdir(parents=True, exist_ok=True)
        tmp = b.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(bundle)
        tmp.replace(b)
    if not (repo / ".git").exists():
        r = _run(["git", "clone", "-q", "--no-checkout", str(b), str(repo)], base)
    else:
        r = _run(["git", "fetch", "-q", str(b), commit], repo)
    if r.returncode == 0:
        r = _run(["git", "checkout", "-q", "-f", "--detach", commit], repo)
    if r.returncode:
        raise RuntimeError(f"checkout of {commit[:12]} failed: {r.stdout.strip()}")
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            (repo / rel).unlink(missing_ok=True)
        else:
            (repo / rel).write_text(text)


def run_cell(bundle: bytes, commit: str, files: dict[str, str | None], cell: str, stages: list[str],
             pull: list[str], metrics: list[str], unavailable: str) -> dict:
    """One cell on this node (a Ray task): checkout, pull, repro, push; what happened, with the
    seconds of each phase."""
    import ray  # optional: Ray is the parity[cluster] extra

    node = {"hostname": socket.gethostname(), "ray_node_id": ray.get_runtime_context().get_node_id()}
    base = Path(os.environ.get(WORKDIR_ENV) or Path.home() / ".cache" / "parity" / "cluster" / node["ray_node_id"][:16])
    secs: dict[str, float] = {}
    out = {"cell": cell, "node": node, "workdir": str(base), "secs": secs, "ran": [], "restored": [],
           "ok": False, "why": ""}
    env = parallel._env()
    env[CLUSTER_NODE_ENV] = json.dumps(node, sort_keys=True)
    if unavailable:
        env[CLUSTER_UNAVAILABLE_ENV] = unavailable
    steps = (("pull", ["pull", *pull]), ("run", ["repro", "--pull", "-s", *stages]),
             ("push", ["push", "--run-cache", *stages]))
    with _slot(base) as repo:
        entered: list[str] = []

        def phase(name: str) -> float:
            entered.append(name)
            write_json(base / MARKER, {"cell": cell, "phase": name, "phases": entered, "pid": os.getpid(),
                                       "slot": repo.name})
            return time.perf_counter()

        t = phase("checkout")
        _checkout(repo, base, bundle, commit, files)
        secs["checkout"] = time.perf_counter() - t
        for name, args in steps:
            t = phase(name)
            r = _run([sys.executable, "-m", "dvc", *args], repo, env)
            secs[name] = time.perf_counter() - t
            if name == "run":
                out["ran"], out["restored"] = parallel.RUNNING.findall(r.stdout), CACHED.findall(r.stdout)
            if r.returncode:
                out["why"], out["log"] = f"dvc {name} exited {r.returncode}", parallel._tail(r.stdout)
                break
        else:
            out["ok"] = True
        phase("done")
        out["verdict"], out["origin"] = parallel.cell_verdict([str(repo / f) for f in metrics])
    return out


# ---------------------------------------------------------------- driver

class ClusterError(RuntimeError):
    pass


def _git(root: Path, *args: str) -> str:
    r = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if r.returncode:
        raise ClusterError(f"git {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def _bundle(root: Path) -> tuple[str, bytes]:
    """(HEAD's sha, a git bundle of it). Refuses tracked changes other than DVC's lock files: the
    nodes run the commit, so an uncommitted edit would give a result that belongs to no commit."""
    dirty = [ln[3:] for ln in _git(root, "status", "--porcelain", "--untracked-files=no").splitlines()
             if ln[3:] not in LOCK_FILES]
    if dirty:
        raise ClusterError("uncommitted changes to " + ", ".join(dirty) + ": the nodes run the commit "
                           "(git commit them first)")
    commit = _git(root, "rev-parse", "HEAD").strip()

    with tempfile.TemporaryDirectory() as d:
        _git(root, "bundle", "create", "-q", f"{d}/b.bundle", "HEAD")
        return commit, Path(f"{d}/b.bundle").read_bytes()


CONNECT_TIMEOUT_S = 5.0  # how long `repro --cluster` / `worker --address` wait for the head to answer


def reachable(address: str, timeout: float) -> str | None:
    """None if a TCP connection to the Ray head `address` (host:port, ray://host:port; port 6379 when
    none is given) opens within `timeout` seconds, else why not: Ray itself retries for minutes."""
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    host, port = (host, port) if sep and port.isdigit() else (hostport, "6379")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock:
            return _speaks_grpc(sock, f"{host}:{port}", timeout)
    except OSError as e:
        return f"{host}:{port}: {e.strerror or type(e).__name__} (waited at most {timeout:g}s)"


H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + an empty SETTINGS frame


def _speaks_grpc(sock: socket.socket, where: str, timeout: float) -> str | None:
    """None when the listener answers an HTTP/2 client preface with a SETTINGS frame, as a Ray head's GCS
    (gRPC) and a Ray client server do at once; else why not. Something else listening (issue 36 item 6:
    Ray retried it every ~40 s and never returned) is told apart within `timeout`."""
    sock.settimeout(timeout)
    try:
        sock.sendall(H2_PREFACE)
        head = b""
        while len(head) < 9:
            chunk = sock.recv(9 - len(head))
            if not chunk:
                break
            head += chunk
    except socket.timeout:
        return f"{where}: a program listens there but does not answer as a Ray head (no gRPC reply in {timeout:g}s)"
    except OSError as e:
        return f"{where}: {e.strerror or type(e).__name__} while greeting it as a Ray head"
    if len(head) < 9 or head[3] != 4:  # frame type 4: SETTINGS
        return f"{where}: a program listens there but it is not a Ray head (it does not speak gRPC)"
    return None


def connect(address: str, root: Path, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """ray.init: `auto` joins the local instance (`ray start`) or starts one that advertises this
    machine's providers; anything else is a Ray address, which must answer within `timeout` s."""
    import ray  # optional: Ray is the parity[cluster] extra

    quiet = dict(log_to_driver=False, logging_level="WARNING", configure_logging=True)
    if address != "auto":
        why = reachable(address, timeout)
        if why:
            raise ClusterError(f"no Ray head answers: {why}; start one (`parity worker --head`) or pass its "
                               "address (--connect-timeout S to wait longer)")
        ray.init(address=address, **quiet)
        return
    try:
        ray.init(address="auto", **quiet)
    except ConnectionError:
        res, _ = node_resources(root)
        ray.init(resources=res, include_dashboard=False, **quiet)


def offered() -> set[str]:
    """Providers some alive node advertises."""
    import ray  # optional: Ray is the parity[cluster] extra

    return {k[len(RES):] for n in ray.nodes() if n.get("Alive") for k in n.get("Resources", {})
            if k.startswith(RES)}


_PROVIDERS: list[str] = []  # params.yaml's providers, longest first (set by repro)


def _provider(cell: str) -> str:
    """The provider of cell `model-dtype-provider` (names may hold '-': matched against params)."""
    return next((p for p in _PROVIDERS if cell.endswith("-" + p)), cell.rsplit("-", 1)[-1])


def repro(address: str, *, providers: Sequence[str] = (), models: Sequence[str] = (), dtypes: Sequence[str] = (),
          root: Path | str = ".", report: bool | None = None, progress: TextIO | None = None,
          connect_timeout: float = CONNECT_TIMEOUT_S) -> parallel.Result:
    """`parity repro --cluster ADDRESS`: see the module docstring. Returns parallel.Result (returncode
    0 / 1 a cell or stage failed / 2 bad selection or setup / 130 Ctrl-C)."""
    out = progress if progress is not None else sys.stderr
    root = Path(root).resolve()
    try:
        pl = parallel.plan(root, providers=providers, models=models, dtypes=dtypes)
        commit, bundle = _bundle(root)
    except (parallel.SelectionError, FileNotFoundError, KeyError, ClusterError) as e:
        print(f"parity: repro --cluster: {e}", file=out)
        return parallel.Result(2)
    if not pl.cells:
        print("parity: repro --cluster: the filters select no cell", file=out)
        return parallel.Result(2)

    _PROVIDERS[:] = sorted(yaml.safe_load((root / "params.yaml").read_text())["providers"], key=len, reverse=True)
    import ray  # optional: Ray is the parity[cluster] extra

    try:
        connect(address, root, connect_timeout)
    except Exception as e:  # noqa: BLE001 (Ray raises several kinds: all mean no cluster)
        print(f"parity: repro --cluster: cannot reach Ray at {address!r}: {' '.join(str(e).split())}", file=out)
        return parallel.Result(2)
    old = os.environ.get(CLUSTER_UNAVAILABLE_ENV)
    try:
        have = offered()
        unavailable = {p: f"no node advertises {RES}{p}" for p in sorted({_provider(c) for c in pl.cells} - have)}
        if unavailable:  # every dvc this driver starts sees it (parallel._env copies os.environ)
            os.environ[CLUSTER_UNAVAILABLE_ENV] = json.dumps(unavailable, sort_keys=True)
        else:
            os.environ.pop(CLUSTER_UNAVAILABLE_ENV, None)
        with parallel.repo_lock(root):
            return _drive(pl, root, commit, bundle, unavailable, report, out)
    except parallel.Locked as e:
        print(f"parity: repro --cluster: {e}", file=out, flush=True)
        return parallel.Result(2)
    finally:
        if old is None:
            os.environ.pop(CLUSTER_UNAVAILABLE_ENV, None)
        else:
            os.environ[CLUSTER_UNAVAILABLE_ENV] = old
        ray.shutdown()


def _drive(pl: parallel.Plan, root: Path, commit: str, bundle: bytes, unavailable: dict[str, str],
           report: bool | None, out: TextIO) -> parallel.Result:
    t0 = time.perf_counter()
    res = parallel.Result(0)
    nodes = _nodes_line()
    print(f"parity: {len(pl.cells)} cells on Ray ({nodes}), commit {commit[:12]}", file=out, flush=True)
    for p, why in unavailable.items():
        print(f"parity: {p}: {why}: its cells run here as UNAVAILABLE", file=out, flush=True)
    # 1. upstream here, then on the remote
    if pl.upstream:
        r = parallel._dvc(["repro", "-k", *pl.upstream], root)
        res.ran += parallel.RUNNING.findall(r.stdout)
        if r.returncode:
            res.failed["upstream"] = "dvc repro of the shared stages failed"
            print(f"parity: upstream FAILED\n{parallel._tail(r.stdout)}", file=out, flush=True)
            return _finish(res, t0, out)
        r = parallel._dvc(["push", "--run-cache", *pl.upstream], root)
        if r.returncode:
            res.failed["upstream"] = "dvc push failed (is a default DVC remote configured? docs/cluster.md)"
            print(f"parity: push FAILED\n{parallel._tail(r.stdout)}", file=out, flush=True)
            return _finish(res, t0, out)
        print(f"parity: upstream: {len(res.ran)} stage(s) ran, pushed", file=out, flush=True)
    # 2. stale cells on the cluster
    stale = parallel._stale(root, [s for c in pl.cells for s in pl.cell_stages[c]])
    todo = [c for c in pl.cells if stale is None or any(s in stale for s in pl.cell_stages[c])]
    remote = [c for c in todo if _provider(c) not in unavailable]
    res.cells_run = list(todo)
    placed = _submit(pl, root, commit, bundle, remote, res, out)
    if res.returncode:
        return _finish(res, t0, out)
    # 3. restore every cell here from the run-cache the nodes pushed (unavailable ones run here)
    stages = [s for c in todo if c not in res.failed for s in pl.cell_stages[c]]
    if stages:
        r = parallel._dvc(["repro", "--pull", "-s", *stages], root)
        ran = parallel.RUNNING.findall(r.stdout)
        res.ran += ran
        local = [s for s in ran if "@" in s and _cell_of(s) in remote]
        if r.returncode:
            res.failed["restore"] = "dvc repro --pull of the cells failed"
            print(f"parity: restore FAILED\n{parallel._tail(r.stdout)}", file=out, flush=True)
        print(f"parity: restored {len(CACHED.findall(r.stdout))} stage(s) from the run-cache"
              + (f"; ran here: {', '.join(ran)}" if ran else ""), file=out, flush=True)
        if local:
            print(f"parity: warning: {', '.join(local)} ran here, not restored from a node", file=out, flush=True)
        _check_placement(root, placed, out)
    _report(pl, root, res, report, out)
    return _finish(res, t0, out)


def _rel(path: str, root: Path) -> str:
    p = Path(path)
    return str(p.relative_to(root)) if p.is_absolute() else path


def _cell_of(stage: str) -> str:
    return stage.split("@", 1)[1]


def _nodes_line() -> str:
    import ray  # optional: Ray is the parity[cluster] extra

    alive = [n for n in ray.nodes() if n.get("Alive")]
    return f"{len(alive)} node(s): " + "; ".join(
        f"{n['NodeID'][:8]} {', '.join(sorted(k[len(RES):] for k in n['Resources'] if k.startswith(RES))) or '-'}"
        for n in alive)


def _submit(pl: parallel.Plan, root: Path, commit: str, bundle: bytes, cells: list[str], res: parallel.Result,
            out: TextIO) -> dict[str, dict]:
    """Phase 2: one task per cell, progress per finished cell; Ctrl-C cancels them all. Returns
    {cell: the task's result} for the cells that completed on a node."""
    import ray  # optional: Ray is the parity[cluster] extra

    if not cells:
        return {}
    files = {rel: ((root / rel).read_text() if (root / rel).exists() else None) for rel in LOCK_FILES}
    cfg = root / ".dvc" / "config.local"
    files[".dvc/config.local"] = cfg.read_text() if cfg.exists() else None
    bref = ray.put(bundle)
    task = ray.remote(run_cell)
    refs = {}
    for c in cells:
        opts = task.options(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False,
                            resources={RES + _provider(c): CELL_SHARE})
        refs[opts.remote(bref, commit, files, c, pl.cell_stages[c], sorted(pl.needs[c]),
                         [_rel(m, root) for m in pl.metrics.get(c, [])],
                         os.environ.get(CLUSTER_UNAVAILABLE_ENV, ""))] = c

    prog = Progress(len(cells), out, "parity repro --cluster", every=30.0)
    done: dict[str, dict] = {}
    per_node: dict[str, int] = {}
    pending = list(refs)
    # Ctrl-C sets a flag the loop reads between two ray.wait polls, instead of raising
    # KeyboardInterrupt wherever the main thread is, e.g. inside Ray's client code holding its locks,
    # after which the cancel below could hang (a CI run at load: the driver never exited). A second
    # Ctrl-C, while the cancel waits, raises as before.
    stop = _Interrupted()
    old = signal.signal(signal.SIGINT, stop.handler) if threading.current_thread() is threading.main_thread() else None
    try:
        while pending and not stop.set:
            ready, pending = ray.wait(pending, num_returns=1, timeout=1.0)
            for ref in ready:
                _collect(refs[ref], ref, res, prog, done, per_node)
            prog.heartbeat(f"parity: {prog.done}/{len(cells)} cells done, {len(pending)} running or queued "
                           f"(done per node: {_per_node(per_node)})")
        if stop.set:
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)  # force: the worker process dies, and with it the cell's dvc group
            res.failed[refs[ref]] = "cancelled (Ctrl-C)"
        # cancel is asynchronous: wait until every task is gone before the driver (and its job) ends
        ray.wait(pending, num_returns=len(pending), timeout=CANCEL_WAIT_S)
        res.returncode = 128 + signal.SIGINT
        print(f"parity: interrupted: cancelled {len(pending)} remote task(s)", file=out, flush=True)
    finally:
        if old is not None:
            signal.signal(signal.SIGINT, old)
        prog.close()
    print(f"parity: cells per node: {_per_node(per_node)}", file=out, flush=True)
    return done


class _Interrupted:
    """SIGINT as a flag (_submit): the first sets it; the next raises KeyboardInterrupt."""

    def __init__(self):
        self.set = False

    def handler(self, signum, frame):
        if self.set:
            raise KeyboardInterrupt
        self.set = True


def _per_node(per_node: dict[str, int]) -> str:
    return ", ".join(f"{h} {n}" for h, n in sorted(per_node.items())) or "none yet"


def _collect(cell: str, ref, res: parallel.Result, prog, done: dict, per_node: dict) -> None:
    """One finished task: its line (verdict, node, seconds per phase), its failure if any."""
    import ray  # optional: Ray is the parity[cluster] extra

    try:
        r = ray.get(ref)
    except Exception as e:  # noqa: BLE001 (the task raised, or its node died MAX_RETRIES + 1 times)
        res.failed[cell] = f"task failed: {(str(e).strip().splitlines() or [type(e).__name__])[-1][:300]}"
        prog.line(f"parity: {cell}: FAILED ({res.failed[cell]})", advance=1)
        return
    host = f"{r['node']['hostname']}/{r['node']['ray_node_id'][:8]}"
    per_node[host] = per_node.get(host, 0) + 1
    res.ran += r["ran"]
    where = f"on {host}: " + ", ".join(f"{k} {v:.1f}s" for k, v in r["secs"].items())
    if r["ok"]:
        done[cell] = r
        state = (r.get("verdict") or "ok") + (f" (drift origin {r['origin']})" if r.get("origin") else "")
    else:
        res.failed[cell] = f"{r['why']} on {host}"
        state = f"FAILED ({r['why']})"
    prog.line(f"parity: {prog.done + 1}/{prog.total}  {cell}: {state} {where}", advance=1)
    if not r["ok"] and r.get("log"):
        prog.line(r["log"])


def _check_placement(root: Path, placed: dict[str, dict], out: TextIO) -> None:
    """The restored capture's status.json must name the node whose task returned (run-cache restores
    the newest entry: a second attempt of the same cell would show here)."""
    for c, r in placed.items():
        st = root / "artifacts" / "capture" / c / "status.json"
        if not st.exists():
            continue
        node = json.loads(st.read_text()).get("node", {})
        if node.get("ray_node_id") != r["node"]["ray_node_id"]:
            print(f"parity: warning: {c}: restored status.json names node {node.get('ray_node_id', '?')[:8]}, "
                  f"the task ran on {r['node']['ray_node_id'][:8]}", file=out, flush=True)


def _report(pl: parallel.Plan, root: Path, res: parallel.Result, report: bool | None, out: TextIO) -> None:
    run_down = pl.complete if report is None else report
    if not (pl.downstream and run_down):
        return
    if [c for c in pl.cells if c in res.failed] or "restore" in res.failed:
        res.report_skipped = True
        print(f"parity: {', '.join(pl.downstream)} not run: a cell failed", file=out, flush=True)
        return
    r = parallel._dvc(["repro", "-s", *pl.downstream], root)
    res.ran += parallel.RUNNING.findall(r.stdout)
    if r.returncode:
        res.failed["report"] = f"{', '.join(pl.downstream)} exited {r.returncode}"
        print(f"parity: {', '.join(pl.downstream)} FAILED\n{parallel._tail(r.stdout)}", file=out, flush=True)


def _finish(res: parallel.Result, t0: float, out: TextIO) -> parallel.Result:
    res.seconds = time.perf_counter() - t0
    if not res.returncode:
        res.returncode = 1 if res.failed else 0
    if res.failed:
        print(f"parity: {len(res.failed)} failed: " + "; ".join(f"{k}: {v}" for k, v in res.failed.items()),
              file=out, flush=True)
    else:
        print(f"parity: done on the cluster: {len(res.cells_run)} cell(s), {res.seconds:.1f}s", file=out, flush=True)
    return res


def run_from_args(args: argparse.Namespace) -> int:
    return repro(args.cluster, providers=args.provider, models=args.model, dtypes=args.dtype,
                 report=args.report, connect_timeout=args.connect_timeout).returncode
