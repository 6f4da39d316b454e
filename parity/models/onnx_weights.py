"""ONNX graphs whose weights live once, in one file beside them: onnx and numpy only, no torch.

Every graph parity writes (layers.onnx, model.onnx; for torch exports and ONNX-file models alike)
stores its initializers as ONNX external data in one shared file, `weights.bin`, in the model
directory; tensors under onnx's default size threshold (1024 bytes) stay inline, so shape inference
still sees the small integer tensors (Reshape shapes, Slice starts) it reads values from. Nothing here
loads a whole model's weights into a protobuf, serialises one or deep-copies one, so no graph meets
protobuf's 2 GiB limit:
- `pack` writes the initializers of a weightless graph (read from wherever they are: inline, or the
  external files a torch export or a user's file left) to one weights file, in graph order, each
  tensor at an aligned offset, and points the graph at it. Same graph, same bytes.
- `load_graph` reads a graph without its external data; graphs are pruned, cut and renamed that way,
  and `check` runs onnx's checker on the weightless graph after checking its external data itself
  (external_path: files reached through DVC's hard links or symlinks are read; onnx's loader refuses
  them), as every reader here does.
- onnxruntime takes a graph by path (or serialised, weightless, with the folder of its external data:
  session option `session.model_external_initializers_file_folder_path`) and memory-maps the weights
  file itself, so every session of a process reads the same pages. (Measured on bert_base, fp32: a
  session costs ~0.75 W of its kernels' repacked weights and nothing more; handing the weights in as
  OrtValues over a numpy memmap, `add_external_initializers` / `add_initializer`, cost more, ~1.4 W
  and ~0.75 W + the mapped file per session; disabling repacking changes the results.)
- `to_float16` is onnxruntime's float16 converter on the weightless graph plus the same per-tensor
  conversion (convert_np_to_float16) applied to the external initializers one at a time, written to
  a temp weights file (`Converted`) that the cell's graphs share.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx.helper import tensor_dtype_to_np_dtype
from onnx.numpy_helper import to_array

from parity.core import modelfiles
from parity.core.io import atomic_path

WEIGHTS = "weights.bin"
THRESHOLD = 1024   # bytes: onnx's default size_threshold; smaller tensors stay inline
ALIGN = 4096       # each external tensor starts on a page (mmap-friendly, as onnx aligns large ones)
CHUNK = 64 << 20   # bytes copied at a time


def load_graph(path) -> onnx.ModelProto:
    """The graph at `path` without its external data (initializers keep their references)."""
    return onnx.load(str(path), load_external_data=False)


def is_external(t: TensorProto) -> bool:
    return t.data_location == TensorProto.EXTERNAL


def external_info(t: TensorProto) -> dict:
    return {e.key: e.value for e in t.external_data}


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs a node holds as attributes (If branches, Loop and Scan bodies)."""
    return [sub for a in node.attribute for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs)]


def graphs(g: onnx.GraphProto):
    """`g` and every graph nested in its nodes' attributes, recursively: `g` first, then depth first."""
    yield g
    for n in g.node:
        for sub in subgraphs(n):
            yield from graphs(sub)


def initializers(m: onnx.ModelProto):
    """Every initializer of the main graph and of subgraphs (If/Loop bodies), in graph order."""
    for g in graphs(m.graph):
        yield from g.initializer


def set_external(t: TensorProto, location: str, offset: int, length: int) -> None:
    for f in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data",
              "string_data", "external_data"):
        t.ClearField(f)
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v


def _copy_range(src: Path, offset: int, length: int, out) -> None:
    """`length` bytes of `src` from `offset` appended to the file `out` (binary, at its end): in the
    kernel where it can (copy_file_range: bert_base's 437 MB in 0.1-0.4 s, 0.6-1.1 s through Python
    buffers), else CHUNK bytes at a time."""
    if hasattr(os, "copy_file_range"):
        out.flush()
        done = 0
        try:
            with open(src, "rb") as f:
                while done < length:
                    k = os.copy_file_range(f.fileno(), out.fileno(), length - done, offset + done)
                    if k == 0:
                        raise ValueError(f"external data file {src} ends before byte {offset + length}")
                    done += k
            out.seek(0, os.SEEK_END)
            return
        except OSError:  # a filesystem or kernel without it: the copy below, from where it stopped
            out.seek(0, os.SEEK_END)
            offset, length = offset + done, length - done
    with open(src, "rb") as f:
        f.seek(offset)
        left = length
        while left:
            buf = f.read(min(CHUNK, left))
            if not buf:
                raise ValueError(f"external data file {src} ends before byte {offset + length}")
            out.write(buf)
            left -= len(buf)


