"""What makes the env stage cheap enough to run on every `dvc repro` (issue 38); only stages/env.py uses it.

- load_alone: a module that imports only the standard library (parity.backends.fingerprint) run from its
  file without its packages' __init__ (parity.backends' loads numpy and pyarrow for the runners: 0.25 s
  of CPU per repro on 2 loaded cores).
- load / save: the import names parity.core.codedeps parses out of each runner's closure (~30 files:
  0.3 s of CPU per repro), kept between runs under .dvc/tmp, keyed like codedeps' own memo by the
  file's sha256, so a changed file is parsed again and every hash the env stage writes is the same.
Neither changes a byte the env stage writes; both are caches that fall back to the plain way.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

from parity.core import codedeps

STORE = ".dvc/tmp/parity-import-names.json"


def load_alone(name: str):
    """Module `name` run from its file (under the repo root or sys.path) without running its packages'
    __init__ first; the loaded module if there is one."""
    if name not in sys.modules:
        hit = codedeps.find_module(name, codedeps.search_roots())
        if hit is None:
            raise ImportError(f"cannot find module '{name}' ({codedeps.searched(name)})")
        spec = importlib.util.spec_from_file_location(name, hit[1])
        sys.modules[name] = mod = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def load(store: str | Path = STORE) -> int:
    """Fill codedeps' parsed-imports memo from `store`; the number of entries read (a missing or
    unreadable store adds none)."""
    try:
        rows = json.loads(Path(store).read_text())
        memo = {(f, m, h): frozenset(names) for f, m, h, names in rows}
    except (OSError, ValueError, TypeError):
        return 0
    codedeps.NAMES_MEMO.update(memo)
    return len(memo)


def save(known: int, store: str | Path = STORE) -> None:
    """Write the memo to `store` (atomically, where its folder exists: .dvc/tmp in a DVC repository)
    if it holds more than the `known` entries load read, keeping only entries of files as they are now."""
    store, memo = Path(store), codedeps.NAMES_MEMO
    if len(memo) <= known or not store.parent.is_dir():
        return
    now: dict[str, str | None] = {}
    for f in {k[0] for k in memo}:
        try:
            now[f] = hashlib.sha256(Path(f).read_bytes()).hexdigest()
        except OSError:
            now[f] = None
    rows = sorted([f, m, h, sorted(v)] for (f, m, h), v in memo.items() if now[f] == h)
    tmp = store.with_name(f"{store.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, store)
    except OSError:
        tmp.unlink(missing_ok=True)
