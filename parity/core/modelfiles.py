"""The files a model reads, found without loading the model, and their digests, computed by streaming.

A model's stages depend on exactly the files it reads (parity.core.codedeps.models_code):
- an ONNX file and every external-data `location` its tensors name (`onnx_locations`: initializers of
  the main graph and of If/Loop/Scan bodies, sparse initializers, Constant-style tensor attributes,
  functions), found by walking the protobuf's wire format over a memory map: no onnx import, no 2 GiB
  protobuf limit, and a tensor's inline bytes are skipped, never copied;
- a Hugging Face checkpoint folder's files that transformers reads (`hf_files`);
- a `weights:` file.

`external_file` is where an external-data location may point, for the dependency above and for every
reader of a user's ONNX file (parity.models.onnx_weights): onnx's own rules (relative, inside the
model's folder, a regular file) except that a symbolic link into the DVC cache of the repository
holding the model, or one that stays inside the model's folder, is followed, and a hard-linked file is
read (DVC's `cache.type hardlink,symlink` links every tracked file so; onnx's loader refuses both).

`is_onnx_file` is the one test of whether a model's config gives it as an ONNX file (`arch.source:
onnx`): every stage, runner and check that treats such a model apart asks it.

`Digests` computes sha256 by streaming (hashlib.file_digest: fixed-size reads, never the whole file in
memory) and remembers it by the file's identity and stat (device, inode, size, mtime_ns, ctime_ns) in
.dvc/tmp/parity-digests.json, so a no-op `dvc repro` does not hash a checkpoint's gigabytes again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import mmap
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path

from parity.core.io import json_object

EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
# protobuf field numbers of the messages that can hold tensors (onnx-ml.proto): message -> {field: message}
_HOLDS = {
    "model": {7: "graph", 25: "function"},
    "graph": {1: "node", 5: "tensor", 15: "sparse"},
    "function": {7: "node", 11: "attr"},
    "node": {5: "attr"},
    "attr": {5: "tensor", 6: "graph", 10: "tensor", 11: "graph", 22: "sparse", 23: "sparse"},
    "sparse": {1: "tensor", 2: "tensor"},
}
DIGESTS = ".dvc/tmp/parity-digests.json"
RACY_S = 2.0  # a file changed this recently is hashed again next time (its mtime may not move on a rewrite)


class ExternalDataError(ValueError):
    """An external-data location that parity will not read: the message says why."""


def is_onnx_file(model_cfg) -> bool:
    """Whether a model's config (params `models.<m>`) gives it as an ONNX file (`arch.source: onnx`)
    rather than a model built in torch. Safe on a config not validated yet (any value: False)."""
    arch = model_cfg.get("arch") if isinstance(model_cfg, Mapping) else None
    return isinstance(arch, Mapping) and arch.get("source") == "onnx"


# -- ONNX external data -----------------------------------------------------------------------------

def onnx_locations(path: Path) -> list[str]:
    """Every external-data location (as written) the tensors of the ONNX file at `path` name, sorted,
    each once. ValueError when the file is not a well-formed protobuf."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return []
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            found: set[str] = set()
            _walk(buf, 0, len(buf), "model", found)
            return sorted(found)


