"""Run one expanded case on one provider at one dtype, with its fp32 reference. Heavy (torch);
imported only in suite worker processes (parity.suites.worker) and the in-process benchmark loop.

The provider runs the case through its runner's op-level hook (Runner.run_op, the runner its conf
names: the same class, options and session settings as in the model pipeline); the fp32 reference
through torch_cpu's runner (eager torch).

Inputs are generated in float32 (seeded per case id), rounded to the cell's dtype, and the
reference runs eager torch fp32 on the *rounded* values, so a diff measures the kernel, not the
rounding of its inputs. Results are plain dicts:
  status       OK | UNSUPPORTED | UNAVAILABLE | INVALID | EXPORT_FAIL | COMPILE_FAIL | INFER_FAIL
               (MISMATCH / NAN_* are decided by the diff stage; CRASH / TIMEOUT by the pool)
  reason       why, for anything but OK
  outputs      [(name, float32/int ndarray)]  forward outputs (out:i) then grads (grad:...)
  reference    the same names from the fp32 reference (pair tests: side A on the same backend)
  latency_ms / ref_latency_ms   medians of the timed provider / reference calls
  onnx_ops     ONNX op types of the per-op export (ONNX-based runners)
"""

from __future__ import annotations

import importlib
import warnings
import zlib

import numpy as np
import torch

from parity.backends import load_runner
from parity.backends.base import OpJob, OpSkip
from parity.backends.ops import TORCH_DTYPES, as_numpy, reason_of, side_at, tmap, to_dtype
from parity.backends.torch_cpu import TorchCpuRunner

SkipCase = OpSkip  # a case that ends with a status other than OK


def case_seed(seed: int, cid: str) -> int:
    return (zlib.crc32(cid.encode()) ^ int(seed)) & 0x7FFFFFFF


# ------------------------------------------------------------------------------------ resolution
def resolve(path: str, imports=(), kind: str = "op"):
    """aten::name[.overload] -> torch.ops.aten op; 'pkg.mod:attr' or 'pkg.mod.attr' -> the object.
    A module outside the torch namespaces is imported only if `imports` (the case's `import:`)
    declares it (parity.imports; the suite was checked at compose, this is checked again here)."""
    if path.startswith("aten::"):
        name, _, ov = path[6:].partition(".")
        pkt = getattr(torch.ops.aten, name)
        return getattr(pkt, ov) if ov else pkt
    from parity import imports as code

    mod, attr = code.check_suite_target(path, kind, list(imports or ()), files=False)
    obj = importlib.import_module(mod)
    for a in attr.split("."):
        obj = getattr(obj, a)
    return obj


_OP_DB = None


def opinfo_db() -> dict:
    global _OP_DB
    if _OP_DB is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torch.testing._internal.common_methods_invocations import op_db
        _OP_DB = {(o.name, o.variant_test_name): o for o in op_db}
    return _OP_DB


# ---------------------------------------------------------------------------------------- inputs
def make_tensor(spec: dict, rng: np.random.Generator) -> torch.Tensor:
    shape, kind = spec["shape"], spec["dtype"]
    (init, prm), = spec["init"].items()
    if init == "normal":
        a = rng.normal(prm[0], prm[1], shape)
    elif init == "uniform":
        a = rng.uniform(prm[0], prm[1], shape)
    elif init == "randint":
        a = rng.integers(prm[0], prm[1], shape)
    elif init == "fixed":
        a = np.asarray(prm).reshape(shape)
    else:
        a = np.full(shape, prm[0])
    a = {"float": lambda: a.astype(np.float32), "int": lambda: a.astype(np.int64),
         "bool": lambda: a.astype(bool)}[kind]()
    if spec.get("nonfinite") and a.size:  # fuzzing: NaN / +-Inf at seeded positions
        from parity.suites import custom

        custom.put_nonfinite(a, spec["nonfinite"], rng)
    t = torch.from_numpy(np.ascontiguousarray(a))
    if spec.get("layout", "contiguous") != "contiguous":
        from parity.suites import custom

        t = custom.with_layout(t, spec["layout"])
    return t


def materialize(obj, rng):
    if isinstance(obj, dict) and set(obj) == {"tensor"}:
        return make_tensor(obj["tensor"], rng)
    if isinstance(obj, list):
        return [materialize(v, rng) for v in obj]
    if isinstance(obj, dict):
        return {k: materialize(v, rng) for k, v in obj.items()}
    return obj


