"""Input samples of a model, synthetic, loaded from files (`init: file`) or tokenised from text
(`init: text`), sample set after sample set (`models.<m>.shapes`): the inputs stage's arrays. What the
specs mean (shapes, token bounds, which files are allowed) is parity.config.inputspec; this module reads
the files (numpy, pyarrow, the tensor store, the tokenizer), so the config layer stays free of them.

Text: the checkpoint folder's `tokenizer.json` is read by the `tokenizers` library itself (no torch, no
transformers: the inputs stage stays light), with its own truncation and padding to the declared length
S (what transformers' fast tokenizers do underneath: `tok(prompts, padding="max_length",
truncation=True, max_length=S, padding_side="right")` gives the same ids and mask). The truncation
side and the pad token come from tokenizer_config.json (special_tokens_map.json), as transformers reads
them. Padding always goes after the prompt, whatever the tokenizer's `padding_side`: left padding gives
a causal LM query rows whose every key is masked (a pad before any real token), and what attention
computes there is up to the implementation: torch eager and ORT's graph of the same exported SDPA
differ there (a tiny Qwen2, left-padded: 37.5% of the logits, max_abs 0.46, all at pad positions), so
a comparison would fail on values no one reads. Right padding leaves every real token's output as it
is (causal attention never sees later pads; the mask hides them from a bidirectional encoder). A
tokenizer without a pad token pads with config.json's pad_token_id, else its EOS token, else id 0 (the
attention mask marks those positions 0). A folder with no tokenizer.json (only a sentencepiece
tokenizer.model or a vocab.txt) is refused: transformers writes one for it once
(`AutoTokenizer.from_pretrained(folder).save_pretrained(folder)`), and reading the slow formats would
take transformers (and torch) into this light stage. Row b of sample j holds prompt j x B + b (B = 1 for an [S] input), cycling through the
prompts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from parity.config import schema
from parity.config.inputspec import NO_TOKENIZER, InputPlan
from parity.core import store


class InputError(ValueError):
    """A bad input file or value range: the message names the key and the file."""


def model_samples(plan: InputPlan, seed: int, generate) -> list[dict]:
    """Every sample of the model (its parity.config.inputspec.plan), sample set after sample set: {input
    name: array}. `generate(spec, seed, sample, index)` draws a synthetic input; `init: file` inputs come
    from their file, `init: text` ones from the checkpoint's tokenizer."""
    n = len(plan.sample_sets[0][1])
    files = {i: load_file(s, n, plan.bounds[i], plan.ids[i]) for i, s in enumerate(plan.inputs) if s.get("init") == "file"}
    text = TextInputs(plan) if plan.text else None
    out = []
    for lab, idx in plan.sample_sets:
        specs = plan.specs[lab]
        for j, k in enumerate(idx):
            out.append({s["name"]: files[i][j] if i in files else text.sample(s, j) if s.get("init") == "text"
                        else generate(s, seed, k, i) for i, s in enumerate(specs)})
    return out


def load_file(spec: dict, n: int, bound: int | None = None, ids: bool = False):
    """The first n samples of a file input, as an [n, *shape] array of the spec's dtype (InputError
    naming the file and the problem otherwise). `bound`: the exclusive upper bound of its values
    (InputPlan.bounds); `ids`: it holds token ids (InputPlan.ids), so negative values are refused too."""
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
        # only token ids have a range: negative axes/indices are valid ONNX
        lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 0)
        if ids and (lo < 0 or (bound is not None and hi >= bound)):
            raise InputError(f"{where}: values span [{lo}, {hi}], outside [0, {bound}) "
                             f"({'the vocabulary: arch.kwargs.vocab_size' if spec.get('high') is None else 'high'})")
    with np.errstate(over="ignore"):  # an overflow is refused below, in one line
        out = np.ascontiguousarray(a.astype(dt))
    if dt.kind == "f" and a.dtype != dt and not np.isfinite(out).all():  # issue 36 item 2: 1e300 -> inf in float32
        bad = int(out.size - np.count_nonzero(np.isfinite(out)))
        big = float(np.max(np.abs(a[np.isfinite(a) & ~np.isfinite(out)]))) if a.dtype.kind == "f" else float("nan")
        raise InputError(f"{where}: {bad} values beyond {dt}'s range (largest |x| {big:.3g} in the file's "
                         f"{a.dtype}; {dt} holds up to {np.finfo(dt).max:.4g}) become inf in the {dt} input: "
                         "scale or clip them in the file")
    return out


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


def model_calibration(plan: InputPlan, seed: int, c: int, generate) -> list[dict]:
    """INT8 calibration samples at the export label's shapes; a file input cycles through its file."""
    specs = plan.specs[plan.export_label]
    files = {}
    for i, s in enumerate(plan.inputs):
        if s.get("init") == "file" and c:
            files[i] = load_file(s, _count(s), plan.bounds[i], plan.ids[i])  # every sample the file holds
    text = TextInputs(plan) if c and plan.text else None
    return [{s["name"]: files[i][k % len(files[i])] if i in files else text.sample(s, k) if s.get("init") == "text"
             else generate(s, seed, k, i, calibration=True) for i, s in enumerate(specs)} for k in range(c)]


def _count(spec: dict) -> int:
    """How many samples a file input holds."""
    a = _read_array(Path(spec["path"]), spec.get("key", spec["name"]))
    return 1 if tuple(a.shape) == tuple(spec["shape"]) else int(np.shape(a)[0])


# init: text `key:` -> the field of a tokenizers Encoding that holds it
ENCODING_FIELDS = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}


