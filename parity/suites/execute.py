"""Run one expanded case on one provider at one dtype, with its fp32 reference. Heavy (torch);
imported only in suite worker processes (parity.suites.worker) and the in-process benchmark loop.

Inputs are generated in float32 (seeded per case id), rounded to the cell's dtype, and the
reference runs eager torch fp32 on the *rounded* values, so a diff measures the kernel, not the
rounding of its inputs. Results are plain dicts:
  status       OK | UNSUPPORTED | UNAVAILABLE | INVALID | EXPORT_FAIL | COMPILE_FAIL | INFER_FAIL
               (MISMATCH / NAN_* are decided by the diff stage; CRASH / TIMEOUT by the pool)
  reason       why, for anything but OK
  outputs      [(name, float32/int ndarray)]  forward outputs (out:i) then grads (grad:...)
  reference    the same names from the fp32 reference (pair tests: side A on the same backend)
  latency_ms / ref_latency_ms   medians of the timed provider / reference calls
  onnx_ops     ONNX op types of the per-op export (ort providers)
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import io
import statistics
import time
import traceback
import warnings
import zlib
from pathlib import Path

import numpy as np
import torch

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "float64": torch.float64}


class SkipCase(Exception):
    def __init__(self, status, reason):
        super().__init__(reason)
        self.status, self.reason = status, reason


def reason_of(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    msg = str(e).strip().splitlines()
    first = msg[0][:300] if msg else ""
    return f"{type(e).__name__}: {first}{where}"


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


def tmap(obj, f):
    """Apply f to every tensor leaf of nested lists/tuples/dicts."""
    if isinstance(obj, torch.Tensor):
        return f(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(tmap(v, f) for v in obj)
    if isinstance(obj, dict):
        return {k: tmap(v, f) for k, v in obj.items()}
    return obj


def leaves(obj, prefix="") -> list[tuple[str, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        return [(prefix or "0", obj)]
    out = []
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out += leaves(v, f"{prefix}.{i}" if prefix else str(i))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out += leaves(v, f"{prefix}.{k}" if prefix else str(k))
    return out


def to_dtype(x: torch.Tensor, dt) -> torch.Tensor:
    return x.to(dt) if x.is_floating_point() else x


def as_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.is_floating_point():
        t = t.float()
    return t.contiguous().numpy().copy()


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


def call(side, args, kwargs, dt=None):
    fn, mod, ea, ek = side
    if mod is not None:
        return mod(*args, **kwargs)
    return fn(*args, *ea, **kwargs, **ek)


def side_at(side, dt):
    """A copy of a side whose module parameters are at dtype dt."""
    fn, mod, ea, ek = side
    if mod is None:
        return (fn, None, tmap(ea, lambda t: to_dtype(t, dt)), tmap(ek, lambda t: to_dtype(t, dt)))
    m = copy.deepcopy(mod).to(dt)
    return (m, m, ea, ek)


# ---------------------------------------------------------------------------------------- timing
def timed(f, repeats: int):
    t0 = time.perf_counter_ns()
    out = f()
    ms = [(time.perf_counter_ns() - t0) / 1e6]
    for _ in range(max(0, repeats - 1)):
        t0 = time.perf_counter_ns()
        f()
        ms.append((time.perf_counter_ns() - t0) / 1e6)
    return out, statistics.median(ms)


# ----------------------------------------------------------------------------------------- grads
def grads(side, args, kwargs, loss: str, seed: int) -> list[tuple[str, torch.Tensor]]:
    """Backward of sum(out * cotangent) (or MSE against a seeded target) w.r.t. float inputs and
    module parameters. The cotangent is float32 and seeded, the same on both sides."""
    ins = []

    def req(t):
        if t.is_floating_point():
            t = t.detach().clone().requires_grad_(True)
            ins.append(t)
        return t

    a, k = tmap(args, req), tmap(kwargs, req)
    names = ([f"in.{n}" for n, t in leaves(args) if t.is_floating_point()]
             + [f"kw.{n}" for n, t in leaves(kwargs) if t.is_floating_point()])
    params = [(n, p) for n, p in side[1].named_parameters()] if side[1] is not None else []
    out = call(side, a, k)
    outs = [t for _, t in leaves(out) if t.is_floating_point() and t.requires_grad]
    if not outs or not (ins or params):
        return []
    g = torch.Generator().manual_seed(seed)
    total = 0
    for o in outs:
        r = torch.randn(o.shape, generator=g, dtype=torch.float32)
        total = total + (((o.float() - r) ** 2).mean() if loss == "mse" else (o.float() * r).sum())
    wrt = ins + [p for _, p in params]
    gs = torch.autograd.grad(total, wrt, allow_unused=True)
    labels = [f"grad:{n}" for n in names] + [f"grad:param.{n}" for n, _ in params]
    return [(lab, gg) for lab, gg in zip(labels, gs) if gg is not None]


# --------------------------------------------------------------------------------------- providers
def _run_torch(side, args, kwargs, cell, grad_case):
    dt = TORCH_DTYPES[cell["torch_dtype"]]
    sd = side_at(side, dt)
    with torch.no_grad():
        out, ms = timed(lambda: call(sd, args, kwargs), cell.get("repeats", 3))
    named = [(f"out:{n}", t) for n, t in leaves(out)]
    if grad_case:
        named += grads(sd, args, kwargs, grad_case["loss"], grad_case["seed"])
    return named, ms, None


def _run_compile(side, args, kwargs, cell, grad_case):
    dt = TORCH_DTYPES[cell["torch_dtype"]]
    sd = side_at(side, dt)
    opts = cell.get("options") or {}
    compiled = torch.compile(lambda *a, **k: call(sd, a, k), backend=opts.get("backend", "inductor"),
                             mode=opts.get("mode"), dynamic=False)
    try:
        with torch.no_grad():
            out = compiled(*args, **kwargs)
    except Exception as e:
        name = type(e).__module__ + "." + type(e).__name__
        if "torch._dynamo" in name or "torch._inductor" in name:
            raise SkipCase("COMPILE_FAIL", reason_of(e)) from None
        raise
    with torch.no_grad():
        _, ms = timed(lambda: compiled(*args, **kwargs), cell.get("repeats", 3))
    return [(f"out:{n}", t) for n, t in leaves(out)], ms, None


class _Wrap(torch.nn.Module):
    def __init__(self, side, template_args, template_kwargs):
        super().__init__()
        self.side = side
        if side[1] is not None:
            self.mod = side[1]
        self.ta, self.tk = template_args, template_kwargs

    def forward(self, *tensors):
        it = iter(tensors)
        a = tmap(self.ta, lambda t: next(it))
        k = tmap(self.tk, lambda t: next(it))
        return call(self.side, a, k)


def _run_ort(side, args, kwargs, cell, grad_case):
    import onnx
    import onnxruntime as ort

    dt = TORCH_DTYPES[cell["torch_dtype"]]
    sd = side_at(side, dt)
    ts = [t for _, t in leaves([args, kwargs])]
    wrap = _Wrap(sd, args, kwargs).eval()
    buf = io.BytesIO()
    names = [f"in{i}" for i in range(len(ts))]
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(wrap, tuple(ts), buf, dynamo=False, opset_version=int(cell.get("onnx_opset", 17)),
                              input_names=names, do_constant_folding=False)
    except Exception as e:
        raise SkipCase("EXPORT_FAIL", "torch.onnx.export: " + reason_of(e)) from None
    data = buf.getvalue()
    model = onnx.load_from_string(data)
    ops = sorted({n.op_type for n in model.graph.node})
    graph_inputs = {i.name for i in model.graph.input}
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(cell.get("threads") or 1)
    so.log_severity_level = 3
    try:
        sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise SkipCase("INFER_FAIL", "onnxruntime session: " + reason_of(e)) from None
    feeds = {}
    for n, t in zip(names, ts):
        if n in graph_inputs:  # the exporter drops inputs the graph does not use
            t = t.detach()
            feeds[n] = t.numpy() if t.dtype != torch.bfloat16 else t.float().numpy()
    try:
        res, ms = timed(lambda: sess.run(None, feeds), cell.get("repeats", 3))
    except Exception as e:
        raise SkipCase("INFER_FAIL", "onnxruntime run: " + reason_of(e)) from None
    with torch.no_grad():
        ref_struct = call(sd, args, kwargs)  # for output names/count
    ref_names = [n for n, _ in leaves(ref_struct)]
    if len(ref_names) != len(res):
        raise SkipCase("INFER_FAIL", f"ONNX graph has {len(res)} outputs, eager op {len(ref_names)}")
    return [(f"out:{n}", torch.from_numpy(np.asarray(r))) for n, r in zip(ref_names, res)], ms, ops


EXECUTORS = {"torch": _run_torch, "ort": _run_ort, "compile": _run_compile}
PROVIDER_EXECUTOR = {"torch_cpu": "torch", "ort_cpu": "ort", "ort_cpu_noopt": "ort", "torch_compile": "compile"}


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


def run_case(case: dict, cell: dict) -> dict:
    """cell: provider, torch_dtype, seed, repeats, threads, onnx_opset, options, grad (bool)."""
    seed = int(cell.get("seed", 0))
    try:
        if case["kind"] == "gradcheck":
            if PROVIDER_EXECUTOR.get(cell["provider"]) != "torch":
                return {"status": "UNSUPPORTED", "reason": "gradcheck runs on torch_cpu (float64) only"}
            return _gradcheck(case, cell, seed)
        ex = EXECUTORS.get(PROVIDER_EXECUTOR.get(cell["provider"], ""))
        if ex is None:
            return {"status": "UNAVAILABLE", "reason": f"no suite executor for provider {cell['provider']!r} "
                                                       f"(parity/suites/execute.py PROVIDER_EXECUTOR)"}
        dt = TORCH_DTYPES[cell["torch_dtype"]]
        try:
            sides, args, kwargs = build(case, seed)
        except SkipCase:
            raise
        except Exception as e:
            return {"status": "INVALID", "reason": "building the case: " + reason_of(e)}
        p_args = tmap(args, lambda t: to_dtype(t, dt))
        p_kwargs = tmap(kwargs, lambda t: to_dtype(t, dt))
        r_args = tmap(p_args, lambda t: t.float() if t.is_floating_point() else t)
        r_kwargs = tmap(p_kwargs, lambda t: t.float() if t.is_floating_point() else t)
        want_grad = bool(case.get("grad")) and bool(cell.get("grad", True)) and ex is _run_torch
        gcase = {"loss": case.get("loss", "sum"), "seed": case_seed(seed, case["id"] + "/grad")} if want_grad else None
        if case["kind"] == "pair":
            # A vs B on the same backend: A plays the reference (INVALID if it fails)
            try:
                ref, rms, _ = ex(sides["a"], p_args, p_kwargs, cell, gcase)
            except SkipCase as e:
                return {"status": "INVALID", "reason": f"pair side A: {e.status}: {e.reason}"}
            except Exception as e:
                return {"status": "INVALID", "reason": "pair side A: " + reason_of(e)}
            main = sides["b"]
        else:
            main = sides["main"]
            if case.get("reference"):  # a user op against the user's float64 reference
                from parity.suites import custom

                try:
                    ref, rms = custom.run_reference(case, r_args, r_kwargs, gcase)
                except Exception as e:
                    return {"status": "INVALID", "reason": "the reference fails: " + reason_of(e)}
            rcell = dict(cell, torch_dtype="float32")
            # the reference's parameters are the provider's, rounded to dt and back: like the inputs
            rside = side_at(side_at(main, dt), torch.float32)
            try:
                if not case.get("reference"):
                    ref, rms, _ = _run_torch(rside, r_args, r_kwargs, rcell, gcase)
            except Exception as e:
                return {"status": "INVALID", "reason": "fails on the fp32 reference too: " + reason_of(e)}
        try:
            out, ms, ops = ex(main, p_args, p_kwargs, cell, gcase)
        except SkipCase as e:
            return {"status": e.status, "reason": e.reason}
        except Exception as e:
            return {"status": "INFER_FAIL", "reason": reason_of(e)}
        return {"status": "OK", "reason": "", "outputs": [(n, as_numpy(t)) for n, t in out],
                "reference": [(n, as_numpy(t)) for n, t in ref], "latency_ms": ms, "ref_latency_ms": rms,
                "onnx_ops": ops}
    except SkipCase as e:
        return {"status": e.status, "reason": e.reason}
