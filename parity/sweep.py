"""`parity sweep 'dtypes=fp32,fp16,bf16' ['providers=ort_cpu,torch_cpu' ...] [-j N]`: queue one DVC
experiment per combination, run them with N workers, wait with progress, and print one compact
table instead of `dvc exp show`'s full width. Light: stdlib only.

Comma lists are expanded here (their cartesian product), so every experiment is known by name.
With -j > 1 the first combination runs alone first (`dvc exp run --temp`), so the stages all
experiments share (inputs, export, reference) run once and the others restore them from DVC's
run-cache instead of racing to compute them.

Before anything runs or is queued, every combination is composed (DVC's compose_and_dump with the
parity Hydra plugin, as `parity compose` and `dvc exp run` do) into a temp file and validated: one
bad combination fails the sweep with its config error and nothing queued.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from parity import metrics as layout


def expand(overrides: list[str]) -> list[list[str]]:
    """['dtypes=fp32,fp16', 'seed=1'] -> [['dtypes=fp32', 'seed=1'], ['dtypes=fp16', 'seed=1']].
    Values in brackets/parentheses (lists, Hydra functions) are kept whole."""
    axes = []
    for o in overrides:
        key, sep, value = o.partition("=")
        if not sep:
            raise ValueError(f"sweep override '{o}' is not key=value (e.g. 'dtypes=fp32,fp16')")
        values = [value] if re.search(r"[\[\](){}]", value) else [v for v in value.split(",") if v]
        axes.append([f"{key}={v}" for v in values])
    return [list(c) for c in itertools.product(*axes)]


def _dvc(args: list[str], cwd: str) -> str:
    p = subprocess.run(["dvc", *args], cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"`dvc {' '.join(args)}` failed:\n{(p.stderr or p.stdout).strip()}")
    return p.stdout


def check_combo(combo: list[str], cwd: str = ".") -> str | None:
    """The one-line config error composing conf/ with these overrides gives, or None (composed into a
    temp file, validated with parity.config; params.yaml is not touched)."""
    from dvc.utils.hydra import compose_and_dump

    from parity import config

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


def queue_status(cwd: str) -> dict[str, str]:
    rows = {}
    for line in _dvc(["queue", "status"], cwd).splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 3 and parts[-1] in ("Queued", "Running", "Success", "Failed"):
            rows[parts[1]] = parts[-1]
    return rows


def _get(d: dict, dotted: str):
    for k in dotted.split("."):
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _show(value) -> str:
    if isinstance(value, dict):
        return ",".join(value)  # a multi-select group: its selected options
    return str(value)


def summarize(exps: dict[str, dict], keys: list[str]) -> list[list[str]]:
    rows = []
    for name, data in exps.items():
        params = (data.get("params") or {}).get("params.yaml", {}).get("data", {})
        metrics = {p: (m or {}).get("data", {}) for p, m in (data.get("metrics") or {}).items()}
        summary = next((m for p, m in metrics.items() if p.endswith("/" + layout.SUMMARY)), {})
        cells = list(layout.cells_of(summary).values())
        worst = max((m["worst"] for m in cells if isinstance(m.get("worst"), (int, float))), default=None)
        origins: dict[str, int] = {}
        for m in cells:
            if layout.origin(m):
                origins[layout.origin(m)] = origins.get(layout.origin(m), 0) + 1
        rows.append([name, *(_show(_get(params, k)) for k in keys),
                     str(summary.get("passed", "-")), str(summary.get("failed", "-")),
                     str(summary.get("not_run", "-")), f"{worst:.3g}" if worst is not None else "-",
                     ", ".join(f"{o} ({n})" if n > 1 else o for o, n in sorted(origins.items())) or "-"])
    return rows


def table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    fmt = lambda r: "  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def sweep(overrides: list[str], jobs: int = 1, cwd: str = ".", poll: float = 2.0, err=sys.stderr,
          out=sys.stdout) -> int:
    combos = expand(overrides)
    keys = [o.partition("=")[0].lstrip("+") for o in overrides]
    names: list[str] = []
    check_all(combos, cwd)
    print(f"parity sweep: {len(combos)} experiments over {', '.join(keys)} with {jobs} worker(s)", file=err)
    rest = combos
    if jobs > 1 and len(combos) > 1:
        print(f"parity sweep: running {' '.join(combos[0])} first, so shared stages run once", file=err)
        log = _dvc(["exp", "run", "--temp", *_sets(combos[0])], cwd)
        m = re.search(r"Ran experiment\(s\): (\S+)", log)
        names.append(m.group(1) if m else "?")
        rest = combos[1:]
    for combo in rest:
        log = _dvc(["exp", "run", "--queue", *_sets(combo)], cwd)
        m = re.search(r"Queued experiment '([^']+)'", log)
        if not m:
            raise RuntimeError(f"could not read the queued experiment's name from:\n{log}")
        names.append(m.group(1))
    if rest:
        _dvc(["queue", "start", "-j", str(jobs)], cwd)
    last = None
    while True:
        st = queue_status(cwd)
        mine = {n: st.get(n, "Success") for n in names}
        done = sum(s in ("Success", "Failed") for s in mine.values())
        line = (f"parity sweep: {done}/{len(names)} done, {sum(s == 'Running' for s in mine.values())} running, "
                f"{sum(s == 'Failed' for s in mine.values())} failed")
        if line != last:
            print(line, file=err)
            last = line
        if done == len(names):
            break
        time.sleep(poll)
    shown = json.loads(_dvc(["exp", "show", "--json"], cwd) or "[]")
    exps = {r["name"]: r["data"] for rev in shown for e in (rev.get("experiments") or [])
            for r in e.get("revs", []) if r.get("name") in names and r.get("data")}
    head = ["experiment", *keys, "passed", "failed", "not run", "worst", "drift origins"]
    rows = summarize({n: exps[n] for n in names if n in exps}, keys)
    print(table(head, rows), file=out)
    failed = [n for n in names if mine.get(n) == "Failed" or n not in exps]
    if failed:
        print(f"parity sweep: experiments that did not finish: {', '.join(failed)} "
              f"(`dvc queue logs NAME` shows why)", file=err)
        return 1
    return 0