class TextInputs:
    """A model's text inputs: its prompts and its checkpoint's tokenizer, each prompt batch encoded once
    (input_ids and the mask of one sample come from the same encoding)."""

    def __init__(self, plan: InputPlan):
        src = plan.text
        self.folder, self.vocab, self.vocab_where = src["folder"], plan.vocab, plan.vocab_where
        self.where = (f"input (init: text, path: {src['path']})" if "path" in src else "input (init: text, prompts)")
        self.prompts = read_prompts(Path(src["path"])) if "path" in src else list(src["prompts"])
        self.encoder = tokenizer(Path(self.folder), src["files"])
        self._cache: dict[tuple, dict] = {}

    def sample(self, spec: dict, j: int) -> np.ndarray:
        """Input `spec`'s array for sample j: prompts j*B .. j*B+B-1 (cycling), padded/truncated to S."""
        shape = tuple(spec["shape"])
        b, length = (shape[0] if len(shape) == 2 else 1), shape[-1]
        picked = tuple(self.prompts[(j * b + r) % len(self.prompts)] for r in range(b))
        if (picked, length) not in self._cache:
            self._cache[(picked, length)] = self._encode(list(picked), length)
        got = self._cache[(picked, length)][spec.get("key", spec["name"])]
        return np.ascontiguousarray(got.reshape(shape).astype(schema.section(schema.InputSpec, spec).dtype))

    def _encode(self, prompts: list[str], length: int) -> dict:
        out = self.encoder(prompts, length)
        vocab = self.vocab
        ids = out["input_ids"]
        if vocab is not None and ids.size and int(ids.max()) >= vocab:
            raise InputError(f"{self.where}: the tokenizer in {self.folder} gives token id {int(ids.max())}, "
                             f"outside the model's vocabulary [0, {vocab}) ({self.vocab_where}): a tokenizer of "
                             f"another model?")
        return out


def read_prompts(path: Path) -> list[str]:
    """One prompt a line (blank lines skipped), InputError when there is none or no such file."""
    where = f"input (init: text, path: {path})"
    if not path.is_file():
        raise InputError(f"{where}: no such file (git-track it, or `dvc add` it and `dvc pull`)")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise InputError(f"{where}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    prompts = [ln for ln in lines if ln.strip()]
    if not prompts:
        raise InputError(f"{where}: no prompts (one a line)")
    return prompts


def tokenizer(folder: Path, files: dict):
    """encode(prompts, S) -> {input_ids, attention_mask, token_type_ids: int64 [len(prompts), S]}, by
    the checkpoint's own tokenizer (its tokenizer.json, through the `tokenizers` library). `files`: its
    tokenizer_config.json, special_tokens_map.json and config.json, read (InputPlan.text)."""
    if not (folder / "tokenizer.json").is_file():
        raise InputError(f"input (init: text): {folder}: no tokenizer.json ({NO_TOKENIZER})")
    return _fast_tokenizer(folder, files)


def _special(name: str, *configs: dict) -> str | None:
    """A special token's text as tokenizer_config.json / special_tokens_map.json give it."""
    for cfg in configs:
        v = cfg.get(name)
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            return v
    return None


def pad_token(files: dict, token_to_id, id_to_token) -> tuple[int, str]:
    """(id, text) the tokenizer pads with: its pad token, else config.json's pad_token_id, else its
    EOS token (or config.json's eos_token_id), else id 0. `files`: tokenizer.files' json read."""
    tc, sm, cfg = (files.get(f) or {} for f in ("tokenizer_config.json", "special_tokens_map.json", "config.json"))
    for name, key in (("pad_token", "pad_token_id"), ("eos_token", "eos_token_id")):
        tok = _special(name, tc, sm)
        if tok is not None and token_to_id(tok) is not None:
            return int(token_to_id(tok)), tok
        pid = cfg.get(key)
        pid = pid[0] if isinstance(pid, list) and pid else pid
        if isinstance(pid, int) and not isinstance(pid, bool) and pid >= 0:
            return pid, id_to_token(pid) or ""
    return 0, id_to_token(0) or ""


def _fast_tokenizer(folder: Path, files: dict):
    from tokenizers import Tokenizer  # lazy: +0.03 s, only a model with text inputs

    path = folder / "tokenizer.json"
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - the library says what is wrong with the file
        raise InputError(f"input (init: text): {path}: cannot be read by the tokenizers library: {e}") from None
    tc = files.get("tokenizer_config.json") or {}
    pid, ptok = pad_token(files, tok.token_to_id, tok.id_to_token)
    pad_side = "right"  # not tc["padding_side"]: see the module docstring
    trunc_side = tc.get("truncation_side") if tc.get("truncation_side") in ("left", "right") else "right"

    def encode(prompts: list[str], length: int) -> dict:
        tok.enable_truncation(max_length=length, direction=trunc_side)
        tok.enable_padding(direction=pad_side, pad_id=pid, pad_type_id=0, pad_token=ptok, length=length)
        encs = tok.encode_batch(prompts)
        return {k: np.array([getattr(e, f) for e in encs], dtype=np.int64) for k, f in ENCODING_FIELDS.items()}
    return encode


def prompt_codec(folder: Path):
    """(encode(text) -> ids, decode(ids) -> text) by the checkpoint's tokenizer.json, no padding or
    truncation, special tokens as the tokenizer adds them (generation's text prompt)."""
    from tokenizers import Tokenizer  # lazy: +0.03 s, only a text prompt

    path = folder / "tokenizer.json"
    if not path.is_file():
        raise InputError(f"generate.prompt: {folder}: no tokenizer.json ({NO_TOKENIZER})")
    tok = Tokenizer.from_file(str(path))
    tok.no_padding()
    tok.no_truncation()
    return (lambda text: list(tok.encode(text).ids)), (lambda ids: tok.decode(list(ids), skip_special_tokens=False))