def external_path(t: TensorProto, base_dir) -> Path:
    """The file external tensor `t` reads under `base_dir`, where parity reads it: through a DVC hard
    link or a symbolic link into DVC's cache (onnx's loader refuses both), never outside the model's
    folder (a `../` or absolute location, a symlink elsewhere): modelfiles.external_file.
    onnx.checker.ValidationError names the tensor otherwise."""
    loc = external_info(t).get("location", "")
    try:
        return modelfiles.external_file(Path(base_dir), loc)
    except FileNotFoundError:
        raise onnx.checker.ValidationError(f"{t.name}: its external data file {loc!r} does not exist "
                                           f"under {base_dir}") from None
    except modelfiles.ExternalDataError as e:
        raise onnx.checker.ValidationError(f"{t.name}: {e}") from None


def external_range(t: TensorProto, f: Path) -> tuple[int, int]:
    """(offset, length) of external tensor `t` in its file `f`, checked: integers >= 0 within the file
    (a declared length past its end is refused before anything is read). A missing length is the rest
    of the file."""
    info, size = external_info(t), f.stat().st_size
    try:
        off = int(info.get("offset", 0))
        n = int(info["length"]) if "length" in info else size - off
    except ValueError:
        raise onnx.checker.ValidationError(f"{t.name}: external data offset/length are not integers: "
                                           f"{info.get('offset')!r}, {info.get('length')!r}") from None
    if off < 0 or n < 0 or off + n > size:
        raise onnx.checker.ValidationError(f"{t.name}: its external data (bytes {off} to {off + n}) runs past "
                                           f"the end of {f} ({size} bytes)")
    return off, n


# the location unsaved_graph gives the tensors it keeps in memory (what ONNXProgram.save would name the file)
IN_MEMORY = "layers.onnx.data"


def unsaved_graph(program) -> tuple[onnx.ModelProto, list]:
    """The graph `program` (a torch.onnx.ONNXProgram) would save with `external_data=True`, without
    writing its weights: each initializer over onnx_ir's 256-byte threshold stands as an external tensor
    at location IN_MEMORY whose offset is its index in the returned list of the program's own tensors
    (pack(memory=...) writes their bytes once, straight into weights.bin; the save wrote every byte
    to a temp file that pack then copied: 45% of llama_1b's export CPU, issue 38)."""
    import onnx_ir as ir  # lazy: the exporter's IR, loaded only by the torch export that made `program`

    model, memory = program.model, []
    values = [v for g in model.graphs() for v in g.initializers.values()]
    if unset := [v.name for v in values if v.const_value is None]:
        raise ValueError(f"The model contains uninitialized initializer values ({unset}).")
    kept = [v.const_value for v in values]
    try:
        for v, t in zip(values, kept):
            if t.nbytes > 256:  # onnx_ir.save's size_threshold_bytes: smaller ones it serialises inline
                v.const_value = ir.ExternalTensor(IN_MEMORY, len(memory), t.nbytes, t.dtype, shape=t.shape,
                                                  name=t.name, base_dir=".")
                memory.append(t)
        return ir.serde.serialize_model(model), memory
    finally:
        for v, t in zip(values, kept):
            v.const_value = t


