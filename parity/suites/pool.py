"""A pool of long-lived worker processes (parity.suites.worker), restarted only after a crash or a
timeout, so one bad kernel costs one case and a sweep always finishes. Light: no torch here.

Each case runs with a per-case time limit that starts when a ready worker receives it (worker
start-up, ~1.5 s of imports, is not counted). Statuses the pool decides:
  CRASH    the worker died while running the case (signal or exit code in the reason)
  TIMEOUT  the case ran past its limit; the worker is killed and replaced
"""

from __future__ import annotations

import os
import pickle
import selectors
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_START_FAILURES = 3


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "worker died (exit status unknown)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"worker killed by {name} (signal {-code})"
    return f"worker exited with code {code}"


class _Worker:
    def __init__(self, env: dict, stderr):
        self.proc = subprocess.Popen([sys.executable, "-m", "parity.suites.worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=stderr, env=env, cwd=os.getcwd())
        self.buf = b""
        self.ready = False
        self.job: int | None = None
        self.deadline = 0.0
        self.started = time.monotonic()
        os.set_blocking(self.proc.stdout.fileno(), False)

    def send(self, obj) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self.proc.stdin.write(struct.pack("<I", len(data)) + data)
        self.proc.stdin.flush()

    def feed(self) -> tuple[list, bool]:
        """Read what is available: (messages, eof)."""
        msgs, eof = [], False
        while True:
            try:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
            except BlockingIOError:
                break
            if not chunk:
                eof = True
                break
            self.buf += chunk
        while len(self.buf) >= 4:
            (n,) = struct.unpack("<I", self.buf[:4])
            if len(self.buf) < 4 + n:
                break
            msgs.append(pickle.loads(self.buf[4:4 + n]))
            self.buf = self.buf[4 + n:]
        return msgs, eof

    def kill(self) -> int | None:
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        return self.proc.wait()

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()


class Pool:
    """Run cases (each a dict sent to the worker with `cell`) on `workers` processes.

    run() returns one result per case, in case order; counters: restarts, crashes, timeouts."""

    def __init__(self, workers: int = 2, threads: int = 1, quiet: bool = True):
        self.n = max(1, int(workers))
        self.env = dict(os.environ, PARITY_SUITE_THREADS=str(threads), OMP_NUM_THREADS=str(max(threads, 1)),
                        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        self.stderr = subprocess.DEVNULL if quiet else None
        self.workers: list[_Worker] = []
        self.restarts = self.crashes = self.timeouts = 0
        self.start_failures = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        for w in self.workers:
            w.close()
        self.workers = []

    def _spawn(self) -> _Worker:
        return _Worker(self.env, self.stderr)

    def run(self, cases: list[dict], cell: dict, timeout_s: float | list[float]) -> list[dict]:
        # long: one select() loop whose closures share the worker, deadline and result state
        n = len(cases)
        limits = timeout_s if isinstance(timeout_s, list) else [float(timeout_s)] * n
        results: list[dict | None] = [None] * n
        todo = list(range(n))[::-1]
        while len(self.workers) < min(self.n, max(n, 1)):
            self.workers.append(self._spawn())
        sel = selectors.DefaultSelector()
        for w in self.workers:
            sel.register(w.proc.stdout, selectors.EVENT_READ, w)
        done = 0

        def finish(i, res):
            nonlocal done
            results[i] = res
            done += 1

        def replace(w):
            sel.unregister(w.proc.stdout)
            self.workers.remove(w)
            nw = self._spawn()
            self.workers.append(nw)
            sel.register(nw.proc.stdout, selectors.EVENT_READ, nw)
            self.restarts += 1

        def dispatch(w):
            if todo and w.ready and w.job is None:
                i = todo.pop()
                w.job = i
                w.deadline = time.monotonic() + limits[i]
                try:
                    w.send({"case": cases[i], "cell": cell})
                except (BrokenPipeError, OSError):
                    pass  # the read side sees EOF and reports CRASH

        while done < n:
            for w in self.workers:  # warm idle workers send nothing: hand them work now, not on an event
                dispatch(w)
            busy = [w for w in self.workers if w.job is not None]
            now = time.monotonic()
            wait = min([w.deadline - now for w in busy], default=1.0)
            events = sel.select(timeout=max(0.0, min(wait, 1.0)))
            for key, _ in events:
                w = key.data
                if w not in self.workers:
                    continue
                msgs, eof = w.feed()
                for m in msgs:
                    if not w.ready:
                        w.ready = bool(m.get("ready"))
                        self.start_failures = 0
                    elif w.job is not None:
                        i, w.job = w.job, None
                        finish(i, m)
                if eof:
                    code = w.kill()
                    if w.job is not None:
                        i, w.job = w.job, None
                        self.crashes += 1
                        finish(i, {"status": "CRASH", "reason": f"{_describe_exit(code)} while running this case"})
                    elif not w.ready:
                        self.start_failures += 1
                        if self.start_failures >= MAX_START_FAILURES:
                            why = f"suite worker failed to start {MAX_START_FAILURES} times ({_describe_exit(code)})"
                            while todo:
                                finish(todo.pop(), {"status": "UNAVAILABLE", "reason": why})
                    if done < n:
                        replace(w)
                    else:
                        sel.unregister(w.proc.stdout)
                        self.workers.remove(w)
                elif w.job is None:
                    dispatch(w)
            now = time.monotonic()
            for w in list(self.workers):
                if w.job is not None and now > w.deadline:
                    i, w.job = w.job, None
                    w.kill()
                    self.timeouts += 1
                    finish(i, {"status": "TIMEOUT", "reason": f"ran past the per-case limit of {limits[i]:g} s "
                                                              f"(worker killed and replaced)"})
                    if done < n:
                        replace(w)
                    else:
                        sel.unregister(w.proc.stdout)
                        self.workers.remove(w)
            for w in self.workers:
                dispatch(w)
        sel.close()
        return results  # type: ignore[return-value]
