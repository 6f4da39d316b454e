"""Atomic, deterministic writes. An interrupted stage leaves no half-written artifact."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml


_UMASK = os.umask(0)
os.umask(_UMASK)
TMP_SUFFIX = ".tmp"
# A testing knob: PARITY_TEST_PAUSE_PUBLISH=<file name> makes atomic_path wait (600 s) after that
# file's content is written and before it is renamed into place, so a test can SIGKILL a stage
# while its output is unpublished (tests/test_memory.py). Never set it outside tests.
PAUSE_ENV = "PARITY_TEST_PAUSE_PUBLISH"


@contextlib.contextmanager
def atomic_path(path: str | Path, allow_empty: bool = False):
    """Yield a temp path beside `path`; rename it onto `path` only if the block ran to its end
    without raising AND left a non-empty file (unless `allow_empty`). A block that returns early
    before writing (or writes nothing) publishes nothing: the temp file is removed and `path` is
    left as it was. An interrupted process (SIGKILL) can leave the hidden `.<name>.*.tmp` file
    behind, never a partial `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; artifacts get the usual mode (shared caches)
    try:
        yield Path(tmp)
        if os.environ.get(PAUSE_ENV) == path.name:  # test-only: hold the written temp file unpublished
            time.sleep(600)
        if allow_empty or os.path.getsize(tmp) > 0:
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path, allow_empty=True) as tmp:  # the caller's bytes, even b"", are the content
        tmp.write_bytes(data)


def write_text(path: str | Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def _clean(o):
    """JSON-safe and deterministic: NaN/Inf become strings, numpy scalars become Python numbers."""
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if hasattr(o, "item") and not isinstance(o, (str, bytes)):
        o = o.item()
    if isinstance(o, float):
        if math.isnan(o):
            return "nan"
        if math.isinf(o):
            return "inf" if o > 0 else "-inf"
        return float(repr(o)) if o == o else o
    return o


def dumps(obj, sort_keys: bool = True) -> str:
    return json.dumps(_clean(obj), indent=2, sort_keys=sort_keys, allow_nan=False) + "\n"


def write_json(path: str | Path, obj, sort_keys: bool = True) -> None:
    write_text(path, dumps(obj, sort_keys=sort_keys))


class Corrupt(ValueError):
    """An artifact that does not parse (a bad checkout, a corrupt DVC cache object, a hand edit)."""


def corrupt(path: str | Path, err: Exception) -> Corrupt:
    """The one-line error for a corrupt artifact: the file, the parser's message, how to recover."""
    why = " ".join(str(err).split()) or type(err).__name__
    try:  # as the user types it: relative to the repository root (stages and the CLI run there)
        path = Path(path).resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    stage = _stage_writing(str(path))
    rerun = f"`dvc repro -f -s {stage}`" if stage else "`dvc repro -f -s <the stage that writes it>`"
    return Corrupt(f"corrupt: {path}: {why}; restore it with `dvc checkout {path}`, or if the cache copy is "
                   f"corrupt too (`dvc checkout` gives the same bytes), remove it and re-run its stage: {rerun}")


def _stage_writing(path: str) -> str | None:
    """The stage that has `path` (or a folder holding it) as an output: from dvc.lock, else a stage of
    dvc.yaml whose outs name it literally (no ${} template); None when neither says."""
    p = Path(path).as_posix()
    for f in ("dvc.lock", "dvc.yaml"):
        try:
            # libyaml's loader where PyYAML has it: the pure-Python one takes seconds on a 50 KB dvc.lock
            doc = yaml.load(Path(f).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
        except (OSError, yaml.YAMLError):
            continue
        for name, st in (doc.get("stages") or {}).items():
            st = st if isinstance(st, dict) else {}
            for o in [*(st.get("outs") or []), *(st.get("metrics") or []), *(st.get("plots") or [])]:
                out = str(o.get("path", "") if f == "dvc.lock" else next(iter(o))) if isinstance(o, dict) else str(o)
                if out and "${" not in out and (p == out or p.startswith(out.rstrip("/") + "/")):
                    return name
    return None


def json_object(path: str | Path) -> dict:
    """A JSON object file's content, {} when it is missing or not one (a model folder's optional
    config.json / tokenizer_config.json: the loader that needs it says what is wrong)."""
    try:
        got = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


def read_json(path: str | Path):
    try:
        with open(path) as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise corrupt(path, e) from None


def exit_now(code: int) -> None:
    """End a stage process without interpreter teardown (after torch it costs ~0.75 s a process).
    Call only when every output is written and closed (atomic_path has renamed it into place)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
