"""dvc.lock without the entries of stages the pipeline no longer has (`parity compose`).

DVC keeps a stage's dvc.lock entry after the stage leaves the matrix (a model, dtype or provider
composed away), and rewrites the whole lock, parsed and dumped by ruamel, every time a stage runs:
the cost of a stage run grows with the lock. Composed from the 8-cell default to one resnet18 cell,
the lock keeps 27 entries for 7 stages (129 KB -> 35 KB once pruned) and `dvc repro -f -s capture@..
diff@..` takes 8.5 s instead of 5.8 s (BENCHMARKS.md section 16b). A pruned stage that comes back is
restored from DVC's run-cache, not re-run, so pruning loses nothing.

Text in, text out: every kept entry keeps its bytes (DVC's own formatting), only whole entries go.
"""

from __future__ import annotations

import re
from pathlib import Path

from parity.core.io import write_text

_ENTRY = re.compile(r"^  (\S[^\n]*):\n", re.M)  # a stage entry under `stages:` (two-space indent)


def live_stages(root: Path) -> set[str]:
    """The names of the stages dvc.yaml defines with the params now in params.yaml (DVC resolves the matrix)."""
    from dvc.repo import Repo  # lazy: dvc.repo +0.29 s (BENCHMARKS 22), `parity compose` only

    with Repo(str(root)) as repo:
        return {s.name for s in repo.index.stages if s.path_in_repo == "dvc.yaml"}


def prune(root: Path, live: set[str] | None = None) -> list[str]:
    """Drop the entries of root/dvc.lock whose stage is not in `live` (default: live_stages); the names
    dropped, in lock order. No lock, or nothing to drop: the file is untouched."""
    lock = Path(root) / "dvc.lock"
    if not lock.exists():
        return []
    text = lock.read_text()
    head, sep, body = text.partition("\nstages:\n")
    if not sep:
        return []
    live = live_stages(Path(root)) if live is None else live
    starts = [(m.start(), m.group(1).strip("'\"")) for m in _ENTRY.finditer(body)]
    kept, dropped = [body[:starts[0][0]] if starts else body], []
    for (i, name), (j, _) in zip(starts, starts[1:] + [(len(body), "")]):
        (kept.append(body[i:j]) if name in live else dropped.append(name))
    if dropped:
        rest = "".join(kept)
        # every entry gone: an empty mapping (DVC's schema rejects `stages:` with nothing under it)
        write_text(lock, head + sep + rest if rest.strip() else head + "\nstages: {}\n")
    return dropped
