"""A model's input specs beyond one synthetic shape: several input shapes (dynamic axes), token ids
bounded by the vocabulary, and arrays loaded from a file. Config layer: yaml-level logic, numpy and
pyarrow imported only where a file is read.

Shapes (`models.<m>.shapes`, optional): `{label: {input_name: [dims], ...}, ...}`. Each label is a
sample set of the same cell: `inputs.samples` samples per label, drawn at that label's shapes (inputs
not named keep their `input:` shape). Samples are numbered label after label (label i holds samples
i*n .. i*n+n-1), so the first label's samples are exactly what a model without `shapes` gets. The
export declares every axis whose size differs between labels dynamic, once. A model without
`shapes` is a single sample set (label None) and every artifact stays as it was.

Token ids (`init: tokens`): integers in [low, high), high defaulting to the model's vocabulary
(`arch.kwargs.vocab_size`), so an embedding lookup never reads past its table.

Files (`init: file`, `path: data/inputs/<f>`, optional `key:`): `.npy` (the array), `.npz` (the array
named `key`, default the input's name) or Parquet (parity's tensor store: rows named `key`, in sample
order; or a table with a column `key`, one sample a row). The array is `[N, *shape]` (N samples) or
exactly `shape` (one sample); the first `inputs.samples` samples are used. Files live under
`data/inputs/`, which the inputs stage depends on (git- or DVC-tracked: `dvc add data/inputs/x.npy`).
"""

from __future__ import annotations

import re
from pathlib import Path

from parity.config import schema

INPUT_DIR = "data/inputs"  # real input files: the inputs stage's dependency (dvc.yaml)
LABEL = re.compile(r"^[A-Za-z0-9_]+$")
FILE_SUFFIXES = (".npy", ".npz", ".parquet")


def labels(m: dict) -> list[str | None]:
    """The model's sample-set labels: [None] without `shapes`."""
    return list(m.get("shapes") or {}) or [None]


def specs_for(m: dict, label: str | None) -> list[dict]:
    """The input specs at one label's shapes (token ranges resolved)."""
    shapes = (m.get("shapes") or {}).get(label) or {} if label is not None else {}
    return [resolve_tokens({**s, "shape": list(shapes.get(s["name"], s["shape"]))}, m.get("arch") or {})
            for s in m["input"]]


def sample_sets(m: dict, n: int) -> list[tuple[str | None, range]]:
    """(label, sample indices) per sample set: n samples each, label after label."""
    return [(lab, range(i * n, (i + 1) * n)) for i, lab in enumerate(labels(m))]


def describe(m: dict, label: str | None) -> str:
    """'b4 (input [4, 3, 224, 224])': how a message names a shape."""
    dims = ", ".join(f"{s['name']} {s['shape']}" for s in specs_for(m, label))
    return f"{label} ({dims})"


def dynamic_axes(m: dict) -> dict[str, dict[int, str]]:
    """{input name: {axis: dim name}} for the axes whose size differs between labels; {} for a single
    shape. Axes with the same sizes in every label share one dim (input_ids and attention_mask have
    one sequence length: torch.export rejects two independent dims the model forces equal), named
    after the first input axis that has it."""
    sets = [specs_for(m, lab) for lab in labels(m)]
    dims: dict[tuple, str] = {}
    out = {}
    for i, s in enumerate(sets[0]):
        axes = {}
        for a in range(len(s["shape"])):
            sizes = tuple(ss[i]["shape"][a] for ss in sets)
            if len(set(sizes)) > 1:
                axes[a] = dims.setdefault(sizes, f"{s['name']}_{a}")
        if axes:
            out[s["name"]] = axes
    return out


def export_label(m: dict) -> str | None:
    """The label the export traces: the largest (torch.export specialises a size-1 dim, so a
    dynamic axis needs an example > 1 where the sizes allow it)."""
    def numel(lab):
        n = 1
        for s in specs_for(m, lab):
            for d in s["shape"]:
                n *= d
        return n
    return max(labels(m), key=lambda lab: (numel(lab), -labels(m).index(lab)))


ITEMSIZE = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2}


def nbytes(m: dict, samples: int, calibration: int = 0) -> int:
    """The bytes of the model's input arrays: `samples` per sample set plus `calibration` samples at
    the export label's shapes (what the inputs stage holds in memory and writes)."""
    def one(lab) -> int:
        total = 0
        for s in specs_for(m, lab):
            n = ITEMSIZE.get(s.get("dtype", schema.InputSpec.dtype), 8)
            for d in s["shape"]:
                n *= d
            total += n
        return total
    return samples * sum(one(lab) for lab in labels(m)) + calibration * one(export_label(m))