def _varint(buf, i: int, end: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= end or shift > 63:
            raise ValueError("malformed protobuf varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf, i: int, end: int):
    """(field number, wire type, value) of the message in buf[i:end]; a length-delimited value is its
    (start, end) span, unread."""
    while i < end:
        key, i = _varint(buf, i, end)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i, end)
        elif wire == 2:
            n, i = _varint(buf, i, end)
            value, i = (i, i + n), i + n
        elif wire in (1, 5):
            value, i = None, i + (8 if wire == 1 else 4)
        else:
            raise ValueError(f"malformed protobuf: wire type {wire}")
        if i > end:
            raise ValueError("malformed protobuf: a field runs past its message")
        yield num, wire, value


def _walk(buf, i: int, end: int, kind: str, found: set) -> None:
    if kind == "tensor":
        loc, external = None, False
        for num, wire, v in _fields(buf, i, end):
            if num == 14 and wire == 0:  # data_location
                external = v == EXTERNAL
            elif num == 13 and wire == 2:  # external_data: {key: 1, value: 2}
                kv = {k: bytes(buf[s[0]:s[1]]).decode("utf-8", "replace") for k, w, s in _fields(buf, *v) if w == 2}
                if kv.get(1) == "location":
                    loc = kv.get(2, "")
        if external:
            found.add(loc or "")
        return
    holds = _HOLDS[kind]
    for num, wire, v in _fields(buf, i, end):
        if wire == 2 and num in holds:
            _walk(buf, v[0], v[1], holds[num], found)


def external_file(base: Path, location: str) -> Path:
    """The file external-data `location` names for a model in folder `base` (base/location), if parity
    may read it: a relative path that stays inside `base`, reaching a regular file whose real path is
    inside base's real folder or in the DVC cache of the repository holding `base` (a DVC symlink);
    a hard-linked file is read too (a DVC hard link). ExternalDataError says why not; FileNotFoundError
    when nothing is there."""
    if not location:
        raise ExternalDataError("an external tensor names no location")
    if "\0" in location or location.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", location):
        raise ExternalDataError(f"location {location!r} is an absolute path; it must be relative to the model's folder")
    rel = os.path.normpath(location)
    if ".." in Path(rel).parts or ".." in Path(os.path.normpath(location.replace("\\", "/"))).parts:
        raise ExternalDataError(f"location {location!r} points outside the model's folder")
    f = Path(base) / rel
    if not os.path.lexists(f):
        raise FileNotFoundError(f)
    real = f.resolve()
    inside = [Path(base).resolve(), *dvc_caches(Path(base))]
    if not any(real == r or r in real.parents for r in inside):
        raise ExternalDataError(f"location {location!r} is a symbolic link to {real}, outside the model's folder "
                                "and the DVC cache")
    if not real.is_file():
        raise ExternalDataError(f"location {location!r} is not a regular file")
    return f


def dvc_caches(start: Path) -> list[Path]:
    """The real paths of the DVC cache of the repository holding `start` (the nearest folder above it
    with a .dvc/ folder): [cache] dir of .dvc/config.local or .dvc/config, else .dvc/cache."""
    start = Path(os.path.abspath(start))
    for d in [start, *start.parents]:
        if (d / ".dvc").is_dir():
            return [_cache_dir(d / ".dvc")]
    return []


@functools.lru_cache(maxsize=16)
def _cache_dir(dot_dvc: Path) -> Path:
    for name in ("config.local", "config"):
        cfg = dot_dvc / name
        text = cfg.read_text(errors="replace") if cfg.is_file() else ""
        section = re.search(r"^\[cache\][^\n]*\n((?:[ \t]*[^\[\s].*\n?|[ \t]*\n)*)", text, re.M)
        got = section and re.search(r"^\s*dir\s*=\s*(.+?)\s*$", section.group(1), re.M)
        if got:
            return (dot_dvc / os.path.expanduser(got.group(1).strip("'\""))).resolve()
    return (dot_dvc / "cache").resolve()


# -- Hugging Face checkpoints -----------------------------------------------------------------------

HF_WEIGHTS = ["model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
              "pytorch_model.bin.index.json"]  # transformers' order of preference (from_pretrained, local)
HF_SIDE = (".json", ".txt", ".model", ".jinja", ".spm", ".tiktoken", ".codes", ".vocab")  # config, tokenizer


def hf_files(folder: Path) -> list[str]:
    """The files of checkpoint folder `folder` that transformers' from_pretrained (model and tokenizer)
    reads, relative to it: the weights file it picks (config.json's `transformers_weights`, else the
    first of HF_WEIGHTS there; a sharded checkpoint's index and every shard its weight_map names) and
    the top-level config and tokenizer files (HF_SIDE suffixes: config.json, generation_config.json,
    tokenizer.json, tokenizer_config.json, special_tokens_map.json, vocab.txt/json, merges.txt,
    tokenizer.model, ...). Weights it does not pick, other indexes, subfolders, docs and hidden files
    are not read, so they are not dependencies."""
    names = {f.name for f in folder.iterdir() if not f.name.startswith(".") and f.is_file()}
    out = {n for n in names if n.endswith(HF_SIDE) and not n.endswith(".index.json")}
    explicit = json_object(folder / "config.json").get("transformers_weights") if "config.json" in names else None
    for n in ([explicit] if _inside(explicit) else []) + HF_WEIGHTS:
        if (folder / n).is_file():
            shards = json_object(folder / n).get("weight_map", {}).values() if n.endswith(".index.json") else []
            return sorted(out | {n, *(s for s in shards if _inside(s))})
    return sorted(out)


def _inside(name) -> bool:
    """A relative path that stays in its folder (what a checkpoint's config or index may name)."""
    return isinstance(name, str) and bool(name) and not Path(name).is_absolute() and ".." not in Path(name).parts


# -- digests --------------------------------------------------------------------------------------

class Digests:
    """sha256 of files, streamed, remembered by (device, inode, size, mtime_ns, ctime_ns) in `store`
    (a JSON file; None: remember nothing). Writing a file changes its ctime, which nothing but the
    kernel sets, so a changed file is hashed again; so is one changed in the last RACY_S seconds, whose
    next change may land in the same timestamp."""

    MAX = 10_000  # entries kept; the oldest lookups go first

    def __init__(self, store: Path | None = None):
        self.store = store
        self.entries: dict = {}
        if store is not None and store.is_file():
            try:
                self.entries = json.loads(store.read_text())
            except (OSError, ValueError):
                self.entries = {}
        self.changed = False

    @classmethod
    def for_repo(cls, root: Path | None = None) -> Digests:
        """Digests remembered under the repository's .dvc/tmp (none outside a DVC repository)."""
        root = Path(root or Path.cwd())
        return cls(root / DIGESTS if (root / ".dvc").is_dir() else None)

    def sha256(self, path: Path) -> str:
        st = os.stat(path)
        key = os.path.abspath(path)
        ident = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        hit = self.entries.get(key)
        if hit and hit[:-1] == ident:
            return hit[-1]
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        self.entries.pop(key, None)
        if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_S * 1e9:
            self.entries[key] = [*ident, digest]
        self.changed = True
        return digest

    def save(self) -> None:
        """Write the remembered digests (atomically) if any changed; a store that cannot be written is
        skipped (it is a cache)."""
        if self.store is None or not self.changed:
            return
        keep = dict(list(self.entries.items())[-self.MAX:])
        try:
            self.store.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.store.with_name(f".{self.store.name}.{os.getpid()}")
            tmp.write_text(json.dumps(keep))
            os.replace(tmp, tmp.with_name(self.store.name))
        except OSError:
            pass
