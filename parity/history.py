"""`parity compare REV_A [REV_B]`: what changed per cell between two revisions, built on
`dvc metrics diff --all --json` over the diff stages' metrics (artifacts/diff/<cell>/metrics.json).
Light: stdlib only.

A regression is a cell that passed in REV_A and does not in REV_B (FAIL, or a status such as
INFER_FAIL), or a cell that ran in REV_A and no longer runs. `--fail-on-regression` makes it the
exit code, so CI can gate on it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass

CELL_METRICS = re.compile(r"^artifacts/diff/(?P<cell>[^/]+)/metrics\.json$")
RAN = ("PASS", "FAIL")


@dataclass
class Change:
    cell: str
    old: dict
    new: dict

    def get(self, side: str, key: str):
        return (self.old if side == "old" else self.new).get(key)

    @property
    def verdicts(self) -> tuple[str | None, str | None]:
        return self.old.get("verdict"), self.new.get("verdict")

    @property
    def kind(self) -> str:
        a, b = self.verdicts
        if a is None:
            return "new"
        if b is None:
            return "removed"
        if a != b:
            return f"{a.lower()}->{b.lower()}" if a in RAN and b in RAN else f"{a}->{b}"
        return "changed" if self.old != self.new else "same"

    @property
    def regression(self) -> bool:
        a, b = self.verdicts
        return (a == "PASS" and b != "PASS" and b is not None) or (a in RAN and b is not None and b not in RAN)

    @property
    def fixed(self) -> bool:
        a, b = self.verdicts
        return a is not None and a != "PASS" and b == "PASS"


def metrics_diff(rev_a: str, rev_b: str | None = None, cwd: str = ".") -> dict:
    cmd = ["dvc", "metrics", "diff", rev_a, *([rev_b] if rev_b else []), "--all", "--json"]
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {(p.stderr or p.stdout).strip()}")
    return json.loads(p.stdout or "{}")


def changes(diff: dict) -> list[Change]:
    out = []
    for path, metrics in sorted(diff.items()):
        m = CELL_METRICS.match(path)
        if not m:
            continue
        old = {k: v.get("old") for k, v in metrics.items() if v.get("old") is not None}
        new = {k: v.get("new") for k, v in metrics.items() if v.get("new") is not None}
        out.append(Change(m.group("cell"), old, new))
    return out


def _num(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, (int, float)):
        return f"{v:.4e}"  # 5 significant digits: fp32 errors (1e-7 .. 1e-4) stay readable
    return str(v)


def _pair(c: Change, key: str, num: bool = False) -> str:
    a, b = c.get("old", key), c.get("new", key)
    fa, fb = (_num(a), _num(b)) if num else (str(a if a is not None else "-"), str(b if b is not None else "-"))
    return fa if fa == fb else f"{fa} -> {fb}"


def table(rows: list[Change]) -> str:
    head = ["cell", "change", "verdict", "drift origin", "worst layer", "output max_abs", "output rel_l2"]
    body = [[c.cell, c.kind + (" REGRESSION" if c.regression else ""), _pair(c, "verdict"),
             _pair(c, "drift_origin"), _pair(c, "worst_layer"), _pair(c, "output.max_abs", True),
             _pair(c, "output.rel_l2", True)] for c in rows]
    widths = [max(len(str(r[i])) for r in [head] + body) for i in range(len(head))]
    fmt = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in body])


def compare(rev_a: str, rev_b: str | None = None, show_all: bool = False, fail_on_regression: bool = False,
            cwd: str = ".", out=sys.stdout) -> int:
    cs = changes(metrics_diff(rev_a, rev_b, cwd))
    label = f"{rev_a}..{rev_b or 'workspace'}"
    moved = [c for c in cs if c.kind != "same"]
    reg = [c for c in cs if c.regression]
    if not cs:
        print(f"parity compare {label}: no cell metrics in either revision (artifacts/diff/*/metrics.json);"
              f" run the pipeline, or `dvc pull` the revisions' metrics", file=out)
        return 0
    if not moved:
        print(f"parity compare {label}: nothing changed ({len(cs)} cells, identical metrics)", file=out)
        return 0
    print(table(cs if show_all else moved), file=out)
    print(f"\nparity compare {label}: {len(cs)} cells, {len(reg)} regressed, "
          f"{sum(c.fixed for c in cs)} fixed, {sum(c.kind == 'changed' for c in cs)} with moved metrics, "
          f"{sum(c.kind == 'new' for c in cs)} new, {sum(c.kind == 'removed' for c in cs)} removed, "
          f"{sum(c.kind == 'same' for c in cs)} unchanged", file=out)
    if reg and fail_on_regression:
        print(f"parity compare: regression in {', '.join(c.cell for c in reg)}", file=sys.stderr)
        return 1
    return 0
