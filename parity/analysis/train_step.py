"""One training step at reduced precision: fp32 vs AMP (torch.autocast fp16 / bf16), with a float64
run as the yardstick. Heavy (torch, imported inside the functions).

For a model (its conf `arch` and `input`), from the same seeded weights and the same seeded batch:
  fp32   model.train(), loss = MSE(model(x), seeded target), backward, SGD step
  amp    the same under torch.autocast(device, dtype) with a GradScaler for float16 (gradients are
         unscaled before they are compared; a step the scaler skips for inf/NaN is reported)
  fp64   the same in float64 (with fp64: true): says how far fp32 itself is from exact
Per parameter: rel_l2 = ||g_amp - g_fp32|| / ||g_fp32||, max_abs, cosine, non-finite counts, and
each side's rel_l2 against fp64; the loss of each run; the rel_l2 of the weights after the step. A
cell-like verdict: PASS when every parameter's gradient rel_l2 is within `limit` (default by dtype:
LIMITS), else FAIL naming the worst parameter.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch

from parity.config import schema
from parity.core.status import Status
from parity.core.verdict import decide
from parity.core.ui import plain_table
from parity.models import build

# gradient rel_l2 vs fp32: 8 units of roundoff of the AMP dtype (u = 2^-11 fp16, 2^-8 bf16). Measured
# here: mlp and transformer_block stay within ~1.5 u; resnet18 (batch 1, BatchNorm in train mode) does
# not: its early BatchNorm/conv gradients are 0.22 (fp16) and 0.57 (bf16) from fp32
LIMITS = {"float16": 4e-3, "bfloat16": 3e-2}


def _batch(inputs: list[dict], seed: int) -> list[np.ndarray]:
    """Seeded inputs from a model's `input:` specs (normal/uniform/randint/zeros/ones)."""
    out = []
    for i, spec in enumerate(inputs):
        rng = np.random.default_rng([seed, 0, i])
        s = schema.section(schema.InputSpec, spec)
        shape, init = s.shape, s.init
        if init == "uniform":
            a = rng.uniform(*s.bounds(), shape)
        elif init == "randint":
            a = rng.integers(*s.bounds(), shape)
        elif init in ("zeros", "ones"):
            a = np.zeros(shape) if init == "zeros" else np.ones(shape)
        else:
            a = rng.normal(s.mean, s.std, shape)
        out.append(a.astype(s.dtype))
    return out


def _run(model, xs, target_seed: int, lr: float, device: str, dtype=None, amp=None):
    """(loss, {param: grad float64}, {param: weight after the step}, scaler info) of one step."""
    m = copy.deepcopy(model).to(device)
    if dtype is not None:
        m = m.to(dtype)
    m.train()
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    ins = [torch.from_numpy(x).to(device) for x in xs]
    ins = [t.to(dtype) if dtype is not None and t.is_floating_point() else t for t in ins]
    scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 16) if amp == torch.float16 else None
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device, dtype=amp, enabled=amp is not None):
        out = m(*ins)
    out = out[0] if isinstance(out, (tuple, list)) else out
    g = torch.Generator().manual_seed(target_seed)
    target = torch.randn(out.shape, generator=g, dtype=torch.float64).to(device=device, dtype=out.dtype
                                                                           if amp is None else torch.float32)
    loss = torch.nn.functional.mse_loss(out if amp is None else out.float(), target)
    info = {}
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        grads = {n: p.grad.detach().double().cpu() for n, p in m.named_parameters() if p.grad is not None}
        scale = float(scaler.get_scale())
        scaler.step(opt)
        scaler.update()
        info = {"scale": scale, "skipped": float(scaler.get_scale()) < scale}
    else:
        loss.backward()
        grads = {n: p.grad.detach().double().cpu() for n, p in m.named_parameters() if p.grad is not None}
        opt.step()
    weights = {n: p.detach().double().cpu() for n, p in m.named_parameters()}
    return float(loss.detach()), grads, weights, info


def _rel(a, b) -> float:
    nb = float(torch.linalg.vector_norm(b))
    d = float(torch.linalg.vector_norm(a - b))
    return d / nb if nb > 0 else (0.0 if d == 0 else math.inf)


