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
  gold         the same names in float64 (the fp64 oracle's truth, parity.core.oracle): the case
               on torch_cpu eager in float64 on the cell's rounded inputs and parameters (pair tests:
               side A; cases with `reference:`, the user's float64 reference); absent when that run
               fails (`oracle_note` says why) or the case has no torch side (onnx, gradcheck)
  floor        the oracle's trusted backend at the cell's dtype (torch_cpu eager; pair tests: side A
               on the provider), when it is neither the outputs nor the reference themselves;
               `floor_from` names which: floor | reference | none (no trusted backend apart from
               what is tested: a user op against its reference, or a torch_cpu cell, whose floor would
               be its own outputs; then the limit is the precision's rounding, k x u x rms + slack)
  latency_ms / ref_latency_ms   medians of the timed provider / reference calls
  onnx_ops     ONNX op types of the per-op export (ONNX-based runners)
"""

from __future__ import annotations

import importlib
import statistics
import warnings
import zlib

import numpy as np
import torch
from torch.testing._internal.common_methods_invocations import op_db

from parity.backends import load_runner
from parity.backends.runner import OpJob, OpSkip
from parity.backends.ops import TORCH_DTYPES, as_numpy, reason_of, side_at, tmap, to_dtype
from parity.backends.torch_cpu import TorchCpuRunner
from parity.suites import custom, onnxcase, values
from parity.config import schema
from parity.suites import values

# a cell left without a setting (a test's, a benchmark's) takes the params default
SEED, RUN = schema.Params.seed, schema.SuitesRun

SkipCase = OpSkip  # a case that ends with a status other than OK


def case_seed(seed: int, cid: str) -> int:
    return (zlib.crc32(cid.encode()) ^ int(seed)) & 0x7FFFFFFF


# ------------------------------------------------------------------------------------ resolution
resolve = values.resolve  # aten::, torch.*, declared imports (parity.suites.values)


_OP_DB = None


def opinfo_db() -> dict:
    global _OP_DB
    if _OP_DB is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
        _OP_DB = {(o.name, o.variant_test_name): o for o in op_db}
    return _OP_DB


# ---------------------------------------------------------------------------------------- inputs
make_tensor = values.make_tensor  # every preset dtype, random values, constructs: parity.suites.values
materialize = values.materialize


# ------------------------------------------------------------------------------------ callables
def _build_callable(desc: dict, seed: int, ctor_args=(), ctor_kwargs=None, imports=()):
    """(fn, module or None) for an op or module description."""
    obj = values.resolve_code(desc["target"], imports, desc["kind"])
    if desc["kind"] == "module":
        torch.manual_seed(seed)
        m = obj(*ctor_args, **(ctor_kwargs or {}))
        return m, m
    return obj, None


def build(case: dict, seed: int, sample: int = 0, ctx: dict | None = None):
    """(sides, args, kwargs): sides = {name: (fn, module, extra_args, extra_kwargs)} with fp32
    tensors in args/kwargs. Sample k > 0 draws from its own seed; ctx collects the drawn values."""
    s = case_seed(seed, case["id"] if not sample else f"{case['id']}#s{sample}")
    rng = np.random.default_rng(s)
    ctx = {} if ctx is None else ctx
    ctx.update(imports=case.get("imports", ()), seed=s)
    materialize = lambda obj, rng: values.materialize(obj, rng, ctx)  # noqa: E731
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
    job = OpJob(cell["provider"], prov, dtype or cell["torch_dtype"], seed=int(cell.get("seed", SEED)),
                repeats=int(cell.get("repeats", RUN.repeats)), threads=int(cell.get("threads") or RUN.threads),
                onnx_opset=int(cell.get("onnx_opset", RUN.onnx_opset)), exporter=cell.get("exporter") or "legacy")
    return cls(job)


def _baseline(case: dict, main, dt, args, kwargs, cell, gcase):
    """What a case is compared to, on the cell's rounded inputs: torch eager fp32 (torch_cpu's
    runner) by default; `baseline: PROVIDER@cell|fp32|fp64` runs that provider's runner (a selected
    provider, or torch_cpu) at that precision. Parameters are the provider's, rounded to dt and back."""
    b = case.get("baseline") or {"provider": "torch_cpu", "precision": "fp32"}
    prec = {"fp32": "float32", "fp64": "float64"}.get(b["precision"], cell["torch_dtype"])
    rdt = TORCH_DTYPES[prec]
    r_args = tmap(args, lambda t: values.to_reference(t, rdt))
    r_kwargs = tmap(kwargs, lambda t: values.to_reference(t, rdt))
    rside = side_at(side_at(main, dt), rdt)
    conf = (cell.get("runners") or {}).get(b["provider"])
    if conf is None and b["provider"] != "torch_cpu":
        raise OpSkip("INVALID", f"baseline {b['provider']}: not a selected provider (select it, or use torch_cpu)")
    if case.get("baseline") is None or conf is None:  # torch_cpu eager, as the default always was
        ref = TorchCpuRunner(OpJob("torch_cpu", {"options": {}}, prec, repeats=int(cell.get("repeats", RUN.repeats))))
    else:
        ref = runner_for(dict(cell, provider=b["provider"], **conf), prec)
    return ref.run_op(rside, r_args, r_kwargs, gcase if ref.op_grads else None), ref.op_grads


