"""Parquet tensor store: one row per (sample, layer), values as little-endian bytes.

Columns: sample (int32), name (string), order (int32, execution order; the model output last),
dtype (numpy dtype string), shape (list<int64>), values: float32 rows in `f4` (list<float>), float64
rows in `f8` (list<double>), any other dtype as raw bytes in `data` (large_binary); `same_as` (string,
null but for a row stored once elsewhere: `<name>` = that row of the same sample in this file, `base:<name>`
= that row of the same sample in the file the `base` metadata names (relative to this file's folder),
cast to this row's dtype). Written with zstd level 1 and byte_stream_split on the float columns
(issue 23: resnet50's files 0.61-0.76 of their raw size; BENCHMARKS.md section 17d), no dictionary or
statistics, a fixed schema and no timestamps, so identical tensors give byte-identical files. Reads
decode a row group at a time and hand out each tensor as a read-only numpy view of its column's value
buffer (no per-tensor copy); files of the earlier format (values in `data` only, no `same_as`) read as before.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import Iterable, Iterator

import contextlib
import os
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from parity.core.io import atomic_path, corrupt


def _allocator() -> None:
    """Arrow's allocator for this process: the system allocator instead of the default mimalloc,
    unless ARROW_DEFAULT_MEMORY_POOL names one. Reading and writing a few hundred MB of tensors
    allocates fresh buffers of tens of MB each; with mimalloc the resnet18 capture and diff stage
    processes took 2.51 s and 1.36 s (medians of 7, interleaved), with the system allocator 2.22 s
    and 1.23 s, and varied less (BENCHMARKS.md section 14). The bytes written do not depend on it."""
    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        pa.set_memory_pool(pa.system_memory_pool())


_allocator()


def reuse_pool() -> str:
    """jemalloc as Arrow's allocator for the rest of this process (unless ARROW_DEFAULT_MEMORY_POOL
    names one; the system allocator stays where this pyarrow has no jemalloc), for a stage that decodes
    many row groups and has memory to spare. The system allocator maps each decoded buffer of tens of
    MB afresh (a page fault on every 4 KiB, every time: bert_base's fp64 reference read takes 440k
    faults); jemalloc reuses them. diff stage, medians alternated: bert_base 2.25 -> 1.75 s,
    resnet18 1.09 -> 0.94 s, resnet50 3.30 -> 2.53 s, peak RSS +150-240 MB (BENCHMARKS.md 17g). Only
    time and memory depend on it, never a byte written. The name of the pool in use."""
    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        try:
            pa.set_memory_pool(pa.jemalloc_memory_pool())
        except NotImplementedError:  # a pyarrow built without jemalloc
            pass
    return pa.default_memory_pool().backend_name

SCHEMA = pa.schema([
    ("sample", pa.int32()),
    ("name", pa.string()),
    ("order", pa.int32()),
    ("dtype", pa.string()),
    ("shape", pa.list_(pa.int64())),
    ("data", pa.large_binary()),
    ("f4", pa.large_list(pa.float32())),
    ("f8", pa.large_list(pa.float64())),
    ("same_as", pa.string()),
])

FLOAT_COLUMNS = {"f4": np.dtype("<f4"), "f8": np.dtype("<f8")}  # dtype string -> its typed column
BASE = "base:"  # same_as: a row of the file named by the `base` metadata, cast to this row's dtype
XOR = "xor:"  # same_as: the stored bits XOR that base row cast to this row's dtype (a value near it)


def stores_values(same_as: str | None) -> bool:
    """Whether a row with this `same_as` has values of its own in the file."""
    return same_as is None or same_as.startswith(XOR)


@dataclass(frozen=True)
class Tensor:
    sample: int
    name: str
    order: int
    array: np.ndarray
    same_as: str | None = None  # written as a reference to that row (its dtype and shape from `array`)


def _column(rows: list[tuple[Tensor, np.ndarray, np.dtype]], held) -> tuple[np.ndarray, np.ndarray]:
    """The values of the rows `held(le)` selects, copied once into one buffer: a large_list of the
    column's dtype (f4/f8) or large_binary bytes (data); rows not selected (or aliases) are empty."""
    sizes = [a.nbytes if held(le) and stores_values(t.same_as) else 0 for t, a, le in rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    values = np.empty(int(offsets[-1]), dtype=np.uint8)
    for (_, a, le), lo, hi in zip(rows, offsets[:-1], offsets[1:]):
        if hi > lo:
            np.copyto(values[lo:hi].view(le).reshape(a.shape), a, casting="equiv")
    return offsets, values


def _table(rows: list[tuple[Tensor, np.ndarray, np.dtype]], metadata: dict[str, str] | None) -> pa.Table:
    """One Arrow table of `rows` (tensor, array, little-endian dtype). Each tensor's bytes are copied
    once, straight into the one value buffer of its column (byte order and strides fixed in that same
    copy), which Arrow then uses as it is; the Parquet encoder's copy into its pages is the only other."""
    n = len(rows)
    offsets, values = _column(rows, lambda le: _typed(le) is None)
    cols = {"data": pa.LargeBinaryArray.from_buffers(pa.large_binary(), n,
                                                     [None, pa.py_buffer(offsets), pa.py_buffer(values)])}
    for col, dt in FLOAT_COLUMNS.items():
        offsets, values = _column(rows, lambda le, col=col: _typed(le) == col)
        child = pa.Array.from_buffers(SCHEMA.field(col).type.value_type, len(values) // dt.itemsize,
                                      [None, pa.py_buffer(values)])
        cols[col] = pa.LargeListArray.from_arrays(pa.array(offsets // dt.itemsize), child)
    arrays = [pa.array([int(t.sample) for t, _, _ in rows], pa.int32()),
              pa.array([t.name for t, _, _ in rows], pa.string()),
              pa.array([int(t.order) for t, _, _ in rows], pa.int32()),
              pa.array([le.str.lstrip("<|=") for _, _, le in rows], pa.string()),
              pa.array([list(a.shape) for _, a, _ in rows], pa.list_(pa.int64())),
              cols["data"], cols["f4"], cols["f8"],
              pa.array([t.same_as for t, _, _ in rows], pa.string())]
    return pa.Table.from_arrays(arrays, schema=_schema(metadata))


def _typed(le: np.dtype) -> str | None:
    """The typed column of a (little-endian) dtype: 'f4', 'f8', or None (raw bytes in `data`)."""
    key = le.str.lstrip("<|=")
    return key if key in FLOAT_COLUMNS and le.kind == "f" and le.names is None else None


def _schema(metadata: dict[str, str] | None) -> pa.Schema:
    return SCHEMA.with_metadata({k: str(v) for k, v in sorted((metadata or {}).items())})


# zstd level 1 with byte_stream_split on the float columns: measured on resnet50's and gpt2_small's
# files (BENCHMARKS.md section 17d) the smallest at about the time of the uncompressed write; level 3
# was about 1% smaller and slower. Fixed: the bytes of a file depend on these options.
# write_page_checksum: a CRC32 per data page, verified on every read (Rows: page_checksum_verification), so
# bytes changed in place (a hard-linked DVC cache object included) are an error naming the file, not values
# decoded to other numbers (issue 36 item 1: 14 garbage bytes in a capture passed the diff)
WRITE_OPTIONS = dict(compression="zstd", compression_level=1, use_dictionary=False, write_statistics=False,
                     store_schema=True, use_byte_stream_split=["f4.list.element", "f8.list.element"],
                     write_page_checksum=True)


def buffer_bytes() -> int:
    """How many bytes of values a Writer holds before it writes them out as a row group:
    PARITY_STORE_BUFFER_MB (default 32). A file whose values fit is written as one row group, byte for
    byte what the whole-table write gave; a larger one becomes row groups of about this size, so a
    stage holds at most this much (and the encoder's copy of it) beside the values it is computing.
    resnet18's reference stage: 1.41 GB peak RSS holding its 240 MB fp64 file whole, 0.71 GB at 32 MB
    (0.63 GB at 8 MB). The bytes of a file depend on this value: keep it fixed."""
    return int(float(os.environ.get("PARITY_STORE_BUFFER_MB", "32")) * 2**20)


# a file read by a Rows(keep=Rows.WHOLE) stays decoded whole up to this many MB unless the reader
# gives its own bound (PARITY_STORE_KEEP_MB): a capture reads its fp64 reference in two passes and
# several lookup regions; resnet18's (134 MB decoded, 4 row groups) was decoded 16 times, 1.6 of the
# capture's 3.6 s. Larger files keep 2 row groups (the streaming bound). Only time and memory depend
# on it, never a byte written.
KEEP_MB = float(os.environ.get("PARITY_STORE_KEEP_MB", "256"))


class Writer:
    """Rows appended in file order, written as they arrive: buffered up to `budget` bytes of values
    (store.buffer_bytes), then flushed as a row group, onto a temp file beside `path`. publish()
    renames it into place; abort() removes it (an interrupted process leaves at most the hidden
    temp file, never a partial `path`: parity.core.io.atomic_path). `store.writer(path)` does either."""

    def __init__(self, path: str | Path, metadata: dict[str, str] | None = None, budget: int | None = None,
                 keep_mb: float | None = None, background: bool = False):
        """`keep_mb`: keep each written row group's values (decoded, as Rows reads them) while they
        take no more than this many MB, for a reader in this process (Rows.prime): the fp32 baseline
        made with the reference reads the fp64 reference just written (parity.pipeline.fold) (bert_base: 1.4 s of
        decoding saved). Over the bound, nothing is kept (the file streams, as before).
        `background`: each row group is built and encoded on a thread of its own while the caller
        computes the next (Arrow and numpy's copies release the GIL; one group in flight at a time, so
        the file's bytes are the same; the writer holds up to ~3 more groups' bytes meanwhile). For a
        stage with memory to spare (parity.pipeline.publish.background_ok: the fold of a weight-heavy
        model; a capture whose fp64 reference stays decoded)."""
        self.path, self.metadata = Path(path), metadata
        self.budget = buffer_bytes() if budget is None else budget
        self.rows: list[tuple[Tensor, np.ndarray, np.dtype]] = []
        self.held = 0
        self.count = 0
        self.keep_bytes = None if keep_mb is None else keep_mb * 2**20
        self.kept: list[list[np.ndarray]] | None = [] if keep_mb is not None else None
        self._kept_bytes = 0
        self._pq: pq.ParquetWriter | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="parity-writer") if background else None
        self._pending: Future | None = None
        self._atomic = atomic_path(self.path)
        self.tmp = self._atomic.__enter__()

    def add(self, t: Tensor) -> None:
        a = np.asarray(t.array)  # a rank-0 tensor keeps shape [] (files written before stored it as [1])
        self.rows.append((t, a, a.dtype.newbyteorder("<")))
        self.held += a.nbytes if stores_values(t.same_as) else 0
        self.count += 1
        if self.held >= self.budget:
            self.flush()

    def extend(self, tensors: Iterable[Tensor]) -> None:
        for t in tensors:
            self.add(t)

    def flush(self) -> None:
        if not self.rows:
            return
        rows = self.rows
        self._keep()
        self.rows, self.held = [], 0
        if self._pool is None:
            self._write(rows)
            return
        self._wait()
        self._pending = self._pool.submit(self._write, rows)

    def _write(self, rows: list) -> None:
        """One row group of `rows` onto the temp file."""
        table = _table(rows, self.metadata)
        del rows[:]  # the values are in the table now (the caller's list, in the background)
        if self._pq is None:
            self._pq = pq.ParquetWriter(self.tmp, table.schema, **WRITE_OPTIONS)
        self._pq.write_table(table)

    def _wait(self) -> None:
        """The row group in flight written (its error raised here)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def publish(self) -> int:
        """Write what is buffered and rename the file into place; the number of rows."""
        self._wait()
        if self._pq is None:  # everything fit: one table, as store.write always wrote it
            pq.write_table(_table(self.rows, self.metadata), self.tmp, **WRITE_OPTIONS)
            self._keep()
        else:
            self._write_last()
            self._pq.close()
        self._stop()
        self.rows, self.held = [], 0
        self._atomic.__exit__(None, None, None)
        return self.count

    def _write_last(self) -> None:
        if self.rows:
            self._keep()
            self._write(self.rows)

    def _stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _keep(self) -> None:
        """The buffered rows' values as one kept row group (read-only; an aliased row: empty, as read)."""
        if self.kept is None:
            return
        group = []
        for t, a, dt in self.rows:
            v = (a.astype(dt, copy=False) if stores_values(t.same_as) else np.empty(0, a.dtype)).view()
            v.flags.writeable = False
            group.append(v)
            self._kept_bytes += v.nbytes
        self.kept.append(group)
        if self._kept_bytes > self.keep_bytes:
            self.kept = None  # over the bound: the file streams

    def abort(self) -> None:
        """Drop everything: the temp file is removed, `path` is left as it was."""
        try:
            self._wait()
        except Exception:  # noqa: BLE001 - dropped anyway; the error that made the caller abort is raised
            pass
        self._stop()
        if self._pq is not None:
            self._pq.close()
        self.rows, self.held = [], 0
        err = _Aborted()
        self._atomic.__exit__(_Aborted, err, None)


class _Aborted(Exception):
    pass


@contextlib.contextmanager
def writer(path: str | Path, metadata: dict[str, str] | None = None, budget: int | None = None,
           keep_mb: float | None = None, background: bool = False):
    """A Writer published when the block ends without raising, aborted when it raises."""
    w = Writer(path, metadata, budget, keep_mb, background)
    try:
        yield w
    except BaseException:
        w.abort()
        raise
    w.publish()


def write(path: str | Path, tensors: Iterable[Tensor], metadata: dict[str, str] | None = None) -> int:
    """Atomically write tensors to `path` (store.writer). Returns the number of rows."""
    with writer(path, metadata) as w:
        w.extend(tensors)
    return w.count


def read_metadata(path: str | Path) -> dict[str, str]:
    md = pq.read_schema(path).metadata or {}
    return {k.decode(): v.decode() for k, v in md.items() if not k.startswith(b"ARROW")}


def read(path: str | Path) -> Iterator[Tensor]:
    """Yield tensors in file order; each array is a read-only view of its row group's decoded value
    buffer (a row stored once elsewhere, `same_as`, gives that row's array; a `base:` row, the base
    file's value cast to its dtype). Row groups are decoded one at a time (a streamed file holds
    several; store.Rows keeps the 2 read last), so a reader that does not keep the arrays holds two
    row groups' values at most. Read, not memory-mapped: the pages of a mapped file stay in the
    process's RSS until the file is closed (a 1 GB fp64 reference read sample by sample counted
    whole: resnet50's baseline peaked at 2.9 GiB, 1.5 GiB read)."""
    rows = Rows(path)
    for i in range(len(rows.names)):
        yield Tensor(rows.samples[i], rows.names[i], rows.orders[i], rows.value(i))


class Rows:
    """A store file read row by row when a value is asked for: the (sample, name, shape) columns are
    read at once, each value's row group when a value in it is first asked for, and the `keep` row
    groups read last stay decoded (store.buffer_bytes each, about). A reader whose requests go
    through the file in order, or through a few of its regions each in order (an own-error run:
    leaf outputs and recorded `pre:` inputs), reads each row group about once and holds `keep` of
    them, not a whole sample: resnet50's fp64 sample is 490 MB (issue 23)."""

    WHOLE = -1  # keep=WHOLE: every row group stays decoded if the file fits (fits(whole_mb)), else 2

    def __init__(self, path: str | Path, keep: int = 2, whole_mb: float | None = None):
        self.path, self.keep, self._bisect = Path(path), keep, bisect.bisect_right
        try:
            self.file = pq.ParquetFile(path, memory_map=False, page_checksum_verification=True)
            cols = ["sample", "name", "order", "dtype", "shape"]
            alias = "same_as" in self.file.schema_arrow.names
            index = self.file.read(columns=cols + ["same_as"] * alias)
        except FileNotFoundError:
            raise
        except (pa.ArrowException, OSError, ValueError) as e:  # not Parquet, truncated, bit flips
            raise corrupt(path, e) from None
        self.samples = index.column("sample").to_pylist()
        self.names = index.column("name").to_pylist()
        self.orders = index.column("order").to_pylist()
        self.dtypes = index.column("dtype").to_pylist()
        self.shapes = [tuple(s) for s in index.column("shape").to_pylist()]
        self.same_as = index.column("same_as").to_pylist() if alias else [None] * len(self.names)
        self.at: dict[tuple[int, str], int] | None = None  # (sample, name) -> row, built for aliases
        self.base: Rows | None = None
        counts = [self.file.metadata.row_group(g).num_rows for g in range(self.file.num_row_groups)]
        self.starts = [sum(counts[:g]) for g in range(len(counts))]
        self.cache: OrderedDict[int, list[np.ndarray]] = OrderedDict()
        self.groups_read = 0
        if self.keep == Rows.WHOLE:
            self.keep = self.file.num_row_groups if self.fits(KEEP_MB if whole_mb is None else whole_mb) else 2

    def prime(self, groups: list[list[np.ndarray]] | None) -> bool:
        """Take every row group's values from the Writer that wrote this file (Writer.kept) instead of
        decoding them: only when they match the file's row groups row for row and keep covers them
        all. Whether it took them."""
        if groups is None or self.keep < len(groups) or len(groups) != self.file.num_row_groups:
            return False
        if [len(g) for g in groups] != [self.file.metadata.row_group(i).num_rows for i in range(len(groups))]:
            return False
        self.cache = OrderedDict(enumerate(groups))
        return True

    def fits(self, mb: float) -> bool:
        """Whether every row group of the file, decoded, stays under `mb` MB (Parquet metadata: nothing
        read): resnet18's fp64 reference (134 MB in 4 row groups) fits 256, resnet50's (~600 MB) not."""
        md = self.file.metadata
        return sum(md.row_group(g).total_byte_size for g in range(md.num_row_groups)) <= mb * 2**20

    def value(self, i: int) -> np.ndarray:
        """Row i's array (a read-only view of its row group's buffer, as store.read gives; a row
        stored once elsewhere resolves through `same_as`)."""
        if self.same_as[i] is not None:
            return self._alias(i)
        g = self._bisect(self.starts, i) - 1
        arrays = self.cache.get(g)
        if arrays is None:
            while len(self.cache) >= max(self.keep, 1):  # before the read: `keep` groups at most, not keep + 1
                self.cache.popitem(last=False)
            try:
                arrays = [t.array for t in _tensors(self.file.read_row_group(g))]
            except (pa.ArrowException, OSError, ValueError) as e:
                raise corrupt(self.path, e) from None
            self.groups_read += 1
            self.cache[g] = arrays
        else:
            self.cache.move_to_end(g)
        return arrays[i - self.starts[g]]

    def _alias(self, i: int) -> np.ndarray:
        """Row i's value from the row its `same_as` names: in this file, or (`base:`) in the base file,
        cast to row i's dtype (read-only, the shape row i records)."""
        target, k = self.same_as[i], self.samples[i]
        if not target.startswith((BASE, XOR)):
            if self.at is None:
                self.at = {(s, n): j for j, (s, n) in enumerate(zip(self.samples, self.names))}
            return self.value(self.at[(k, target)])
        if self.base is None:
            md = read_metadata(self.path).get("base")
            base = self.path.parent / md if md else None
            if base is None or not base.exists():
                raise corrupt(self.path, f"its values refer to {base} (metadata `base`), which is missing")
            self.base = Rows(base, keep=self.keep)
            self.base.at = {(s, n): j for j, (s, n) in enumerate(zip(self.base.samples, self.base.names))}
        j = self.base.at.get((k, target.removeprefix(BASE).removeprefix(XOR)))
        if j is None:
            raise corrupt(self.path, f"{target} of sample {k} is not in {self.base.path}")
        arr = self.base.value(j).astype(np.dtype(self.dtypes[i]).newbyteorder("<")).reshape(self.shapes[i])
        if target.startswith(XOR):
            u = _UINT[arr.dtype.itemsize]
            np.bitwise_xor(arr.view(u), self._stored(i).view(u), out=arr.view(u))
        arr.flags.writeable = False
        return arr

    def _stored(self, i: int) -> np.ndarray:
        """Row i's own stored values (its row group's view)."""
        same, self.same_as[i] = self.same_as[i], None
        try:
            return self.value(i)
        finally:
            self.same_as[i] = same

    def by_sample(self) -> Iterator[tuple[int, "SampleRows"]]:
        """(k, {name: array} read on lookup) per sample, in file order (a sample's rows together)."""
        cur, where = None, {}
        for i, (k, name) in enumerate(zip(self.samples, self.names)):
            if k != cur and where:
                yield cur, SampleRows(self, where)
                where = {}
            cur = k
            where[name] = i
        if where:
            yield cur, SampleRows(self, where)


class SampleRows(Mapping):
    """One sample of a store file as {name: array}, each array read when it is looked up (Rows)."""

    def __init__(self, rows: Rows, where: dict[str, int]):
        self.rows, self.where = rows, where

    def __getitem__(self, name: str) -> np.ndarray:
        return self.rows.value(self.where[name])

    def __iter__(self):
        return iter(self.where)

    def __len__(self) -> int:
        return len(self.where)

    def __contains__(self, name) -> bool:
        return name in self.where

    def shape(self, name: str) -> tuple:
        """The stored shape of `name`, without reading its values."""
        return self.rows.shapes[self.where[name]]


def shape_in(ref: Mapping, name: str) -> tuple:
    """A tensor's shape in `ref` ({name: array} or SampleRows), its values unread where possible."""
    return ref.shape(name) if isinstance(ref, SampleRows) else np.shape(ref[name])


def _tensors(table: pa.Table) -> Iterator[Tensor]:
    """The rows of one decoded row group; an aliased row (`same_as`) yields an empty array here
    (Rows.value resolves it)."""
    if table.num_rows == 0:
        return
    cols = {c: _values(table.column(c)) for c in ("data", *FLOAT_COLUMNS) if c in table.column_names}
    samples = table.column("sample").to_pylist()
    names = table.column("name").to_pylist()
    orders = table.column("order").to_pylist()
    dtypes = table.column("dtype").to_pylist()
    shapes = table.column("shape").to_pylist()
    alias = table.column("same_as").to_pylist() if "same_as" in table.column_names else [None] * len(names)
    for i in range(table.num_rows):
        dt = np.dtype(dtypes[i])
        if not stores_values(alias[i]):
            arr = np.empty(0, dt)
        else:
            offsets, values = cols[dtypes[i] if dtypes[i] in cols and dtypes[i] in FLOAT_COLUMNS else "data"]
            lo, hi = int(offsets[i]), int(offsets[i + 1])
            arr = np.frombuffer(values, dtype=dt, count=(hi - lo) // dt.itemsize, offset=lo)
            arr = arr.reshape(shapes[i])
        arr.flags.writeable = False  # views share one buffer: never mutate in place
        yield Tensor(samples[i], names[i], orders[i], arr)


def _values(col: pa.ChunkedArray) -> tuple[np.ndarray, pa.Buffer | bytes]:
    """(byte offsets per row, value buffer) of a `data` (large_binary) or f4/f8 (large_list) column,
    without copying the values."""
    arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()  # combine_chunks copies even one chunk
    if pa.types.is_large_list(arr.type):
        child = arr.values  # the whole child array: offsets index into it
        width = child.type.byte_width
        offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset:arr.offset + len(arr) + 1]
        return (offsets + child.offset) * width, child.buffers()[1] or b""
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset:arr.offset + len(arr) + 1]
    return offsets, arr.buffers()[2] or b""


def read_dict(path: str | Path) -> dict[tuple[int, str], Tensor]:
    return {(t.sample, t.name): t for t in read(path)}


OUTPUT = "output"  # the model output's name (parity.models.layers uses the same); ":i" for tuples


PLAIN = "plain:"  # the shipped graph's outputs, captured beside the instrumented graph's


PRE = "pre:"  # a leaf call's first floating input (fp64.parquet): `pre:fc2`, `pre:relu#1`
BETWEEN = "between:"  # own.parquet: the value feeding a leaf, computed from reference leaf outputs


def is_output(name: str) -> bool:
    name = name.removeprefix(PLAIN)
    return name == OUTPUT or name.startswith(OUTPUT + ":")


def is_pre(name: str) -> bool:
    return name.startswith(PRE)


def own_reference_name(name: str) -> str:
    """The fp64 reference tensor an own.parquet row is compared with: `<leaf>` -> `<leaf>`,
    `between:<leaf>` -> `pre:<leaf>`, `between:output` (ops after the last leaf) -> `output`."""
    if name.startswith(BETWEEN):
        rest = name.removeprefix(BETWEEN)
        return rest if is_output(rest) else PRE + rest
    return name


def reference_name(name: str) -> str:
    """The reference tensor a captured name is compared with (plain:output -> output)."""
    return name.removeprefix(PLAIN)


def stored_once(rows: list[Tensor], release: bool = False) -> list[Tensor]:
    """One sample's rows with each `pre:` input that is byte for byte another row's value (most
    leaves' input is the previous leaf's output) written as a reference to it (`same_as`): resnet50's
    fp64 reference 4.02 -> 2.35 SA (issue 23). Candidates are found by dtype, shape and 17 sampled
    values, then compared whole. `release`: such a row keeps only its dtype and shape (a Writer needs
    no more), so its copy of the values is freed before the sample is written."""
    by: dict[tuple, list[Tensor]] = {}
    for t in rows:
        if not is_pre(t.name):
            by.setdefault(_key(np.asarray(t.array)), []).append(t)
    out = []
    for t in rows:
        a = np.asarray(t.array)
        hit = next((c for c in by.get(_key(a), []) if same_bytes(a, c.array)), None) if is_pre(t.name) else None
        if hit is not None:
            t = Tensor(t.sample, t.name, t.order, np.broadcast_to(np.zeros((), a.dtype), a.shape) if release else a,
                       hit.name)
        out.append(t)
    return out


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def xor_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a's bits XOR b's (same dtype and shape), as a's dtype: small where a is near b (high bytes 0)."""
    u = _UINT[a.dtype.itemsize]
    return np.bitwise_xor(np.asarray(a).view(u), np.asarray(b).view(u)).view(a.dtype)


def _key(a: np.ndarray) -> tuple:
    idx = np.linspace(0, a.size - 1, 17).astype(np.int64) if a.size else np.zeros(0, np.int64)
    return a.dtype.str, a.shape, np.take(a, idx).tobytes()


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """The same dtype, shape and bytes (NaN payloads and -0.0 included, unlike ==)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    u = _UINT.get(a.dtype.itemsize)
    if u is None or a.dtype.hasobject:
        return a.tobytes() == b.tobytes()
    return bool(np.array_equal(a.view(u), b.view(u)))


def rows_from(sample: int, named: list[tuple[str, np.ndarray]]) -> list[Tensor]:
    """Runner results (model outputs first, then layers in execution order) -> rows ordered by
    execution: layers 0..L-1, then the model outputs, then the recorded leaf inputs (`pre:`, in
    execution order), so the layers' `order` is the same with and without recorded inputs."""
    pres = [(n, v) for n, v in named if is_pre(n)]
    layers = [(n, v) for n, v in named if not is_output(n) and not is_pre(n)]
    outs = [(n, v) for n, v in named if is_output(n)]
    return [Tensor(sample, n, i, np.asarray(v)) for i, (n, v) in enumerate(layers + outs + pres)]