# ------------------------------------------------------------------------------------ callables
def _build_callable(desc: dict, seed: int, ctor_args=(), ctor_kwargs=None, imports=()):
    """(fn, module or None) for an op or module description."""
    obj = resolve(desc["target"], imports, desc["kind"])
    if desc["kind"] == "module":
        torch.manual_seed(seed)
        m = obj(*ctor_args, **(ctor_kwargs or {}))
        return m, m
    return obj, None


def build(case: dict, seed: int):
    """(sides, args, kwargs): sides = {name: (fn, module, extra_args, extra_kwargs)} with fp32
    tensors in args/kwargs."""
    s = case_seed(seed, case["id"])
    rng = np.random.default_rng(s)
    kind = case["kind"]
    if kind == "opinfo":
        oi = case["opinfo"]
        info = opinfo_db().get((oi["name"], oi["variant"]))
        if info is None:
            raise SkipCase("INVALID", f"no OpInfo {oi['name']!r} variant {oi['variant']!r} in this torch")
        torch.manual_seed(s)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            samples = list(info.sample_inputs("cpu", torch.float32, requires_grad=False))
        if oi["sample"] >= len(samples):
            raise SkipCase("INVALID", f"OpInfo {oi['name']} has {len(samples)} samples, not {oi['sample'] + 1}")
        smp = samples[oi["sample"]]
        args = [smp.input, *smp.args]
        return {"main": (info.op, None, [], {})}, args, dict(smp.kwargs)
    args = materialize(case["call_args"], rng)
    kwargs = materialize(case["call_kwargs"], rng)
    if kind == "pair":
        sides = {}
        for name in ("a", "b"):
            d = case["pair"][name]
            extra_a, extra_k = materialize(d["args"], rng), materialize(d["kwargs"], rng)
            imp = case.get("imports", ())
            fn, mod = (_build_callable(d, s, extra_a, extra_k, imp) if d["kind"] == "module"
                       else _build_callable(d, s, imports=imp))
            if mod is not None:
                extra_a, extra_k = [], {}
            sides[name] = (fn, mod, extra_a, extra_k)
        return sides, args, kwargs
    if kind == "module":
        fn, mod = _build_callable({"kind": "module", "target": case["target"]}, s,
                                  materialize(case["ctor_args"], rng), materialize(case["ctor_kwargs"], rng),
                                  case.get("imports", ()))
        mod.train(bool(case.get("train")))
        return {"main": (fn, mod, [], {})}, args, kwargs
    fn, _ = _build_callable({"kind": "op", "target": case["target"]}, s, imports=case.get("imports", ()))
    return {"main": (fn, None, [], {})}, args, kwargs


# -------------------------------------------------------------------------------------------- case
def _gradcheck(case, cell, seed):
    fn = resolve(case["target"], case.get("imports", ()), "gradcheck")
    fn = getattr(fn, "apply", fn)
    rng = np.random.default_rng(case_seed(seed, case["id"]))
    args = tmap(materialize(case["call_args"], rng),
                lambda t: t.double().requires_grad_(True) if t.is_floating_point() else t)
    kwargs = materialize(case["call_kwargs"], rng)
    try:
        torch.autograd.gradcheck(lambda *a: fn(*a, **kwargs), tuple(args), eps=1e-6, atol=1e-5, rtol=1e-3)
    except importlib.import_module("torch.autograd.gradcheck").GradcheckError as e:
        first = str(e).strip().splitlines()[0]
        return {"status": "OK", "gradcheck": {"passed": False, "reason": first}}
    except Exception as e:
        return {"status": "INVALID", "reason": "gradcheck: " + reason_of(e)}
    return {"status": "OK", "gradcheck": {"passed": True, "reason": "float64 finite differences agree"}}


_RUNNERS: dict = {}


def runner_class(cell: dict):
    return load_runner(cell["runner"], cell.get("import"))