def pack(m: onnx.ModelProto, base_dir, weights: Path, location: str = WEIGHTS,
         memory: list | None = None) -> onnx.ModelProto:
    """Write `m`'s initializers of THRESHOLD bytes or more to `weights` (one file, graph order, each at
    an ALIGN-ed offset) and point them there as `location`; smaller ones become inline raw_data. A
    tensor's bytes come from its inline fields, from its external file under `base_dir`, or (location
    IN_MEMORY, with `memory`: unsaved_graph) from the tensor object its offset indexes. `m` is changed in
    place and returned. Returns without holding more than one CHUNK of weights in memory (inline
    tensors and one IN_MEMORY tensor's bytes excepted)."""
    base, where, scratch = Path(base_dir), {}, {}  # scratch: _write_rows' buffer, reused
    with open(weights, "wb") as out:
        for t in initializers(m):
            if is_external(t):
                loc = external_info(t).get("location", "")
                held = memory is not None and loc == IN_MEMORY
                if held:  # the bytes the save would write (tobytes); large ones written without a copy
                    tensor = memory[int(external_info(t)["offset"])]
                    n = tensor.nbytes
                    raw = tensor.tobytes() if n < THRESHOLD else None
                else:
                    src = where[loc] if loc in where else where.setdefault(loc, external_path(t, base))
                    off, n = external_range(t, src)
                if n < THRESHOLD:  # small: inline, as a torch export keeps it
                    if not held:
                        with open(src, "rb") as f:
                            f.seek(off)
                            raw = f.read(n)
                    del t.external_data[:]
                    t.data_location = TensorProto.DEFAULT
                    t.raw_data = raw
                    continue
                pos = _align(out)
                if held:
                    _write_tensor(tensor, out, scratch)
                    if out.tell() - pos != n:
                        raise ValueError(f"{t.name}: {out.tell() - pos} bytes written, {n} expected")
                else:
                    _copy_range(src, off, n, out)
            else:
                if t.data_type == TensorProto.STRING:
                    continue
                raw = t.raw_data if t.HasField("raw_data") else to_array(t).tobytes()
                n = len(raw)
                if n < THRESHOLD:
                    continue
                pos = _align(out)
                out.write(raw)
            set_external(t, location, pos, n)
    return m


def _write_tensor(tensor, out, scratch: dict | None = None) -> None:
    """An in-memory tensor's bytes appended to `out`: the exporter's TorchTensor.tofile writes them from the
    tensor's own memory (its tobytes copies them first: 4.4 GB for llama_1b); a numpy-backed tensor that is
    not C-contiguous (a transpose the exporter's optimizer folded, as a view) goes CHUNK at a time through
    `scratch`'s buffer (_write_rows), the rest through its own tofile."""
    array = getattr(tensor, "raw", None)
    if isinstance(array, np.ndarray) and not array.flags.c_contiguous and _plain_bytes(tensor, array):
        _write_rows(array, out, {} if scratch is None else scratch)
    elif hasattr(tensor, "tofile"):
        out.flush()  # onnx_ir's numpy-backed tofile may write to the file descriptor itself
        tensor.tofile(out)
        out.seek(0, os.SEEK_END)
    else:
        out.write(tensor.tobytes())


def _plain_bytes(tensor, array: np.ndarray) -> bool:
    """Whether the tensor's serialised bytes are its array's own bytes in C order: whole-byte elements
    (onnx_ir packs 2-, 4- and 6-bit types) in little-endian order (it swaps big-endian ones)."""
    bits = getattr(getattr(tensor, "dtype", None), "bitwidth", 0)
    return (bits == array.dtype.itemsize * 8 and array.dtype.itemsize in (1, 2, 4, 8)
            and sys.byteorder == "little" and array.dtype.byteorder != ">")