def _param_row(name, ga, gf, g64) -> dict:
    finite = torch.isfinite(ga)
    row = {"name": name, "shape": list(ga.shape), "numel": int(ga.numel()),
           "nonfinite": int((~finite).sum()), "rel_l2": _rel(ga, gf) if bool(finite.all()) else math.inf,
           "max_abs": float((ga - gf).abs().max()) if ga.numel() else 0.0,
           "cosine": float(torch.nn.functional.cosine_similarity(ga.reshape(1, -1), gf.reshape(1, -1)))
           if ga.numel() else 1.0}
    if g64 is not None:
        row["fp32_vs_fp64"] = _rel(gf, g64)
        row["amp_vs_fp64"] = _rel(ga, g64) if bool(finite.all()) else math.inf
    return row


def check(model_cfg: dict, amp_dtype: str, seed: int = 0, lr: float = 1e-2, device: str = "auto",
          fp64: bool = True, limit: float | None = None, threads: int = 0) -> dict:
    """The training-step result for one model at one AMP dtype ("float16" | "bfloat16")."""
    if threads:
        torch.set_num_threads(threads)
    if device == "auto":  # CUDA when present (never run on a GPU in this project's checks), else CPU
        device = "cuda" if torch.cuda.is_available() else "cpu"
    amp = getattr(torch, amp_dtype)
    model = build(model_cfg["arch"], seed)
    xs = _batch(model_cfg["input"], seed)
    tseed = seed + 7
    l32, g32, w32, _ = _run(model, xs, tseed, lr, device)
    lam, gam, wam, info = _run(model, xs, tseed, lr, device, amp=amp)
    l64, g64, w64 = (None, {}, {})
    if fp64:
        l64, g64, w64, _ = _run(model, xs, tseed, lr, device, dtype=torch.float64)
    rows = [_param_row(n, gam[n], g32[n], g64.get(n)) for n in g32 if n in gam]
    lim = float(limit if limit is not None else LIMITS[amp_dtype])
    worst = max(rows, key=lambda r: r["rel_l2"]) if rows else None
    ok = worst is None or worst["rel_l2"] <= lim
    upd = [_rel(wam[n] - model.state_dict()[n].double(), w32[n] - model.state_dict()[n].double())
           for n in w32 if n in wam]
    return {"amp_dtype": amp_dtype, "device": device, "lr": lr, "seed": seed, "limit": lim,
            "verdict": decide({"status": Status.OK}, {"passed": ok}).status.value,  # the one verdict function
            "worst": {"name": worst["name"], "rel_l2": worst["rel_l2"]} if worst else None,
            "loss": {"fp32": l32, "amp": lam, "fp64": l64, "amp_rel": abs(lam - l32) / max(abs(l32), 1e-30)},
            "update_rel_l2_max": max(upd) if upd else 0.0, "scaler": info or None, "params": rows}


def table(res: dict, top: int | None = None) -> str:
    """Plain text: loss line, then one row per parameter (worst first when top is given), as
    parity.core.ui.plain_table draws every table."""
    rows = res["params"]
    if top:
        rows = sorted(rows, key=lambda r: -r["rel_l2"])[:top]
    lo = res["loss"]
    f64, bad = lo["fp64"] is not None, any(r["nonfinite"] for r in rows)
    loss = (f"loss fp32 {lo['fp32']:.6g}  amp {lo['amp']:.6g}  (rel {lo['amp_rel']:.3g})"
            + (f"  fp64 {lo['fp64']:.6g}" if f64 else ""))
    head = (["parameter", "numel", "rel_l2", "max_abs", "cosine"] + (["fp32~fp64", "amp~fp64"] if f64 else [])
            + (["note"] if bad else []))
    body = [[r["name"], str(r["numel"]), f"{r['rel_l2']:.3e}", f"{r['max_abs']:.3e}", f"{r['cosine']:.6f}"]
            + ([f"{r.get('fp32_vs_fp64', math.nan):.3e}", f"{r.get('amp_vs_fp64', math.nan):.3e}"] if f64 else [])
            + ([f"{r['nonfinite']} non-finite" if r["nonfinite"] else ""] if bad else []) for r in rows]
    return loss + "\n" + plain_table(head, body)