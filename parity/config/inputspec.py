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

Text (`init: text`, a model with a checkpoint folder: `arch: {source: hf, path: <dir>}`): prompts given
inline (`prompts: [...]`) or in a file (`path: data/inputs/<f>.txt`, one prompt a line, blank lines
skipped), tokenised by the checkpoint's own tokenizer and padded/truncated to the declared shape
([S] or [B, S]: S tokens). `key:` names the tokenizer's field the input holds: input_ids (the default
for an input named so), attention_mask or token_type_ids; companion inputs (the mask) take `init: text`
with their `key:` and the same prompts, or none (then the first text input's). Every text input of a
model has the same shape. The folder must hold tokenizer.json (the fast tokenizer's one file);
parity.pipeline.inputfiles tokenises.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from parity.config import schema

INPUT_DIR = "data/inputs"  # real input files: the inputs stage's dependency (dvc.yaml)
LABEL = re.compile(r"^[A-Za-z0-9_]+$")
FILE_SUFFIXES = (".npy", ".npz", ".parquet")
TEXT_SUFFIXES = (".txt",)  # init: text, path: a prompts file
TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids")  # init: text: the tokenizer's fields
# what to do about a checkpoint folder without tokenizer.json (the file init: text reads)
NO_TOKENIZER = ("init: text reads the fast tokenizer file; for a folder with only tokenizer.model or vocab files, "
                "write it once: AutoTokenizer.from_pretrained(folder).save_pretrained(folder)")


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


TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", "config.json")  # what init: text reads


@dataclass(frozen=True)
class InputPlan:
    """A model's `input:` and `shapes:` resolved once, for the samples and the export: per label its
    specs (token ranges resolved) and sample numbers, the export's label and dynamic axes, each shape as messages name it,
    each input's value bound, and what `init: text` reads from the checkpoint folder. Made by `plan`;
    the modules that draw, load, tokenise and export read it and nothing of the config."""
    inputs: list
    labels: list
    specs: dict
    sample_sets: list
    export_label: str | None
    dynamic: dict
    shown: dict
    bounds: list
    ids: list
    vocab: int | None
    vocab_where: str
    text: dict = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [s["name"] for s in self.inputs]


def plan(m: dict, n: int = 1) -> InputPlan:
    """The model's InputPlan for `n` samples a shape (`inputs.samples`; sample_sets numbers them);
    config-level reads only: the checkpoint's config.json and, with `init: text`, its tokenizer's json files."""
    arch = m.get("arch") or {}
    labs = labels(m)
    src = text_source(m) if any(s.get("init") == "text" for s in m["input"]) else {}
    if src:
        folder = Path(str(arch.get("path")))
        src = {**src, "folder": str(folder), "files": {f: _json_object(folder / f) for f in TOKENIZER_FILES}}
    return InputPlan(inputs=list(m["input"]), labels=labs, specs={lab: specs_for(m, lab) for lab in labs},
                     sample_sets=sample_sets(m, n),
                     export_label=export_label(m), dynamic=dynamic_axes(m),
                     shown={lab: describe(m, lab) for lab in labs},
                     bounds=[vocab_bound(s, arch) for s in m["input"]],
                     ids=[vocab_bound(s, arch) is not None or (arch.get("source") == "hf" and s["name"] == "input_ids")
                          for s in m["input"]],
                     vocab=model_vocab(arch), vocab_where=vocab_where(arch), text=src)


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


def checkpoint_config(arch: dict) -> dict:
    """The config.json of an hf checkpoint folder (`arch.path`) as a dict; {} for any other model or
    a folder without a readable one (validation says so)."""
    if arch.get("source") != "hf" or not isinstance(arch.get("path"), str):
        return {}
    return _json_object(Path(arch["path"]) / "config.json")


def _json_object(path: Path) -> dict:
    """A JSON object file's content, {} when it is missing or not one (the config layer reads a
    checkpoint's own json files itself: parity.core.io.json_object is the same rule for the layers above)."""
    try:
        got = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


def model_vocab(arch: dict) -> int | None:
    """The model's vocabulary size: `arch.kwargs.vocab_size`, or a checkpoint's config.json's."""
    v = (arch.get("kwargs") or {}).get("vocab_size")
    if v is None:
        cfg = checkpoint_config(arch)
        v = cfg.get("vocab_size", (cfg.get("text_config") or {}).get("vocab_size"))
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def vocab_where(arch: dict) -> str:
    """Where model_vocab read the vocabulary size (for messages)."""
    return f"{arch['path']}/config.json vocab_size" if arch.get("path") else "arch.kwargs.vocab_size"


def vocab_bound(spec: dict, arch: dict) -> int | None:
    """The exclusive upper bound on an integer input's values: `high`, else the vocabulary for token
    ids (`init: tokens`, or `input_ids` of a Hugging Face model)."""
    if spec.get("high") is not None and spec.get("init") in ("tokens", "file"):
        return int(spec["high"])
    if spec.get("init") == "tokens" or (arch.get("source") == "hf" and spec.get("name") == "input_ids"):
        return model_vocab(arch)
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
            vocab = model_vocab(arch)
            if vocab is not None and int(spec.get("high", schema.INIT_BOUNDS["randint"][1])) > int(vocab):
                raise ValueError(f"{w}.high: {spec.get('high')} exceeds {where}.{vocab_where(arch)} {vocab}: "
                                 "token ids must index the embedding table (use init: tokens)")
        if init == "file":
            _input_file(w, spec.get("path"), FILE_SUFFIXES)
            if shapes is not None:
                raise ValueError(f"{w}: file inputs have the file's shape; {where}.shapes cannot change it")
    _positions(where, m)
    _text(where, m)


POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len")  # what transformers' configs call it


def _positions(where: str, m: dict) -> None:
    """A Hugging Face model's token inputs no longer than its position table (`arch.kwargs` or the
    checkpoint's config.json; unknown when neither says): issue 36 item 7, tiny_llama at [1, 100000] with
    256 positions was accepted and its export ran for minutes."""
    arch = m.get("arch") or {}
    if arch.get("source") != "hf":
        return
    cfg = {**checkpoint_config(arch), **(arch.get("kwargs") or {})}
    key = next((k for k in POSITION_KEYS if isinstance(cfg.get(k), int) and not isinstance(cfg.get(k), bool)), None)
    if key is None:
        return
    limit = int(cfg[key])
    for lab in labels(m):
        for s in specs_for(m, lab):
            if s.get("dtype", schema.InputSpec.dtype) in ("int64", "int32") and len(s["shape"]) >= 2 \
                    and s["shape"][-1] > limit:
                at = f"{where}.shapes.{lab}.{s['name']}" if lab is not None else f"{where}.input {s['name']}"
                src = f"{arch['path']}/config.json" if key not in (arch.get("kwargs") or {}) else f"{where}.arch.kwargs"
                raise ValueError(f"{at}: {s['shape'][-1]} tokens, more than the model's {limit} positions "
                                 f"({src} {key}): use at most {limit}")


def _input_file(w: str, path, suffixes: tuple) -> None:
    """A real input file's path: a `suffixes` file under data/inputs/ (the inputs stage's dependency)."""
    if not isinstance(path, str) or Path(path).suffix not in suffixes:
        raise ValueError(f"{w}.path: expected a {'/'.join(suffixes)} file under {INPUT_DIR}/, got {path!r}")
    if Path(path).is_absolute() or Path(path).parts[:2] != tuple(INPUT_DIR.split("/")) or ".." in Path(path).parts:
        raise ValueError(f"{w}.path: {path!r} is not under {INPUT_DIR}/ (the inputs stage depends on that "
                         "folder, so a file elsewhere would not re-run it when it changes)")


def text_source(m: dict) -> dict:
    """{'prompts': [...]} or {'path': file} of the model's text inputs (the first that gives one)."""
    for s in m["input"]:
        if s.get("init") == "text" and ("prompts" in s or "path" in s):
            return {"prompts": list(s["prompts"])} if "prompts" in s else {"path": s["path"]}
    return {}


def _text(where: str, m: dict) -> None:
    """`init: text` inputs: an hf checkpoint folder with a tokenizer, a known `key`, integer dtype,
    rank 1 or 2, one prompt source (inline or a .txt file under data/inputs/), one shape."""
    texts = [(i, s) for i, s in enumerate(m["input"]) if s.get("init") == "text"]
    if not texts:
        return
    arch = m.get("arch") or {}
    first = f"{where}.input[{texts[0][0]}]"
    if arch.get("source") != "hf" or not arch.get("path"):
        raise ValueError(f"{first}.init: text is tokenised by the checkpoint's own tokenizer: it needs "
                         f"{where}.arch: {{source: hf, path: <checkpoint folder with tokenizer.json>}}")
    folder = Path(str(arch["path"]))
    if folder.is_dir() and not (folder / "tokenizer.json").is_file():
        raise ValueError(f"{first}.init: text: no tokenizer.json in {folder} ({NO_TOKENIZER})")
    own = None
    for i, s in texts:
        w = f"{where}.input[{i}]"
        key = s.get("key", s["name"])
        if key not in TEXT_KEYS:
            raise ValueError(f"{w}.key: init text gives the tokenizer's {', '.join(TEXT_KEYS)}: {key!r} is none "
                             f"of them (set key: to the field this input holds)")
        if s.get("dtype", schema.InputSpec.dtype) not in ("int64", "int32"):
            raise ValueError(f"{w}.dtype: init text gives token ids and masks: use int64 or int32, not "
                             f"{s.get('dtype', schema.InputSpec.dtype)!r}")
        if len(s["shape"]) not in (1, 2):
            raise ValueError(f"{w}.shape: init text takes [S] or [B, S] (S tokens a prompt), got {s['shape']}")
        if list(s["shape"]) != list(texts[0][1]["shape"]):
            raise ValueError(f"{w}.shape: {s['shape']} differs from {first}.shape {texts[0][1]['shape']}: every "
                             f"text input of a model holds the same prompts at the same length")
        src = _prompt_source(w, s)
        if src is not None and own is not None and src != own[1]:
            raise ValueError(f"{w}: its prompts differ from {own[0]}'s: give the same prompts or none (then it "
                             f"takes {own[0]}'s)")
        own = own or (src and (w, src))
    if own is None:
        raise ValueError(f"{first}: init text needs prompts: [...] or path: {INPUT_DIR}/<file>.txt (one prompt a line)")


def _prompt_source(w: str, s: dict):
    """('prompts', tuple) or ('path', file) of one text input, None when it gives neither."""
    if "prompts" in s and "path" in s:
        raise ValueError(f"{w}: give prompts: [...] or path: <file>, not both")
    if "prompts" in s:
        ps = s["prompts"]
        if not isinstance(ps, list) or not ps or not all(isinstance(x, str) for x in ps):
            raise ValueError(f"{w}.prompts: expected a non-empty list of strings, got {ps!r}")
        return ("prompts", tuple(ps))
    if "path" in s:
        _input_file(w, s["path"], TEXT_SUFFIXES)
        return ("path", s["path"])
    return None
