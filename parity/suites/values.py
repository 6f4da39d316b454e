"""Worker side of the suite format features (parity.suites.features): tensors of every preset dtype,
seeded random values, construct nodes and `file:` modules. Heavy (torch); imported only in suite
workers, through parity.suites.execute.

Tensors carry how the cell may change them: a preset of a fixed dtype (`float64`, `complex64`, ...)
is marked `_parity_fixed` and no cell casts it; a `complex` preset is complex64 whose parts the cell
rounds to its float dtype (to_cell).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import numpy as np
import torch

from parity.config import imports as code
from parity.suites import custom, features

FIXED = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
         "complex64": torch.complex64, "complex128": torch.complex128, "int8": torch.int8, "int16": torch.int16,
         "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8}


def _draw(spec: dict, rng: np.random.Generator, shape) -> np.ndarray:
    (init, prm), = spec["init"].items()
    if init == "normal":
        return rng.normal(prm[0], prm[1], shape)
    if init == "uniform":
        return rng.uniform(prm[0], prm[1], shape)
    if init == "randint":
        return rng.integers(prm[0], prm[1], shape)
    if init == "bernoulli":
        return rng.random(shape) < prm[0]
    if init == "fixed":
        return np.asarray(prm).reshape(shape)
    return np.full(shape, prm[0])


def make_tensor(spec: dict, rng: np.random.Generator) -> torch.Tensor:
    shape, dtype = spec["shape"], spec["dtype"]
    kind = features.kind_of(dtype)
    if kind == "complex" and "fixed" not in spec["init"]:
        re_, im = _draw(spec, rng, shape), _draw(spec, rng, shape)
        a = (re_ + 1j * im).astype(np.complex128 if dtype == "complex128" else np.complex64)
    else:
        np_dt = {"float": np.float32, "int": np.int64, "bool": bool, "complex": np.complex64}[kind]
        a = np.asarray(_draw(spec, rng, shape)).astype(np_dt)
    if spec.get("nonfinite") and a.size:  # fuzzing: NaN / +-Inf at seeded positions
        custom.put_nonfinite(a, spec["nonfinite"], rng)
    t = torch.from_numpy(np.ascontiguousarray(a))
    if dtype in FIXED:
        t = t.to(FIXED[dtype])
        t._parity_fixed = True
    if spec.get("layout", "contiguous") != "contiguous":  # fuzzing: transposed / channels_last strides
        t = custom.with_layout(t, spec["layout"])
    return t


def _random(node: dict, rng: np.random.Generator, ctx: dict):
    (name, prm), = ((k, v) for k, v in node.items() if k != "p_none")
    if name == "uniform":
        return float(rng.uniform(prm[0], prm[1]))
    if name == "randint":
        return int(rng.integers(prm[0], prm[1]))
    if name == "bernoulli":
        return bool(rng.random() < prm[0])
    if name == "choice":
        return materialize(prm[int(rng.integers(0, len(prm)))], rng, ctx)
    # optional: None with probability p_none, else the value
    return None if rng.random() < node["p_none"] else materialize(prm, rng, ctx)


def materialize(obj, rng, ctx: dict | None = None):
    """Tensors, random values and constructed objects of an expanded value, drawn from rng in a fixed
    order. ctx: {"drawn": [...] (each random value drawn, for results.json), "imports", "seed"}."""
    ctx = {} if ctx is None else ctx
    if isinstance(obj, dict) and set(obj) == {"tensor"}:
        return make_tensor(obj["tensor"], rng)
    if isinstance(obj, dict) and set(obj) == {"random"}:
        v = _random(obj["random"], rng, ctx)
        ctx.setdefault("drawn", []).append(v if not isinstance(v, torch.Tensor) else f"tensor{list(v.shape)}")
        return v
    if isinstance(obj, dict) and set(obj) == {"construct"}:
        c = obj["construct"]
        args, kwargs = materialize(c["args"], rng, ctx), materialize(c["kwargs"], rng, ctx)
        cls = resolve_code(c["target"], ctx.get("imports", ()), "module")
        torch.manual_seed(int(ctx.get("seed", 0)))
        return cls(*args, **kwargs)
    if isinstance(obj, list):
        return [materialize(v, rng, ctx) for v in obj]
    if isinstance(obj, dict):
        return {k: materialize(v, rng, ctx) for k, v in obj.items()}
    return obj


def load_file_target(target: str):
    """The object `file:path.py::Symbol` names, path relative to the working directory (the repo
    root, where stages and workers run). A path whose parts are identifiers is imported by its
    dotted name (examples/toy.py -> examples.toy), so it is the same module its siblings import."""
    path, attr = features.split_file_target(target)
    root = Path.cwd()
    features.check_file_target(target, root)
    name = features.file_module(path)
    if name is not None:
        if str(root) not in sys.path and "" not in sys.path:
            sys.path.insert(0, str(root))
        mod = importlib.import_module(name)
    else:
        name = "parity_suite_file_" + "".join(ch if ch.isalnum() else "_" for ch in path)
        mod = sys.modules.get(name)
        if mod is None:
            spec = importlib.util.spec_from_file_location(name, root / path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
    obj = mod
    for a in attr.split("."):
        obj = getattr(obj, a)
    return obj


def resolve(path: str, imports=(), kind: str = "op"):
    """aten::name[.overload] -> torch.ops.aten op; 'pkg.mod:attr' or 'pkg.mod.attr' -> the object.
    A module outside the torch namespaces is imported only if `imports` (the case's `import:`)
    declares it (parity.config.imports; the suite was checked at compose, this is checked again here)."""
    if path.startswith("aten::"):
        name, _, ov = path[6:].partition(".")
        pkt = getattr(torch.ops.aten, name)
        return getattr(pkt, ov) if ov else pkt

    mod, attr = code.check_suite_target(path, kind, list(imports or ()), files=False)
    obj = importlib.import_module(mod)
    for a in attr.split("."):
        obj = getattr(obj, a)
    return obj


def resolve_code(target: str, imports, kind: str):
    """resolve(), and `file:path.py::Symbol` targets."""
    return load_file_target(target) if features.is_file_target(target) else resolve(target, imports, kind)


def is_fixed(t: torch.Tensor) -> bool:
    return bool(getattr(t, "_parity_fixed", False))


def to_cell(x: torch.Tensor, dt) -> torch.Tensor:
    """A tensor as the cell gives it to the provider: float -> dt; complex (not fixed) -> complex64
    with both parts rounded to dt; fixed dtypes and ints/bools unchanged."""
    if is_fixed(x):
        return x
    if x.is_complex():
        y = torch.view_as_complex(torch.view_as_real(x).to(dt).float().contiguous())
        return y
    return x.to(dt) if x.is_floating_point() else x


def to_reference(x: torch.Tensor, dt=torch.float32) -> torch.Tensor:
    """The reference's copy of a cell input: float -> dt (fp32 or fp64), complex -> complex64/128,
    fixed dtypes unchanged."""
    if is_fixed(x):
        return x
    if x.is_complex():
        return x.to(torch.complex128 if dt == torch.float64 else torch.complex64)
    return x.to(dt) if x.is_floating_point() else x
