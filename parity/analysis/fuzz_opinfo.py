"""An OpInfo suite case (`opinfo: {name, variant, sample}`) as a fuzz template: the sample's tensors
become presets whose every axis is a dim of its own (`t0_0`, `t0_1`, ...), non-tensor arguments stay
literal, so fuzzing redraws the sizes and minimising halves each axis (a size the op refuses makes
the case INVALID on the reference too, which counts as passing: the shrinker keeps the last failing
size). Heavy: imports torch and OpInfo's op_db (only when a fuzzed or minimised case is an OpInfo one).
"""

from __future__ import annotations

import math
import warnings

import torch

from parity.config import imports
from parity.analysis import fuzz
from parity.suites import execute


class NotConvertible(ValueError):
    pass


def _op_path(op) -> str:
    mod, name = getattr(op, "__module__", None), getattr(op, "__name__", "")
    if mod and name and name != "<lambda>":
        path = f"{mod}.{name}"
        if imports.torch_target(path, "op"):
            return path
    raise NotConvertible(f"OpInfo op {op!r} has no importable torch path")


def to_template(t: dict) -> dict:
    """The fuzzable template of an OpInfo template (fuzz.templates); NotConvertible if its op or an
    argument cannot be written in suite terms."""
    oi = t["case"]["opinfo"]
    info = execute.opinfo_db().get((oi["name"], oi.get("variant", "")))
    if info is None:
        raise NotConvertible(f"no OpInfo {oi['name']!r} in this torch")
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        samples = list(info.sample_inputs("cpu", torch.float32, requires_grad=False))
    smp = samples[int(oi.get("sample", 0))]
    dims, presets = {}, {}

    def conv(obj):
        if isinstance(obj, torch.Tensor):
            name = f"t{len(presets)}"
            shape = []
            for i, s in enumerate(obj.shape):
                dims[f"{name}_{i}"] = int(s)
                shape.append(f"{name}_{i}")
            if obj.is_floating_point():
                presets[name] = {"shape": shape}
            elif obj.dtype == torch.bool:
                presets[name] = {"shape": shape, "dtype": "bool"}
            elif not obj.is_complex():
                lo, hi = (int(obj.min()), int(obj.max()) + 1) if obj.numel() else (0, 1)
                presets[name] = {"shape": shape, "dtype": "int", "init": {"randint": [lo, hi]}}
            else:
                raise NotConvertible("complex tensor argument")
            return f"${name}"
        if isinstance(obj, (list, tuple)):
            return [conv(v) for v in obj]
        if isinstance(obj, dict):
            return {str(k): conv(v) for k, v in obj.items()}
        if obj is None or isinstance(obj, (bool, int, str)) or isinstance(obj, float) and math.isfinite(obj):
            return obj
        raise NotConvertible(f"argument {obj!r} ({type(obj).__name__})")

    args = conv([smp.input, *smp.args])
    kwargs = conv(dict(smp.kwargs))
    case = {"id": t["base"], "op": _op_path(info.op), "args": args}
    if kwargs:
        case["kwargs"] = kwargs
    return {"base": t["base"], "file": t["file"], "spec": {"dims": dims, "presets": presets, "grad": False},
            "case": case}


def convert_all(tpls: list[dict]) -> list[dict]:
    """Templates with their OpInfo ones converted (those that cannot be are dropped)."""
    out = []
    for t in tpls:
        if fuzz.fuzzable(t):
            out.append(t)
        elif "opinfo" in t["case"]:
            try:
                out.append(to_template(t))
            except NotConvertible:
                pass
    return out
