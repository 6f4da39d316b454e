"""Parquet tensor store: one row per (sample, layer), values as raw little-endian bytes.

Columns: sample (int32), name (string), order (int32, execution order; the model output last),
dtype (numpy dtype string), shape (list<int64>), data (large_binary).
Written without compression or dictionary encoding (float bytes barely compress; writing them raw was the fastest choice measured) with a
fixed schema and no timestamps, so identical tensors give byte-identical files. Reads decode the file once into
Arrow's value buffer and hand out each tensor as a read-only numpy view of it (no per-tensor copy).
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

SCHEMA = pa.schema([
    ("sample", pa.int32()),
    ("name", pa.string()),
    ("order", pa.int32()),
    ("dtype", pa.string()),
    ("shape", pa.list_(pa.int64())),
    ("data", pa.large_binary()),
])


@dataclass(frozen=True)
class Tensor:
    sample: int
    name: str
    order: int
    array: np.ndarray


def _table(rows: list[tuple[Tensor, np.ndarray, np.dtype]], metadata: dict[str, str] | None) -> pa.Table:
    """One Arrow table of `rows` (tensor, array, little-endian dtype). Each tensor's bytes are copied
    once, straight into the one value buffer of the `data` column (byte order and strides fixed in
    that same copy), which Arrow then uses as it is; the Parquet encoder's copy into its pages is the
    only other one. One buffer, one chunk: the writer sees the column exactly as a column built from
    per-tensor `bytes` (the earlier, twice-copying write), so the files keep their bytes."""
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([a.nbytes for _, a, _ in rows], out=offsets[1:])
    values = np.empty(int(offsets[-1]), dtype=np.uint8)
    for (_, a, le), lo, hi in zip(rows, offsets[:-1], offsets[1:]):
        np.copyto(values[lo:hi].view(le).reshape(a.shape), a, casting="equiv")
    data = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(rows),
                                            [None, pa.py_buffer(offsets), pa.py_buffer(values)])
    cols = [pa.array([int(t.sample) for t, _, _ in rows], pa.int32()),
            pa.array([t.name for t, _, _ in rows], pa.string()),
            pa.array([int(t.order) for t, _, _ in rows], pa.int32()),
            pa.array([le.str.lstrip("<|=") for _, _, le in rows], pa.string()),
            pa.array([list(a.shape) for _, a, _ in rows], pa.list_(pa.int64())), data]
    return pa.Table.from_arrays(cols, schema=_schema(metadata))


def _schema(metadata: dict[str, str] | None) -> pa.Schema:
    return SCHEMA.with_metadata({k: str(v) for k, v in sorted((metadata or {}).items())})


WRITE_OPTIONS = dict(compression="none", use_dictionary=False, write_statistics=False, store_schema=True)


def buffer_bytes() -> int:
    """How many bytes of values a Writer holds before it writes them out as a row group:
    PARITY_STORE_BUFFER_MB (default 32). A file whose values fit is written as one row group, byte for
    byte what the whole-table write gave; a larger one becomes row groups of about this size, so a
    stage holds at most this much (and the encoder's copy of it) beside the values it is computing.
    resnet18's reference stage: 1.41 GB peak RSS holding its 240 MB fp64 file whole, 0.71 GB at 32 MB
    (0.63 GB at 8 MB). The bytes of a file depend on this value: keep it fixed."""
    return int(float(os.environ.get("PARITY_STORE_BUFFER_MB", "32")) * 2**20)


class Writer:
    """Rows appended in file order, written as they arrive: buffered up to `budget` bytes of values
    (store.buffer_bytes), then flushed as a row group, onto a temp file beside `path`. publish()
    renames it into place; abort() removes it (an interrupted process leaves at most the hidden
    temp file, never a partial `path`: parity.core.io.atomic_path). `store.writer(path)` does either."""

    def __init__(self, path: str | Path, metadata: dict[str, str] | None = None, budget: int | None = None):
        self.path, self.metadata = Path(path), metadata
        self.budget = buffer_bytes() if budget is None else budget
        self.rows: list[tuple[Tensor, np.ndarray, np.dtype]] = []
        self.held = 0
        self.count = 0
        self._pq: pq.ParquetWriter | None = None
        self._atomic = atomic_path(self.path)
        self.tmp = self._atomic.__enter__()

    def add(self, t: Tensor) -> None:
        a = np.asarray(t.array)  # a rank-0 tensor keeps shape [] (files written before stored it as [1])
        self.rows.append((t, a, a.dtype.newbyteorder("<")))
        self.held += a.nbytes
        self.count += 1
        if self.held >= self.budget:
            self.flush()

    def extend(self, tensors: Iterable[Tensor]) -> None:
        for t in tensors:
            self.add(t)

    def flush(self) -> None:
        if not self.rows:
            return
        table = _table(self.rows, self.metadata)
        self.rows, self.held = [], 0
        if self._pq is None:
            self._pq = pq.ParquetWriter(self.tmp, table.schema, **WRITE_OPTIONS)
        self._pq.write_table(table)

    def publish(self) -> int:
        """Write what is buffered and rename the file into place; the number of rows."""
        if self._pq is None:  # everything fit: one table, as store.write always wrote it
            pq.write_table(_table(self.rows, self.metadata), self.tmp, **WRITE_OPTIONS)
        else:
            self.flush()
            self._pq.close()
        self.rows, self.held = [], 0
        self._atomic.__exit__(None, None, None)
        return self.count

    def abort(self) -> None:
        """Drop everything: the temp file is removed, `path` is left as it was."""
        if self._pq is not None:
            self._pq.close()
        self.rows, self.held = [], 0
        err = _Aborted()
        self._atomic.__exit__(_Aborted, err, None)


class _Aborted(Exception):
    pass


@contextlib.contextmanager
def writer(path: str | Path, metadata: dict[str, str] | None = None, budget: int | None = None):
    """A Writer published when the block ends without raising, aborted when it raises."""
    w = Writer(path, metadata, budget)
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
    """Yield tensors in file order; each array is a read-only view of its row group's Arrow value
    buffer. Row groups are decoded one at a time (a streamed file holds several), so a reader that
    does not keep the arrays holds one row group's values at most. Read, not memory-mapped: the
    pages of a mapped file stay in the process's RSS until the file is closed (a 1 GB fp64 reference
    read sample by sample counted whole: resnet50's baseline peaked at 2.9 GiB, 1.5 GiB read)."""
    try:
        f = pq.ParquetFile(path, memory_map=False)
        for g in range(f.num_row_groups):
            yield from _tensors(f.read_row_group(g))
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError, ValueError) as e:  # not Parquet, truncated, bit flips
        raise corrupt(path, e) from None


