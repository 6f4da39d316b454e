"""Was the cell's precision exercised, and can its verdict fail at all?

A reduced-precision cell (fp16, bf16, tf32, int8, int4, fp8) passes the oracle when it is as close to
fp64 as the trusted backend at that precision. A cell that never computed in that precision passes
too, and then the verdict says nothing about the precision the user asked for: ONNX Runtime's CPU
provider has no fp16 kernel for Gemm, MatMul, Softmax, BatchNormalization or Gelu, and with every
operand a graph input (nothing stored in fp16) its optimiser removes the Cast pairs around them and
runs the fp32 kernel: the outputs are bit-identical to fp32 (measured: a one-Gemm graph, onnxruntime
1.31). So each layer's relative error against fp64 (against the fp32 reference when the cell is
judged by tolerance) is compared with the format's unit roundoff u: a layer *shows the rounding* of
its precision when rel_l2 >= u / 16 (bits_lost >= -4). One rounding of a value to the format alone
gives rel_l2 ~ u / sqrt(3) (bits_lost ~ -0.8); an fp32 computation, even after 6 bits of accumulated
fp32 noise (efficientnet_b0, docs/verdicts.md), stays below u_fp32 * 2^6 = 2^-18, 8x under fp16's
u / 16 = 2^-15. A cell none of whose layers shows it is NOT_EXERCISED (parity.core.status).

A cell whose provider is the oracle's baseline backend (torch_cpu against the torch CPU eager
baseline at its own dtype; ort_cpu_noopt for an ONNX-file model) is judged against itself: its
excess is 1 by construction and it cannot fail, so its verdict is BASELINE, not PASS.
"""

from __future__ import annotations

from parity.core import dtypes
from parity.core.store import is_output

SHOWS = 1.0 / 16  # a layer shows the rounding when rel_l2 >= u * SHOWS


def _rel(d) -> float | None:
    """A layer's relative error: vs fp64 (oracle), else vs the fp32 reference (tolerance metrics)."""
    o = d.oracle or {}
    if o.get("ref_rms"):
        return o["err_rmse"] / o["ref_rms"]
    if o:
        return None  # fp64 is all zeros: nothing to round
    return d.rel_l2


def precision(layers: list, f: dtypes.Format | None, mode: str) -> dict | None:
    """{format, u, layers, rounded, exercised, largest_rel_l2, evidence} of a cell computing in the
    reduced format `f` (parity.core.dtypes.reduced; None for fp32/fp64: then None, as when no layer has
    values). `layers`: compare.LayerDiff with .oracle."""
    if f is None:
        return None
    u = f.u
    inner = [d for d in layers if not is_output(d.name)] or layers  # the layers `layers` counts
    rels = [r for d in inner if not d.problem and (r := _rel(d)) is not None]
    if not rels:
        return None
    label = f.name
    vs = "fp64" if mode == "oracle" else "the fp32 reference"
    rounded = sum(r >= u * SHOWS for r in rels)
    ev = (f"{rounded} of {len(rels)} layers show {label} rounding (rel_l2 vs {vs} >= u/16 = {u * SHOWS:.2g}; "
          f"largest {max(rels):.2g})")
    if not rounded:
        ev += f"; the provider ran fp32 kernels: {label} was not exercised"
    return {"format": label, "u": u, "layers": len(rels), "rounded": rounded, "exercised": rounded > 0,
            "largest_rel_l2": max(rels), "evidence": ev}


def baseline_self(mode: str, provider: str | None, baseline_provider: str | None, dtype: str) -> str | None:
    """The evidence that a cell is the oracle's baseline judged against itself, else None."""
    if mode != "oracle" or not provider or provider != baseline_provider:
        return None
    return (f"provider {provider} is the oracle's baseline backend at {dtype} (baseline@<model>-{dtype}): "
            "judged against itself, its excess is 1 by construction and it cannot fail")
