"""Trained weights for a torch model (`arch.weights: <file>`): a state dict read from a `.safetensors`
file, or from a `.pt` / `.pth` file with `torch.load(weights_only=True)` (a dict of tensors, or one
under 'state_dict' or 'model'), checked against the model and copied into it.

The file must fit the model exactly: every parameter and persistent buffer present (a BatchNorm's
`num_batches_tracked` counter may be absent: old checkpoints lack it and it does not change what the
model computes), no extra keys, every shape equal. Otherwise one line names the file and lists the
missing, unexpected and mis-shaped keys (counts and the first few names of each), and nothing is
loaded. A state dict saved from `nn.DataParallel` (every key under `module.`) is read without that
prefix. Floating tensors stored in fp16/bf16/fp64 are cast to the model's dtype (fp32) as they are
copied.

Memory: the model's own parameters are the one full copy. A `.safetensors` file is read one tensor
at a time (safetensors.safe_open), a `.pt` file is mapped (`torch.load(mmap=True)`: the zip format
torch.save writes since 1.6; an older file is read whole), and each tensor is copied into its
parameter and dropped, so the peak is the model plus the largest tensor.
torch is imported inside the functions (parity.models is imported by stages that never build a model).
"""

from __future__ import annotations

from pathlib import Path

SUFFIXES = (".safetensors", ".pt", ".pth")  # parity.config.params checks arch.weights against these
SHOWN = 3  # names listed per kind of problem in the error line
OPTIONAL = ("num_batches_tracked",)  # buffer names a file may lack (BatchNorm's step counter)
PREFIX = "module."  # nn.DataParallel / DistributedDataParallel's wrapper prefix


class WeightsError(ValueError):
    """A weights file that cannot be read or does not fit the model: one line naming the file."""


def load_into(model, path: str | Path) -> int:
    """Copy the state dict in `path` into `model` (checked first: WeightsError, nothing loaded);
    the number of tensors loaded."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise WeightsError(f"weights: {path}: unknown file type '{path.suffix}'. Valid: {', '.join(SUFFIXES)}")
    if not path.is_file():
        raise WeightsError(f"weights: {path}: no such file (relative to the repo root; track it with git or "
                           f"`dvc add` and `dvc pull`)")
    with _open(path) as src:
        keys = _strip_prefix(src.shapes(), model)
        target = model.state_dict(keep_vars=True)
        problem = mismatch(path, type(model).__name__, {k: src.shapes()[f] for k, f in keys.items()},
                           {k: tuple(v.shape) for k, v in target.items()})
        if problem:
            raise WeightsError(problem)
        _copy(target, keys, src)
    return len(keys)


def mismatch(path, model_name: str, got: dict[str, tuple], want: dict[str, tuple]) -> str | None:
    """The one-line error for a state dict (key -> shape) that does not fit the model's, or None."""
    missing = [k for k in want if k not in got and k.rpartition(".")[2] not in OPTIONAL]
    unexpected = [k for k in got if k not in want]
    shaped = [f"{k} (file {list(got[k])}, model {list(want[k])})" for k in want if k in got and got[k] != want[k]]
    if not (missing or unexpected or shaped):
        return None

    def some(label: str, items: list) -> str:
        more = f", ... {len(items) - SHOWN} more" if len(items) > SHOWN else ""
        return f"{len(items)} {label} ({', '.join(items[:SHOWN])}{more})"

    parts = [some(lab, items) for lab, items in (("missing", missing), ("unexpected", unexpected),
                                                  ("mis-shaped", shaped)) if items]
    return (f"weights: {path} does not fit {model_name} ({len(want)} tensors in the model, {len(got)} in the "
            f"file): {'; '.join(parts)}")


def _strip_prefix(shapes: dict, model) -> dict[str, str]:
    """{model key: file key}: the file's keys, without a DataParallel `module.` prefix on every key
    when the model's own keys have none."""
    keys = list(shapes)
    if keys and all(k.startswith(PREFIX) for k in keys) and \
            not any(k.startswith(PREFIX) for k in model.state_dict(keep_vars=True)):
        return {k[len(PREFIX):]: k for k in keys}
    return {k: k for k in keys}


def _copy(target: dict, keys: dict[str, str], src) -> None:
    import torch  # lazy: torch +1.84 s (BENCHMARKS 22); parity.models is imported by ORT stages too

    with torch.no_grad():
        for name, t in target.items():
            if name not in keys:
                continue  # an OPTIONAL buffer the file lacks: the model's own value stays
            v = src.get(keys[name])
            t.copy_(v.to(t.dtype) if v.dtype != t.dtype else v)
            del v


def _open(path: Path):
    return _Safetensors(path) if path.suffix == ".safetensors" else _Pickled(path)


class _Safetensors:
    """A .safetensors file read one tensor at a time."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        from safetensors import safe_open  # lazy: only a model with a .safetensors weights file reads one

        try:
            self._f = safe_open(str(self.path), framework="pt")
            self._f.__enter__()
            self._shapes = {k: tuple(self._f.get_slice(k).get_shape()) for k in self._f.keys()}
        except Exception as e:  # noqa: BLE001 - safetensors' own message says what is wrong with the file
            raise WeightsError(f"weights: {self.path}: cannot be read as safetensors: {type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''}") from None
        return self

    def shapes(self) -> dict[str, tuple]:
        return self._shapes

    def get(self, key: str):
        return self._f.get_tensor(key)

    def __exit__(self, *exc):
        self._f.__exit__(*exc)
        return False


class _Pickled:
    """A .pt / .pth state dict, read with torch.load(weights_only=True), mapped where the format allows."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        import torch  # lazy: torch +1.84 s (BENCHMARKS 22); parity.models is imported by ORT stages too

        try:
            try:
                obj = torch.load(self.path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:  # a legacy (pre-zip) file cannot be mapped: read it whole
                if "mmap" not in str(e):
                    raise
                obj = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - torch says why (a pickled object, a corrupt file)
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise WeightsError(f"weights: {self.path}: cannot be read with torch.load(weights_only=True): {first} "
                               f"(save the model's state_dict(), not the model object)") from None
        self._sd = _state_dict(obj, self.path)
        return self

    def shapes(self) -> dict[str, tuple]:
        return {k: tuple(v.shape) for k, v in self._sd.items()}

    def get(self, key: str):
        return self._sd[key]

    def __exit__(self, *exc):
        self._sd = {}
        return False


def _state_dict(obj, path: Path) -> dict:
    """The tensors of a loaded .pt object: the dict itself, or the dict under 'state_dict' / 'model'."""
    import torch  # lazy: torch +1.84 s (BENCHMARKS 22); parity.models is imported by ORT stages too

    if isinstance(obj, dict):
        for key in ("state_dict", "model"):
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not obj:
        raise WeightsError(f"weights: {path}: holds a {type(obj).__name__}{' (empty)' if obj == {} else ''}, "
                           f"not a state dict (a dict of tensors, or one under 'state_dict' or 'model')")
    bad = [str(k) for k, v in obj.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise WeightsError(f"weights: {path}: not a state dict: {len(bad)} entries are not tensors "
                           f"({', '.join(bad[:SHOWN])}{', ...' if len(bad) > SHOWN else ''}); give the dict of "
                           f"tensors (or one under 'state_dict' or 'model')")
    return obj
