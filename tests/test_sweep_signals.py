"""Lost control: SIGTERM to `parity repro -j 2` mid-run leaves no process behind and the repo usable
(a following `dvc repro` works); `parity sweep` with one bad combination queues nothing. Real DVC in
a temp repo, real stage processes, no mocks."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import BIN, ENV, env, make_repo, ran_stages


def _procs() -> dict[int, tuple[int, int, str, str]]:
    """pid -> (ppid, pgrp, state, cmdline) of every process, from /proc."""
    out = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        f = stat[stat.rfind(")") + 2:].split()
        out[int(d.name)] = (int(f[1]), int(f[2]), f[0], cmd)
    return out


def _descendants(root: int, procs: dict) -> set[int]:
    found, todo = set(), [root]
    while todo:
        p = todo.pop()
        kids = {q for q, (pp, *_rest) in procs.items() if pp == p}
        todo += list(kids - found)
        found |= kids
    return found


def _alive(pids: set[int], pgids: set[int]) -> list[str]:
    """Live (non-zombie) processes among `pids` or in the process groups `pgids`."""
    return [f"{p} {cmd[:120]}" for p, (_pp, g, st, cmd) in _procs().items()
            if (p in pids or g in pgids) and st not in ("Z", "X")]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_to_parallel_repro_leaves_nothing_running(tmp_path, sig):
    """A CI timeout (SIGTERM) or Ctrl-C (SIGINT) while cells run: parity forwards it to every dvc
    process group (dvc and the stage processes it spawned), exits 128+signal with nothing left
    running, and DVC's locks are free for the next `dvc repro`."""
    repo = make_repo(tmp_path / "repo")
    # captures that run until stopped: the signal lands while cell stages are running
    repo.edit("conf/config.yaml", "repeats: 2", "repeats: 50000000")
    repo.run([f"{BIN}/parity", "compose"])
    repo.commit("long captures")
    log = (tmp_path / "repro.log").open("w")
    p = subprocess.Popen([f"{BIN}/parity", "repro", "-j", "2"], cwd=repo.path, env=env(), stdout=log,
                         stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 900  # the shared upstream stages run first
    seen: set[int] = set()
    while time.monotonic() < deadline and p.poll() is None:
        procs = _procs()
        kids = _descendants(p.pid, procs)
        seen |= kids
        if any("stages.capture" in procs[k][3] for k in kids if k in procs):
            break
        time.sleep(0.2)
    assert p.poll() is None, (tmp_path / "repro.log").read_text()
    procs = _procs()
    kids = _descendants(p.pid, procs)
    seen |= kids
    groups = {procs[k][1] for k in kids if k in procs}
    assert any("stages.capture" in procs[k][3] for k in kids if k in procs)
    p.send_signal(sig)
    rc = p.wait(timeout=300)
    out = (tmp_path / "repro.log").read_text()
    assert rc == 128 + sig, out
    assert f"stopped by {sig.name}" in out, out
    assert _alive(seen, groups) == [], out
    # the repo is usable right away: no lock held, no stage left half-done
    repo.edit("conf/config.yaml", "repeats: 50000000", "repeats: 2")
    repo.run([f"{BIN}/parity", "compose"])
    r = repo.run(["dvc", "repro"], check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    for bad in ("unable to acquire lock", "is busy", "had been killed", "rwlock"):
        assert bad not in (r.stdout + r.stderr).lower(), r.stdout + r.stderr
    assert sum(s.startswith("capture@") for s in ran_stages(r.stdout)) == 4
    import json

    assert set(json.loads(repo.run(["dvc", "status", "--json"]).stdout or "{}")) <= {ENV}  # always_changed


def test_sweep_with_a_bad_combination_queues_nothing(tmp_path):
    repo = make_repo(tmp_path / "repo")
    p = repo.run([f"{BIN}/parity", "sweep", "dtypes=fp32,fp13"], check=False)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("parity sweep: dtypes=fp13: parity: config error:") and "fp13" in lines[0], lines
    assert "nothing queued" in lines[0]
    q = repo.run(["dvc", "queue", "status"]).stdout
    assert not [ln for ln in q.splitlines()[1:] if ln.split() and ln.split()[-1] in ("Queued", "Running")], q
    assert repo.run(["dvc", "exp", "list", "--all-commits"]).stdout.strip() == ""
    assert not (repo.path / "artifacts").exists()