def runner_for(cell: dict, dtype: str | None = None):
    """The provider's runner (its conf `runner:`), set up for this cell at `dtype` (the cell's torch
    dtype when None), or OpSkip UNAVAILABLE with the reason it cannot run here."""
    key = (cell["provider"], cell["runner"])
    if key not in _RUNNERS:
        cls = runner_class(cell)
        prov = {"runner": cell["runner"], "options": cell.get("options") or {}}
        job = OpJob(cell["provider"], prov, cell["torch_dtype"])
        try:
            why = cls.availability(job)
        except Exception as e:  # an availability probe that raises means: not available
            why = reason_of(e)
        _RUNNERS[key] = (cls, prov, why)
    cls, prov, why = _RUNNERS[key]
    if why:
        raise OpSkip("UNAVAILABLE", why)
    job = OpJob(cell["provider"], prov, dtype or cell["torch_dtype"], seed=int(cell.get("seed", 0)),
                repeats=int(cell.get("repeats", 3)), threads=int(cell.get("threads") or 1),
                onnx_opset=int(cell.get("onnx_opset", 17)))
    return cls(job)


def _reference(main, dt, args, kwargs, cell, gcase):
    """The fp32 reference (torch_cpu's runner, eager) on the dtype-rounded inputs; parameters are the
    provider's, rounded to dt and back, like the inputs."""
    r_args = tmap(args, lambda t: t.float() if t.is_floating_point() else t)
    r_kwargs = tmap(kwargs, lambda t: t.float() if t.is_floating_point() else t)
    rside = side_at(side_at(main, dt), torch.float32)
    ref = TorchCpuRunner(OpJob("torch_cpu", {"options": {}}, "float32", repeats=int(cell.get("repeats", 3))))
    return ref.run_op(rside, r_args, r_kwargs, gcase)


def run_case(case: dict, cell: dict) -> dict:
    """cell: provider, runner (its conf `runner:`), import, torch_dtype, seed, repeats, threads,
    onnx_opset, options, grad (bool)."""
    seed = int(cell.get("seed", 0))
    try:
        if case["kind"] == "gradcheck":
            if not runner_class(cell).op_gradcheck:
                return {"status": "UNSUPPORTED", "reason": "gradcheck runs on torch_cpu (float64) only"}
            return _gradcheck(case, cell, seed)
        runner = runner_for(cell)
        dt = TORCH_DTYPES[cell["torch_dtype"]]
        try:
            sides, args, kwargs = build(case, seed)
        except SkipCase:
            raise
        except Exception as e:
            return {"status": "INVALID", "reason": "building the case: " + reason_of(e)}
        p_args = tmap(args, lambda t: to_dtype(t, dt))
        p_kwargs = tmap(kwargs, lambda t: to_dtype(t, dt))
        want_grad = bool(case.get("grad")) and bool(cell.get("grad", True)) and runner.op_grads
        gcase = {"loss": case.get("loss", "sum"), "seed": case_seed(seed, case["id"] + "/grad")} if want_grad else None
        if case["kind"] == "pair":
            # A vs B on the same backend: A plays the reference (INVALID if it fails)
            try:
                ref, rms, _ = runner.run_op(sides["a"], p_args, p_kwargs, gcase)
            except SkipCase as e:
                return {"status": "INVALID", "reason": f"pair side A: {e.status}: {e.reason}"}
            except Exception as e:
                return {"status": "INVALID", "reason": "pair side A: " + reason_of(e)}
            main = sides["b"]
        else:
            main = sides["main"]
            try:
                if case.get("reference"):  # a user op against the user's float64 reference
                    from parity.suites import custom

                    fn = resolve(case["reference"], case.get("imports", ()), "op")
                    ref, rms = custom.run_reference(fn, p_args, p_kwargs, gcase)
                else:
                    ref, rms, _ = _reference(main, dt, p_args, p_kwargs, cell, gcase)
            except Exception as e:
                what = "the reference fails: " if case.get("reference") else "fails on the fp32 reference too: "
                return {"status": "INVALID", "reason": what + reason_of(e)}
        try:
            out, ms, ops = runner.run_op(main, p_args, p_kwargs, gcase)
        except SkipCase as e:
            return {"status": e.status, "reason": e.reason}
        except Exception as e:
            return {"status": "INFER_FAIL", "reason": reason_of(e)}
        return {"status": "OK", "reason": "", "outputs": [(n, as_numpy(t)) for n, t in out],
                "reference": [(n, as_numpy(t)) for n, t in ref], "latency_ms": ms, "ref_latency_ms": rms,
                "onnx_ops": ops}
    except SkipCase as e:
        return {"status": e.status, "reason": e.reason}
