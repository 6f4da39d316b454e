"""The env stage's output folders, kept between runs (issue 38): the env stage runs on every `dvc repro`
(always_changed), and its outs are `persist: true` in env/dvc.yaml, so DVC does not delete them first. A file
whose bytes did not change is left as it is (DVC finds it unchanged in its state and hashes nothing; it still
re-links it, as it does every output of a stage that ran); a changed one is replaced atomically (never written
through a link into DVC's cache); a file of an earlier run that this run did not write (a model or provider no
longer in params) is removed, so each folder holds exactly what a run from scratch would write. Stdlib +
parity.core.io only."""

from __future__ import annotations

from pathlib import Path

from parity.core.io import dumps, write_text


class Outs:
    """Writes JSON files under the given folders, as a run from scratch would leave them."""

    def __init__(self, *folders: str | Path):
        self.folders = [Path(f) for f in folders]
        self.written: set[Path] = set()

    def put(self, path: str | Path, obj) -> None:
        """`obj` as JSON at `path` (parity.core.io.dumps: the bytes write_json writes), unless already so."""
        path, data = Path(path), dumps(obj).encode("utf-8")
        self.written.add(path.resolve())
        try:
            if path.read_bytes() == data:
                return
        except OSError:  # missing (first run, a fresh clone) or unreadable: write it
            pass
        write_text(path, data.decode("utf-8"))

    def prune(self) -> list[Path]:
        """Remove every file in the folders that this run did not write; the removed paths."""
        gone = [f for d in self.folders if d.is_dir() for f in sorted(d.iterdir())
                if f.is_file() and f.resolve() not in self.written]
        for f in gone:
            f.unlink()
        return gone