def run_case(case: dict, cell: dict) -> dict:
    """cell: provider, runner (its conf `runner:`), import, torch_dtype, seed, repeats, threads,
    onnx_opset, options, grad (bool), runners (the selected providers', for baselines), oracle
    (bool, default true: also the float64 and trusted-backend runs the fp64 oracle judges by).
    A case with `samples: N` runs N input draws; sample k's tensors are named `<name>#s<k>` (k > 0)."""
    cell = dict(cell)
    if case.get("export"):
        cell["exporter"] = case["export"]["exporter"]
        cell["onnx_opset"] = case["export"].get("opset") or cell.get("onnx_opset", RUN.onnx_opset)
    n = int(case.get("samples", 1))
    res, drawn = None, []
    for k in range(n):
        r = _run_sample(case, cell, k)
        drawn.append(r.pop("drawn", None))
        if r["status"] != "OK" or n == 1:
            if n > 1:
                r["reason"] = f"sample {k}: {r.get('reason', '')}"
            res = r
            break
        sfx = f"#s{k}" if k else ""
        if res is None:
            res = dict(r, outputs=[], reference=[], gold=[], floor=[], latency_ms=[], ref_latency_ms=[])
        for key in ("outputs", "reference", "gold", "floor"):
            res[key] += [(nm + sfx, a) for nm, a in r.get(key, [])]
        if "gold" not in r and cell.get("oracle", True):  # a sample without its fp64 run: judged by tolerance
            res["oracle_note"] = r.get("oracle_note", "no fp64 run")
        res["latency_ms"].append(r["latency_ms"])
        res["ref_latency_ms"].append(r["ref_latency_ms"])
    if n > 1 and res.get("status") == "OK":
        for key in ("gold", "floor"):
            if not res[key] or res.get("oracle_note"):
                res.pop(key)
        res["latency_ms"] = statistics.median(res["latency_ms"])
        res["ref_latency_ms"] = statistics.median(res["ref_latency_ms"])
    if any(drawn):
        res["drawn"] = drawn if n > 1 else drawn[0]
    if '"dtype": "complex' in repr(case).replace("'", '"') and res.get("status") == "OK" \
            and cell["torch_dtype"] != "float32":
        res["note"] = (f"complex inputs: real and imaginary parts rounded to {cell['torch_dtype']}, computed in "
                       f"complex64 (no complex32 kernels on these backends)")
    return res


def as_numpy64(t: torch.Tensor) -> np.ndarray:
    """A tensor as numpy keeping float64 (ops.as_numpy makes floats float32): the oracle's gold."""
    t = t.detach().cpu()
    t = torch.view_as_real(t) if t.is_complex() else t
    return (t.double() if t.is_floating_point() else t).contiguous().numpy().copy()


def _torch_at(prec: str, side, dt, args, kwargs, gcase) -> list:
    """`side` on torch_cpu eager at `prec` (float64: the oracle's gold; the cell's dtype: its floor)
    on the cell's rounded inputs and parameters (rounded to dt, then widened), called once."""
    rdt = TORCH_DTYPES[prec]
    r = TorchCpuRunner(OpJob("torch_cpu", {"options": {}}, prec, repeats=1))
    named, _, _ = r.run_op(side_at(side_at(side, dt), rdt), tmap(args, lambda t: values.to_reference(t, rdt)),
                           tmap(kwargs, lambda t: values.to_reference(t, rdt)), gcase)
    return named