def _write_rows(array: np.ndarray, out, scratch: dict) -> None:
    """A non-contiguous array's bytes in C order, CHUNK at a time along its first axis, each chunk gathered
    into one buffer kept in `scratch` across tensors (allocated once per pack). numpy's tofile writes such an array one element per fwrite: bert_base's 340 MB of
    folded transposes took 3 s of CPU that way. Where torch is loaded (the export stage), its strided
    copy gathers (blocked: half the CPU of numpy's for a transpose); the bytes are the same."""
    same = array.view(np.dtype(f"i{array.dtype.itemsize}"))  # bfloat16, float8: as ints of their width
    rows = max(1, CHUNK // max(1, same[0].nbytes))
    need = min(len(same), rows) * same[0].nbytes
    if scratch.get("buf") is None or scratch["buf"].nbytes < need:
        scratch["buf"] = np.empty(need, np.uint8)
    torch = sys.modules.get("torch") if min(array.strides) >= 0 else None
    for i in range(0, len(same), rows):
        chunk = same[i:i + rows]
        raw = scratch["buf"][:chunk.nbytes]
        part = raw.view(same.dtype).reshape(chunk.shape)
        if torch is not None:
            torch.from_numpy(part).copy_(torch.from_numpy(chunk))
        else:
            np.copyto(part, chunk)
        out.write(raw)


def _align(out) -> int:
    pos = out.tell()
    pad = (-pos) % ALIGN
    if pad:
        out.write(b"\0" * pad)
    return pos + pad


def save_graph(m: onnx.ModelProto, path) -> None:
    """Write a weightless graph (protobuf only; its external data stays where it points)."""
    Path(path).write_bytes(m.SerializeToString())


def check(path, full_check: bool = True) -> None:
    """onnx's check of the graph at `path`, its external data checked here rather than by onnx's loader
    (check_external). onnx refuses an external data file that is hard-linked (DVC's `cache.type
    hardlink` gives every tracked file and output two links) or a symbolic link (DVC's symlink cache
    type); parity reads both, and refuses what onnx's rules are for (`../` and absolute locations, a
    symlink out of the model's folder other than into DVC's cache, a range past the end of a file).
    onnx's checker then runs by path on the weightless graph written to a temp folder beside sparse
    stand-ins of its external data files (same names, same sizes, no bytes written): its own
    external-data rules then hold, and the weights are never read into a protobuf (past 2 GiB too)."""
    m, base = load_graph(path), Path(path).parent
    check_external(m, base)
    locations = modelfiles.onnx_locations(Path(path))  # every tensor's: Constant attributes' too
    if not locations:
        onnx.checker.check_model(str(path), full_check=full_check)
        return
    with tempfile.TemporaryDirectory(prefix="parity-check-") as d:
        for loc in locations:
            size = _located(base, loc).stat().st_size
            (Path(d) / loc).parent.mkdir(parents=True, exist_ok=True)
            stand = Path(d) / os.path.normpath(loc)
            stand.parent.mkdir(parents=True, exist_ok=True)
            with open(stand, "wb") as f:
                f.truncate(size)
        save_graph(m, Path(d) / "model.onnx")
        try:
            onnx.checker.check_model(str(Path(d) / "model.onnx"), full_check=full_check)
        except onnx.checker.ValidationError as e:
            raise onnx.checker.ValidationError(str(e).replace(str(d), str(base))) from None


def _located(base: Path, loc: str) -> Path:
    try:
        return modelfiles.external_file(base, loc)
    except FileNotFoundError:
        raise onnx.checker.ValidationError(f"external data file {loc!r} does not exist under {base}") from None
    except modelfiles.ExternalDataError as e:
        raise onnx.checker.ValidationError(str(e)) from None


def check_external(m: onnx.ModelProto, base_dir) -> None:
    """Every external tensor of `m` reads a file parity may read under `base_dir` (external_path), and
    bytes within it (external_range); onnx.checker.ValidationError names the first that does not."""
    seen: dict = {}
    for t in initializers(m):
        if is_external(t):
            loc = external_info(t).get("location", "")
            if loc not in seen:
                seen[loc] = external_path(t, base_dir)
            external_range(t, seen[loc])


def write_checked(m: onnx.ModelProto, path, full_check: bool = True) -> None:
    """Publish weightless graph `m` at `path` (atomic), checked (check) against the weights file
    beside it (`full_check`: with strict shape inference; a user's ONNX file is checked as given)."""
    with atomic_path(path) as tmp:
        save_graph(m, tmp)
        check(tmp, full_check)


def tensor_view(t: TensorProto, base_dir, maps: dict) -> np.ndarray:
    """The values of external tensor `t` as a read-only view of its memory-mapped file under `base_dir`."""
    info = external_info(t)
    f = str(Path(base_dir) / info.get("location", ""))
    if f not in maps:  # where parity may read it (through DVC's links), checked once per file
        maps[f] = np.memmap(external_path(t, base_dir), dtype=np.uint8, mode="r")
    dt = np.dtype(tensor_dtype_to_np_dtype(t.data_type))
    off = int(info.get("offset", 0))
    n = int(info["length"]) if "length" in info else int(np.prod(t.dims, dtype=np.int64)) * dt.itemsize
    if off < 0 or n < 0 or off + n > len(maps[f]):
        raise onnx.checker.ValidationError(f"{t.name}: its external data (bytes {off} to {off + n}) runs past "
                                           f"the end of {f} ({len(maps[f])} bytes)")
    return maps[f][off:off + n].view(dt).reshape(tuple(t.dims))


def read_by_nodes(m: onnx.ModelProto) -> set[str]:
    """Names the nodes of `m` read (subgraphs included) or its graph outputs name."""
    names = set()
    for g in graphs(m.graph):
        names.update(i for n in g.node for i in n.input)
        names.update(o.name for o in g.output)
    return names


def has_external(m: onnx.ModelProto) -> bool:
    return any(is_external(t) for t in initializers(m))


def with_data(m: onnx.ModelProto, base_dir) -> onnx.ModelProto:
    """`m` with its external data read in (for the few consumers that need a whole-model protobuf:
    the quantizers, the ONNX reference evaluator, reduce). Small models only. Read here (memory-mapped,
    tensor_view), not by onnx's loader: onnx refuses an external data file with several hard links
    ("potential hardlink attack") or a symbolic link, and DVC's `cache.type hardlink,symlink` links
    every output and every `dvc add`-ed file to its cache object (external_path: where parity reads)."""
    maps: dict = {}
    for t in initializers(m):
        if is_external(t):
            data = tensor_view(t, base_dir, maps).tobytes()
            del t.external_data[:]
            t.data_location = TensorProto.DEFAULT
            t.raw_data = data
    return m


def load_with_data(path) -> onnx.ModelProto:
    """The graph at `path` with its weights in (with_data; the external data beside the file)."""
    return with_data(load_graph(path), Path(path).parent)


class Converted:
    """A temp folder with one weights file of converted tensors (float16 copies of the model's
    weights), appended one tensor at a time and kept for the life of the runner: the layers, plain and
    cut graphs of a cell point at the same bytes. onnxruntime reads it as it reads weights.bin
    (a graph's external data folder: SessionOptions `session.model_external_initializers_file_folder_path`)."""

    def __init__(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="parity-weights-")
        self.dir = Path(self._tmp.name)
        self.index: dict[tuple[str, str], tuple[int, int]] = {}  # (name, dtype) -> (offset, length)

    def put(self, key: tuple[str, str], make) -> tuple[int, int]:
        """(offset, length) of tensor `key` in the file, written from `make()` (an array) the first time."""
        if key not in self.index:
            arr = np.ascontiguousarray(make())
            with open(self.dir / WEIGHTS, "ab") as f:
                pos = _align(f)
                f.write(memoryview(arr.reshape(-1)).cast("B"))
            self.index[key] = (pos, arr.nbytes)
        return self.index[key]

    def close(self) -> None:
        self._tmp.cleanup()


@contextlib.contextmanager
def _shapes_from_dims():
    """onnxruntime's float16 converter records a converted initializer's value_info from
    `numpy_helper.to_array(tensor).shape`, which reads the tensor's data; for an external tensor the
    same shape is its `dims`. Swapped in for the one call (the converter's result is otherwise
    unchanged)."""
    # lazy: onnxruntime +0.14 s (BENCHMARKS 22) for fp16 conversion only; the export stage never loads it
    from onnxruntime.transformers import float16

    orig = float16.make_value_info_from_tensor
    float16.make_value_info_from_tensor = lambda t: helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
    try:
        yield
    finally:
        float16.make_value_info_from_tensor = orig


def to_float16(m: onnx.ModelProto, base_dir, store: Converted | None, **kwargs) -> onnx.ModelProto:
    """`m` converted by onnxruntime's convert_float_to_float16(m, **kwargs), its external initializers
    (weights under `base_dir`) written to `store`, each converted with the converter's own per-tensor
    function (convert_np_to_float16) where the converter retyped it: the values are those of a
    conversion of the whole in-memory model, and no more than one tensor is converted at a time.
    Initializers no node reads are dropped first (onnxruntime drops them too)."""
    # lazy: onnxruntime +0.14 s (BENCHMARKS 22) for fp16 conversion only; the export stage never loads it
    from onnxruntime.transformers.float16 import convert_float_to_float16, convert_np_to_float16

    read = read_by_nodes(m)
    for g in graphs(m.graph):
        keep = [t for t in g.initializer if t.name in read]
        if len(keep) != len(g.initializer):
            del g.initializer[:]
            g.initializer.extend(keep)
    was = {t.name for t in initializers(m) if is_external(t) and t.data_type == TensorProto.FLOAT}
    with _shapes_from_dims():
        m = convert_float_to_float16(m, **kwargs)
    lo, hi = kwargs.get("min_positive_val", 5.96e-08), kwargs.get("max_finite_val", 65504.0)
    maps: dict = {}
    for t in [t for t in initializers(m) if is_external(t)]:
        src = TensorProto()
        src.CopyFrom(t)
        if t.name in was and t.data_type == TensorProto.FLOAT16:
            src.data_type = TensorProto.FLOAT

            def make(src=src):
                return convert_np_to_float16(tensor_view(src, base_dir, maps).reshape(-1), lo, hi)
        else:
            def make(src=src):
                return tensor_view(src, base_dir, maps)
        off, n = store.put((t.name, str(t.data_type)), make)
        set_external(t, WEIGHTS, off, n)
    maps.clear()  # unmap the source file
    return m