class Rows:
    """A store file read row by row when a value is asked for: the (sample, name, shape) columns are
    read at once, each value's row group when a value in it is first asked for, and the `keep` row
    groups read last stay decoded (store.buffer_bytes each, about). A reader whose requests go
    through the file in order, or through a few of its regions each in order (an own-error run:
    leaf outputs and recorded `pre:` inputs), reads each row group about once and holds `keep` of
    them, not a whole sample: resnet50's fp64 sample is 490 MB (issue 23)."""

    def __init__(self, path: str | Path, keep: int = 2):
        self.path, self.keep, self._bisect = Path(path), keep, bisect.bisect_right
        try:
            self.file = pq.ParquetFile(path, memory_map=False)
            index = self.file.read(columns=["sample", "name", "shape"])
        except FileNotFoundError:
            raise
        except (pa.ArrowException, OSError, ValueError) as e:  # not Parquet, truncated, bit flips
            raise corrupt(path, e) from None
        self.samples = index.column("sample").to_pylist()
        self.names = index.column("name").to_pylist()
        self.shapes = [tuple(s) for s in index.column("shape").to_pylist()]
        counts = [self.file.metadata.row_group(g).num_rows for g in range(self.file.num_row_groups)]
        self.starts = [sum(counts[:g]) for g in range(len(counts))]
        self.cache: OrderedDict[int, list[np.ndarray]] = OrderedDict()
        self.groups_read = 0

    def value(self, i: int) -> np.ndarray:
        """Row i's array (a read-only view of its row group's buffer, as store.read gives)."""
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
    if table.num_rows == 0:
        return
    col = table.column("data")
    data = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()  # combine_chunks copies even one chunk
    offsets = np.frombuffer(data.buffers()[1], dtype=np.int64)[data.offset:data.offset + len(data) + 1]
    values = data.buffers()[2]
    samples = table.column("sample").to_pylist()
    names = table.column("name").to_pylist()
    orders = table.column("order").to_pylist()
    dtypes = table.column("dtype").to_pylist()
    shapes = table.column("shape").to_pylist()
    for i in range(table.num_rows):
        lo, hi = int(offsets[i]), int(offsets[i + 1])
        dt = np.dtype(dtypes[i])
        arr = np.frombuffer(values, dtype=dt, count=(hi - lo) // dt.itemsize, offset=lo)
        arr.flags.writeable = False  # views share one buffer: never mutate in place
        yield Tensor(samples[i], names[i], orders[i], arr.reshape(shapes[i]))


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


def rows_from(sample: int, named: list[tuple[str, np.ndarray]]) -> list[Tensor]:
    """Runner results (model outputs first, then layers in execution order) -> rows ordered by
    execution: layers 0..L-1, then the model outputs, then the recorded leaf inputs (`pre:`, in
    execution order), so the layers' `order` is the same with and without recorded inputs."""
    pres = [(n, v) for n, v in named if is_pre(n)]
    layers = [(n, v) for n, v in named if not is_output(n) and not is_pre(n)]
    outs = [(n, v) for n, v in named if is_output(n)]
    return [Tensor(sample, n, i, np.asarray(v)) for i, (n, v) in enumerate(layers + outs + pres)]
