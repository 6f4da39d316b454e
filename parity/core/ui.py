"""Terminal output of the `parity` command line: tables, progress lines, JSON.

On a terminal, tables and progress are drawn with rich (installed with DVC); anywhere else (a pipe,
a file, CI logs) they are plain text lines with no escape codes, so `| grep`, `| head` and log files
read the same. JSON goes to stdout, sorted keys, one document per command (docs/cli-json.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import TextIO

VERDICT_STYLE = {"PASS": "green", "FAIL": "bold red", "NOT_EXERCISED": "yellow", "BASELINE": "cyan"}


def at_least(lo: int):
    """An argparse `type=` for a count: an integer >= lo, else argparse's one-line usage error."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {v}")
        return v

    parse.__name__ = f"integer >= {lo}"
    return parse


def is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


def _console(stream: TextIO):
    # lazy: rich.console +0.04 s (BENCHMARKS 22); plain_table/dump_json users never draw with rich
    from rich.console import Console

    return Console(file=stream, highlight=False, soft_wrap=False)


def plain_table(head: list[str], rows: list[list[str]]) -> str:
    """The one plain-text table: left-aligned columns two spaces apart, a dashed rule under the head."""
    rows = [[str(x) for x in r] for r in rows]
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    fmt = lambda r: "  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def table(head: list[str], rows: list[list[str]], out: TextIO = sys.stdout, title: str | None = None) -> None:
    """A table: rich on a terminal (verdicts coloured), plain aligned columns elsewhere."""
    if not is_tty(out):
        if title:
            print(title, file=out)
        print(plain_table(head, rows), file=out)
        return
    # lazy: rich.console +0.04 s (BENCHMARKS 22); plain_table/dump_json users never draw with rich
    from rich.table import Table

    t = Table(*head, title=title, title_justify="left", header_style="bold")
    for r in rows:
        t.add_row(*(f"[{VERDICT_STYLE[x]}]{x}[/]" if x in VERDICT_STYLE else _escape(str(x)) for x in r))
    _console(out).print(t)


def _escape(s: str) -> str:
    # lazy: rich.console +0.04 s (BENCHMARKS 22); plain_table/dump_json users never draw with rich
    from rich.markup import escape

    return escape(s)


def _finite(obj):
    """Non-finite floats as the strings the metrics files use ("inf", "-inf", "nan"): JSON has none."""
    if isinstance(obj, float) and obj != obj:
        return "nan"
    if isinstance(obj, float) and obj in (float("inf"), float("-inf")):
        return "inf" if obj > 0 else "-inf"
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def dump_json(obj, out: TextIO = sys.stdout) -> None:
    print(json.dumps(_finite(obj), indent=2, sort_keys=True, allow_nan=False, default=str), file=out)


def num(v) -> str:
    """Errors with 5 significant digits (fp32 errors, 1e-7 .. 1e-4, stay readable)."""
    if v is None:
        return "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return f"{v:.4e}"


class Progress:
    """Progress of N items (cells, experiments): on a terminal a rich bar with finished items
    printed above it; elsewhere one plain line per event. `line()` prints an event; `status()`
    changes the bar's description (on a terminal only: a plain log gets events, not redraws);
    `heartbeat()` prints a plain status line at most every `every` seconds when nothing else was
    printed, so a long wait is never silent; `advance()` counts items without printing. The one
    progress helper: `parity repro` (-j and --cluster), `parity sweep` and fuzz campaigns use it."""

    def __init__(self, total: int, out: TextIO = sys.stderr, label: str = "parity", every: float = 5.0):
        self.total, self.done, self.out, self.label, self.every = total, 0, out, label, every
        self.lock = threading.RLock()
        self.last = time.monotonic()
        self._bar = self._task = None
        if is_tty(out):
            # lazy: rich.console +0.04 s (BENCHMARKS 22); plain_table/dump_json users never draw with rich
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn
            # lazy: rich.console +0.04 s (BENCHMARKS 22); plain_table/dump_json users never draw with rich
            from rich.progress import TimeElapsedColumn

            self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), console=_console(out), transient=True)
            self._task = self._bar.add_task(label, total=total)
            self._bar.start()

    def line(self, text: str, advance: int = 0) -> None:
        with self.lock:
            self.done += advance
            self.last = time.monotonic()
            if self._bar is not None:
                self._bar.console.print(_escape(text))
                self._bar.update(self._task, completed=self.done)
            else:
                print(text, file=self.out, flush=True)

    def advance(self, n: int = 1) -> None:
        """Count n finished items without printing (the bar moves on a terminal)."""
        with self.lock:
            self.done += n
            if self._bar is not None:
                self._bar.update(self._task, completed=self.done)

    def status(self, text: str) -> None:
        with self.lock:
            if self._bar is not None:
                self._bar.update(self._task, description=_escape(text))

    def heartbeat(self, text: str) -> None:
        with self.lock:
            if self._bar is not None:
                self._bar.update(self._task, description=_escape(text))
            elif time.monotonic() - self.last >= self.every:
                self.line(text)

    def close(self) -> None:
        with self.lock:
            if self._bar is not None:
                self._bar.stop()
                self._bar = None