def _oracle_values(case: dict, cell: dict, sides: dict, dt, args, kwargs, gcase, ref) -> dict:
    """`gold` (float64) and the oracle's floor (`floor` or `floor_from`) of a case that ran OK, as
    run_case's docstring says; a failing fp64 run leaves `oracle_note` and the diff judges the case
    by tolerance."""
    base = case.get("baseline") or {"provider": "torch_cpu", "precision": "fp32"}
    try:
        if case.get("reference"):  # the user's float64 reference is the truth; no trusted backend
            return {"gold": [(n, as_numpy64(t)) for n, t in ref], "floor_from": "none"}
        if case["kind"] == "pair":  # side A: the truth in float64 on torch, the floor on the provider
            gold = _torch_at("float64", sides["a"], dt, args, kwargs, gcase)
            return {"gold": [(n, as_numpy64(t)) for n, t in gold], "floor_from": "reference"}
        gold = _torch_at("float64", sides["main"], dt, args, kwargs, gcase)
        res = {"gold": [(n, as_numpy64(t)) for n, t in gold]}
        if runner_class(cell) is TorchCpuRunner:  # the provider is the trusted backend: no floor apart
            res["floor_from"] = "none"
        elif base == {"provider": "torch_cpu", "precision": "cell"} or (
                base == {"provider": "torch_cpu", "precision": "fp32"} and cell["torch_dtype"] == "float32"):
            res["floor_from"] = "reference"
        else:
            floor = _torch_at(cell["torch_dtype"], sides["main"], dt, args, kwargs, gcase)
            res.update(floor=[(n, as_numpy(t)) for n, t in floor], floor_from="floor")
        return res
    except Exception as e:  # noqa: BLE001 - an op without float64 kernels: judged by tolerance
        return {"oracle_note": f"no fp64 run ({reason_of(e)}): judged by tolerance"}


def _zero_output(case: dict, ref) -> str | None:
    """With `zero_output: fail`, why a baseline whose first output is all zeros cannot judge the case."""
    if case.get("zero_output") != "fail" or not ref:
        return None
    name, t = ref[0]
    if t.numel() and not bool(torch.count_nonzero(t.detach())):
        return f"the baseline's first output {name} is all zeros (zero_output: fail): any result would pass"
    return None


def _run_sample(case: dict, cell: dict, sample: int) -> dict:
    # long: one case's steps in order (build, reference, run, oracle), each failure mapped to its status
    seed = int(cell.get("seed", SEED))
    try:
        if case["kind"] == "onnx":  # a whole ONNX model with its expected outputs (parity.suites.onnxcase)
            return onnxcase.run(case, cell, runner_class, runner_for)
        if case["kind"] == "gradcheck":
            if not runner_class(cell).op_gradcheck:
                return {"status": "UNSUPPORTED", "reason": "gradcheck runs on torch_cpu (float64) only"}
            return _gradcheck(case, cell, seed)
        runner = runner_for(cell)
        dt = TORCH_DTYPES[cell["torch_dtype"]]
        ctx: dict = {}
        try:
            sides, args, kwargs = build(case, seed, sample, ctx)
        except SkipCase:
            raise
        except Exception as e:
            return {"status": "INVALID", "reason": "building the case: " + reason_of(e)}
        p_args = tmap(args, lambda t: values.to_cell(t, dt))
        p_kwargs = tmap(kwargs, lambda t: values.to_cell(t, dt))
        want_grad = bool(case.get("grad")) and bool(cell.get("grad", RUN.grad)) and runner.op_grads
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
                    fn = resolve(case["reference"], case.get("imports", ()), "op")
                    (ref, rms), base_grads = custom.run_reference(fn, p_args, p_kwargs, gcase), True
                else:
                    (ref, rms, _), base_grads = _baseline(case, main, dt, p_args, p_kwargs, cell, gcase)
            except SkipCase as e:
                return {"status": "INVALID", "reason": f"baseline: {e.status}: {e.reason}"}
            except Exception as e:
                what = "the reference fails: " if case.get("reference") else "fails on the baseline too: "
                return {"status": "INVALID", "reason": what + reason_of(e)}
            if not base_grads:
                gcase = None  # no gradients on an ONNX baseline: compare forward outputs only
            zero = _zero_output(case, ref)
            if zero:
                return {"status": "INVALID", "reason": zero, "drawn": ctx.get("drawn")}
        try:
            out, ms, ops = runner.run_op(main, p_args, p_kwargs, gcase)
        except SkipCase as e:
            return {"status": e.status, "reason": e.reason}
        except Exception as e:
            return {"status": "INFER_FAIL", "reason": reason_of(e)}
        res = {"status": "OK", "reason": "", "outputs": [(n, as_numpy(t)) for n, t in out],
               "reference": [(n, as_numpy(t)) for n, t in ref], "latency_ms": ms, "ref_latency_ms": rms,
               "onnx_ops": ops, "drawn": ctx.get("drawn")}
        if cell.get("oracle", True):  # fuzzing asks for none (parity.analysis.fuzz_campaign.cell_for)
            res.update(_oracle_values(case, cell, sides, dt, p_args, p_kwargs, gcase, ref))
        return res
    except SkipCase as e:
        return {"status": e.status, "reason": e.reason}
