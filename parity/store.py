"""Parquet tensor store: one row per (sample, layer), values as raw little-endian bytes.

Columns: sample (int32), name (string), order (int32, execution order; the model output last),
dtype (numpy dtype string), shape (list<int64>), data (large_binary).
Written without compression or dictionary encoding (fastest measured here: see DESIGN.md) with a
fixed schema and no timestamps, so identical tensors give byte-identical files. Reads decode the file once into
Arrow's value buffer and hand out each tensor as a read-only numpy view of it (no per-tensor copy).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from parity.io import atomic_path

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


def write(path: str | Path, tensors: Iterable[Tensor], metadata: dict[str, str] | None = None) -> int:
    """Atomically write tensors to `path`. Returns the number of rows.

    Zero-copy up to the Parquet encoder: each tensor's memory becomes one chunk of the `data` column
    as it is (a contiguous little-endian array is not copied; others are made so, once), so the
    only copy is the encoder's own. The file bytes do not depend on how the column is chunked."""
    cols = {k: [] for k in SCHEMA.names if k != "data"}
    chunks = []
    for t in tensors:
        a = np.ascontiguousarray(t.array)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        cols["sample"].append(int(t.sample))
        cols["name"].append(t.name)
        cols["order"].append(int(t.order))
        cols["dtype"].append(a.dtype.str.lstrip("<|="))
        cols["shape"].append(list(a.shape))
        chunks.append(_binary_chunk(a))
    schema = SCHEMA.with_metadata({k: str(v) for k, v in sorted((metadata or {}).items())})
    arrays = [pa.array(cols[n], type=schema.field(n).type) for n in SCHEMA.names if n != "data"]
    table = pa.Table.from_arrays([*arrays, pa.chunked_array(chunks, type=pa.large_binary())], schema=schema)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="none", use_dictionary=False,
                       write_statistics=False, store_schema=True)
    return table.num_rows


def _binary_chunk(a: np.ndarray) -> pa.Array:
    """One large_binary value holding `a`'s bytes, over `a`'s own memory (no copy)."""
    buf = pa.py_buffer(a.reshape(-1).view(np.uint8)) if a.size else pa.py_buffer(b"")
    offsets = pa.py_buffer(np.array([0, buf.size], dtype=np.int64))
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), 1, [None, offsets, buf])


def read_metadata(path: str | Path) -> dict[str, str]:
    md = pq.read_schema(path).metadata or {}
    return {k.decode(): v.decode() for k, v in md.items() if not k.startswith(b"ARROW")}


def read(path: str | Path) -> Iterator[Tensor]:
    """Yield tensors in file order; each array is a read-only view of the Arrow value buffer."""
    table = pq.read_table(path, memory_map=True)
    if table.num_rows == 0:
        return
    data = table.column("data").combine_chunks()
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