def vocab_bound(spec: dict, arch: dict) -> int | None:
    """The exclusive upper bound on an integer input's values: `high`, else the vocabulary for token
    ids (`init: tokens`, or `input_ids` of a Hugging Face model)."""
    if spec.get("high") is not None and spec.get("init") in ("tokens", "file"):
        return int(spec["high"])
    if spec.get("init") == "tokens" or (arch.get("source") == "hf" and spec.get("name") == "input_ids"):
        v = (arch.get("kwargs") or {}).get("vocab_size")
        return int(v) if v is not None else None
    return None


def resolve_tokens(spec: dict, arch: dict) -> dict:
    """`init: tokens` as the randint draw it is: [low, vocabulary)."""
    if spec.get("init") != "tokens":
        return spec
    low = spec.get("low", schema.INIT_BOUNDS["tokens"][0])
    return {**spec, "init": "randint", "low": int(low), "high": vocab_bound(spec, arch)}


def validate(where: str, m: dict) -> None:
    """Compose-time checks of `shapes`, token bounds and file inputs (ValueError naming the key)."""
    names = [s.get("name") for s in m["input"]]
    shapes = m.get("shapes")
    if shapes is not None:
        if not isinstance(shapes, dict) or not shapes:
            raise ValueError(f"{where}.shapes: expected a mapping label -> {{input name: [dims]}}, got {shapes!r}")
        for lab, entry in shapes.items():
            w = f"{where}.shapes.{lab}"
            if not LABEL.match(str(lab)):
                raise ValueError(f"{w}: a shape label may only use [A-Za-z0-9_] (it names the sample set)")
            if not isinstance(entry, dict) or not entry:
                raise ValueError(f"{w}: expected {{input name: [dims]}}, got {entry!r}")
            for name, dims in entry.items():
                if name not in names:
                    raise ValueError(f"{w}.{name}: no such input. Valid: {', '.join(map(str, names))}")
                spec = m["input"][names.index(name)]
                if not isinstance(dims, list) or not all(isinstance(d, int) and d > 0 for d in dims) \
                        or len(dims) != len(spec["shape"]):
                    raise ValueError(f"{w}.{name}: expected {len(spec['shape'])} positive ints (the rank of "
                                     f"{where}.input {name}), got {dims!r}")
    arch = m.get("arch") or {}
    for i, spec in enumerate(m["input"]):
        w = f"{where}.input[{i}]"
        init = spec.get("init", schema.InputSpec.init)
        if init in ("tokens", "randint") and spec.get("dtype") not in ("int64", "int32", "bool" if init == "randint" else ""):
            raise ValueError(f"{w}.dtype: init {init} gives integers: use int64 or int32{' (or bool: 0/1 draws)' if init == 'randint' else ''}, not {spec.get('dtype')!r}")
        if spec.get("dtype") == "bool" and init not in ("randint", "zeros", "ones", "file"):
            raise ValueError(f"{w}.init: a bool input takes init randint (0/1 draws), zeros, ones or file, not {init!r}")
        bound = vocab_bound(spec, arch)
        if init == "tokens" and bound is None:
            raise ValueError(f"{w}: init tokens needs `high` or {where}.arch.kwargs.vocab_size")
        if init == "randint" and arch.get("source") == "hf" and spec.get("name") == "input_ids":
            vocab = (arch.get("kwargs") or {}).get("vocab_size")
            if vocab is not None and int(spec.get("high", schema.INIT_BOUNDS["randint"][1])) > int(vocab):
                raise ValueError(f"{w}.high: {spec.get('high')} exceeds {where}.arch.kwargs.vocab_size {vocab}: "
                                 "token ids must index the embedding table (use init: tokens)")
        if init == "file":
            path = spec.get("path")
            if not isinstance(path, str) or not Path(path).suffix in FILE_SUFFIXES:
                raise ValueError(f"{w}.path: expected a {'/'.join(FILE_SUFFIXES)} file under {INPUT_DIR}/, got {path!r}")
            if Path(path).is_absolute() or Path(path).parts[:2] != tuple(INPUT_DIR.split("/")) or ".." in Path(path).parts:
                raise ValueError(f"{w}.path: {path!r} is not under {INPUT_DIR}/ (the inputs stage depends on that "
                                 "folder, so a file elsewhere would not re-run it when it changes)")
            if shapes is not None:
                raise ValueError(f"{w}: file inputs have the file's shape; {where}.shapes cannot change it")
