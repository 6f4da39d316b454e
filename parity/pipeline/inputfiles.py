"""Input samples of a model, synthetic or loaded from files (`init: file`), sample set after sample
set (`models.<m>.shapes`): the inputs stage's arrays. What the specs mean (shapes, token bounds,
which files are allowed) is parity.config.inputspec; this module reads the files (numpy, pyarrow, the
tensor store), so the config layer stays free of them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from parity.config import schema
from parity.config.inputspec import export_label, sample_sets, specs_for, vocab_bound
from parity.core import store


class InputError(ValueError):
    """A bad input file or value range: the message names the key and the file."""


def model_samples(m: dict, seed: int, n: int, generate) -> list[dict]:
    """Every sample of the model, sample set after sample set: {input name: array}. `generate(spec,
    seed, sample, index)` draws a synthetic input; `init: file` inputs come from their file."""
    files = {i: load_file(s, m.get("arch") or {}, n) for i, s in enumerate(m["input"]) if s.get("init") == "file"}
    out = []
    for lab, idx in sample_sets(m, n):
        specs = specs_for(m, lab)
        for j, k in enumerate(idx):
            out.append({s["name"]: files[i][j] if i in files else generate(s, seed, k, i) for i, s in enumerate(specs)})
    return out


def load_file(spec: dict, arch: dict, n: int):
    """The first n samples of a file input, as an [n, *shape] array of the spec's dtype (InputError
    naming the file and the problem otherwise)."""
    path, name = Path(spec["path"]), spec["name"]
    key = spec.get("key", name)
    where = f"input '{name}' (init: file, path: {path})"
    if not path.is_file():
        raise InputError(f"{where}: no such file (git-track it, or `dvc add` it and `dvc pull`)")
    try:
        a = _read_array(path, key)
    except InputError:
        raise
    except Exception as e:  # numpy/pyarrow's own message says what is wrong with the file
        raise InputError(f"{where}: cannot read it: {type(e).__name__}: {e}") from e
    if a.dtype.kind not in "biuf":  # strings, objects, complex, dates: not an input tensor
        raise InputError(f"{where}: array of dtype {a.dtype} ({_KINDS.get(a.dtype.kind, 'not numbers')}); "
                         f"expected numbers for a {schema.section(schema.InputSpec, spec).dtype} input")
    shape = tuple(spec["shape"])
    if a.shape == shape:
        a = a[None]
    if a.shape[1:] != shape:
        raise InputError(f"{where}: array of shape {list(a.shape)}; expected {list(shape)} (one sample) or "
                         f"[N, {', '.join(map(str, shape))}] (N samples)")
    if a.shape[0] < n:
        raise InputError(f"{where}: holds {a.shape[0]} samples, inputs.samples asks for {n}")
    dt = np.dtype(schema.section(schema.InputSpec, spec).dtype)
    a = a[:n]
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        bad = int(a.size - np.count_nonzero(np.isfinite(a)))
        raise InputError(f"{where}: {bad} non-finite values (NaN/Inf) in the {n} samples used; parity compares "
                         "finite inputs: replace them in the file")
    if dt.kind == "b" and a.dtype.kind != "b" and a.size and not np.isin(a, (0, 1)).all():
        raise InputError(f"{where}: a bool input holds 0/1 or true/false values, the file has others "
                         f"(span [{a.min()}, {a.max()}])")
    if dt.kind in "iu":
        if a.dtype.kind == "f" and not np.array_equal(a, np.round(a)):
            raise InputError(f"{where}: non-integer values for an {dt} input")
        bound = vocab_bound(spec, arch)  # only token ids have a range: negative axes/indices are valid ONNX
        ids = bound is not None or (arch.get("source") == "hf" and name == "input_ids")
        lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 0)
        if ids and (lo < 0 or (bound is not None and hi >= bound)):
            raise InputError(f"{where}: values span [{lo}, {hi}], outside [0, {bound}) "
                             f"({'the vocabulary: arch.kwargs.vocab_size' if spec.get('high') is None else 'high'})")
    return np.ascontiguousarray(a.astype(dt))


_KINDS = {"U": "strings", "S": "bytes", "O": "Python objects", "c": "complex numbers", "M": "dates",
          "m": "time deltas", "V": "records"}


def _read_array(path: Path, key: str):
    if path.suffix == ".npy":
        return np.load(path, allow_pickle=False)
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            if key not in z.files:
                raise InputError(f"{path}: no array '{key}' (key:). Arrays: {', '.join(z.files)}")
            return z[key]

    cols = pq.read_schema(path).names
    if {"sample", "name", "data"} <= set(cols):  # parity's tensor store
        rows = sorted((t for t in store.read(path) if t.name == key), key=lambda t: t.sample)
        if not rows:
            raise InputError(f"{path}: no tensor named '{key}' (key:)")
        return np.stack([t.array for t in rows])
    if key not in cols:
        raise InputError(f"{path}: no column '{key}' (key:). Columns: {', '.join(cols)}")
    col = pq.read_table(path, columns=[key]).column(key).to_pylist()
    return np.array(col)


def model_calibration(m: dict, seed: int, c: int, generate) -> list[dict]:
    """INT8 calibration samples at the export label's shapes; a file input cycles through its file."""
    lab = export_label(m)
    specs = specs_for(m, lab)
    files = {}
    for i, s in enumerate(m["input"]):
        if s.get("init") == "file" and c:
            files[i] = load_file(s, m.get("arch") or {}, _count(s))  # every sample the file holds
    return [{s["name"]: files[i][k % len(files[i])] if i in files else generate(s, seed, k, i, calibration=True)
             for i, s in enumerate(specs)} for k in range(c)]


def _count(spec: dict) -> int:
    """How many samples a file input holds."""
    a = _read_array(Path(spec["path"]), spec.get("key", spec["name"]))
    return 1 if tuple(a.shape) == tuple(spec["shape"]) else int(np.shape(a)[0])
