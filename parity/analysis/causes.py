"""Cause labels: why a layer's values differ from the reference. numpy only.

`classify(actual, expected, dtype)` names the simplest explanation of the difference that the numbers
support, with its evidence (JSON-safe) and a one-line summary. It is meant for the layer a verdict
blames (drift_origin), once per layer: arrays of one sample, or samples concatenated on the batch axis
(axis 0), so that axis 1 and the last axis keep their meaning. Tried in this order, the first that fits
wins:

  overflow   inf/NaN in `actual` where `expected` is finite, or |expected| beyond the largest finite
             value of the dtype (fp16 65504, bf16 3.39e38, fp32 3.40e38, fp8_e4m3 448), counted:
             "1,204 values above 65504 (fp16's largest) at this layer, 1,204 of them clamped to it".
  underflow  (when the error is beyond the precision limit) values nonzero in the reference, below the
             format's smallest normal there, are 0 in `actual`, and the values below the smallest normal
             carry >= 50% of the squared error: counts of those flushed and of those below the smallest
             subnormal (fp16 6.1e-5 and 5.96e-8).
  cancellation
             (when the error is beyond the precision limit, with `inputs`) the layer's input is >= 16x
             larger (rms) than its output, mostly a common offset that the layer removes, and the error
             is what one rounding of the input explains
             (parity.analysis.cause_patterns).
  layout     an axis permutation of `actual` (or a reshape of its buffer to the permuted shape, then the
             permutation: NHWC data labelled NCHW) matches `expected`: rel_l2 after the permutation
             <= max(1e-3, limit) and at least 100x smaller than before (when the shapes match). The
             permutation `perm` is the ONNX Transpose perm that maps `expected` to `actual`
             (actual == expected.transpose(perm)): [0,1,3,2] H<->W, [0,2,3,1] NCHW->NHWC, [0,2,1]
             (B,C,T)<->(B,T,C). Ranks 2 to 5; candidates are screened on 4096 sampled elements, the best
             confirmed on all of them. Shapes that differ and no permutation fits: `unknown`.
  precision  rel_l2 <= limit: the error is what the dtype explains. `limit` comes from the caller (the
             oracle's floor times k, as a rel_l2); default 8 u, u = unit roundoff (fp32 2^-24, tf32 and
             fp16 2^-11, bf16 2^-8, fp8_e4m3 2^-4, int8 2^-8 of the tensor's range, fp64 2^-53).
  narrow_format, op_substitution, softmax_temperature
             (parity.analysis.cause_patterns, with their rules): the values are fp16/bf16 numbers, the
             reference rounded to that format ("rounded to fp16 at this layer"); the layer computes another
             elementwise op than the reference on its input (`inputs`: the layer's input, the fp64
             reference's `pre:<call>`; Sigmoid for HardSigmoid, LeakyRelu(alpha) for Relu, GELU tanh for
             erf, ...); the values are softmax(t x) of the reference's logits for a fitted t != 1.
  scale      actual ~= s * expected (least squares s): residual rel_l2 after scaling <= rel_l2 / 10.
  offset     actual ~= expected + c (c = mean difference): residual rel_l2 <= rel_l2 / 10. When both
             fit, the smaller residual wins. Both need 4 elements or more (one element fits anything).
  channel_permutation
             the reference's channels (axis 1 or the last axis) in another order, named: "channels 3 and 7
             swapped" (parity.analysis.cause_patterns).
  mask_leak, position, row_scale
             (cause_patterns, with their rules) the error starts at a token, every token before it within
             the limit: in an attention layer an attention mask/causality leak, elsewhere a fault at those
             positions; each row (token) scaled by its own factor: a normalisation's epsilon (with the
             layer's input, the epsilon change the scales imply; tried before the global scale, and
             claimed where the per-row scales leave 10x less than one scale).
  channel    the error sits in a few channels of axis 1 (NCHW, (B,C,T), (B,F)) or of the last axis
             (NHWC, (B,T,C)): >= 90% of the squared error in at most max(1, 10%) of the channels, and
             those channels' own rel_l2 >= 10x the median rel_l2 of the others (so a channel that merely
             holds most of the signal is not blamed). Evidence names the axis, up to 8 channels, their
             share of the squared error, and each named channel's least-squares scale.
  narrow_weights
             an fp32 layer holding weights whose error is the size of one fp16 rounding of its weights
             (0.2-1.2 u_fp16) though its values are no fp16 numbers (cause_patterns).
  unknown    none of the above: rel_l2, cosine, max_abs, and the best scale/offset fits tried.

Axes are named by what they are (cause_patterns.axis_names, from the layer's name and rank: (batch,
token, hidden) in a transformer's modules, (B, C, H, W) for rank 4): an error along the token axis is a
`position` ("3 of 32 tokens along axis 1 (token)"), along the hidden axis a `channel`. A scale or offset
fit also explains the error when what it leaves is within the precision limit and at most half the
error (a 1.002 scale under fp16 noise). A cause never contradicts its verdict: a layer the verdict
failed (`failed`, origin_cause) is never `precision`; within the limit and no pattern, `unknown` says so.

Two causes come from the cell's settings, not from the numbers. `param_range(settings, layer, ...)`
(label `range`): the capture scanned the graph's parameters, from the graph alone (status.json
`settings.range`, parity.backends.ort_cpu.range_scan: fp16 cells) and the layer reads one that the
format cannot hold: "var (read by BatchNormalization): 24 of 24 values above 65504 (fp16's largest; max
9.6e+07): inf in a cast, 65504 in onnxruntime's fp16 conversion", or nonzero values below the smallest
subnormal (underflow). It names the overflow or underflow whatever pattern the values then show (a
clamped variance scales its channels: `channel` or `scale`, kept in the evidence as `numeric`).
`int8_saturation(settings, ...)`, for
the failing layers of an int8 cell whose capture recorded `saturation_risk` (status.json `settings`,
parity.backends.ort_int8: u8 x s8 GEMMs with full-range weights, reduce_range off, on an x86 CPU
without VNNI, where ONNX Runtime's kernels saturate int16 pair sums). Its summary starts with
SATURATION, its evidence holds the CPU's int8 flags, the reduce_range setting and the key that set it,
and the layer's numbers (plus the numeric label classify() gives, for the drift origin).

A global scale or offset is tried before `channel` because it is the simpler explanation: one
channel x1.1 out of 8 leaves a scale-fit residual near the original error, so `channel` wins there.
Cost: a few passes over the data in float64 (about 10-20 ms for 802,816 elements), plus up to ~0.3 s
when the pair reaches the channel match and the op candidates (cause_patterns' sample sizes).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from parity.core import dtypes, store
from parity.analysis import cause_patterns as patterns
from parity.core.compare import dot as _dot

LABELS = ("overflow", "underflow", "cancellation", "range", "layout", "precision", "narrow_format", "op_substitution", "softmax_temperature", "scale",
          "offset", "channel_permutation", "mask_leak", "position", "row_scale", "channel", "narrow_weights", "unknown",
          "int8_saturation")
SATURATION = "int8 saturation (CPU without VNNI, reduce_range off)"

LAYOUT_MAX_REL = 1e-3      # rel_l2 after the permutation (or the caller's limit, if larger)
LAYOUT_GAIN = 100.0        # ... and this many times smaller than before
FIT_GAIN = 10.0            # scale/offset: residual this many times smaller than the error
FIT_MIN_SIZE = 4           # ... over at least this many elements (one element fits anything)
CHANNEL_ENERGY = 0.9       # share of the squared error ...
CHANNEL_SHARE = 0.1        # ... in at most this share of the channels (at least one)
CHANNEL_CONTRAST = 10.0    # named channels' rel_l2 vs the others' median
PRECISION_K = 8.0          # default limit: rel_l2 <= 8 u
LAYOUT_SAMPLE = 4096
LIST_MAX = 8

PERM_NAMES = {
    (0, 1, 3, 2): "H<->W", (0, 2, 3, 1): "NCHW->NHWC", (0, 3, 1, 2): "NHWC->NCHW",
    (0, 2, 1): "(B,C,T)<->(B,T,C)", (1, 0): "transpose",
}


@dataclass
class Cause:
    label: str
    summary: str
    evidence: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def classify(actual, expected, dtype: str = "fp32", layout_hint=None, limit: float | None = None,
             channel_axes=None, inputs=None, name: str | None = None, failed: bool = False,
             axis_names=None, weighted: bool | None = None) -> Cause:
    """The cause label for `actual` vs `expected` (see the module docstring for the rules).

    dtype: a conf/dtypes or torch name of the format the values were computed in (parity.core.dtypes).
    layout_hint: a permutation, or a list of them, to try first (e.g. a Transpose perm seen in the
    graph). limit: the rel_l2 the dtype explains (default 8 u). channel_axes: axes to look for a
    channel pattern on (default axis 1 and the last axis). inputs: the layer's input (the reference's),
    for op_substitution; None: not tried. name: the layer's name (its axes' meaning and whether it is
    attention or holds weights are read from it: cause_patterns.axis_names). failed: the verdict failed
    this layer, so `precision` is never the answer (a cause never contradicts its verdict). axis_names:
    what each axis is, overriding the name's (e.g. ("batch", "token", "hidden")). weighted: the layer
    holds weights (default: from the name)."""
    return _classify(actual, expected, dtypes.facts(dtype), layout_hint, limit, channel_axes, inputs,
                     name=name, failed=failed, axis_names=axis_names, weighted=weighted)


def _classify(actual, expected, fmt: dtypes.Format, layout_hint=None, limit: float | None = None,
              channel_axes=None, inputs=None, name: str | None = None, failed: bool = False,
              axis_names=None, weighted: bool | None = None) -> Cause:
    """classify() in the format `fmt` (its facts, already resolved); `name`: the layer's."""
    layer = _layer_of(name or "")
    name, u, big = fmt.name, fmt.u, fmt.max
    limit = PRECISION_K * u if limit is None else float(limit)
    a = np.asarray(actual, dtype=np.float64)
    b = np.asarray(expected, dtype=np.float64)
    if a.size != b.size:
        return _unknown_shape(a, b, "sizes differ")
    cause = _overflow(a, b, name, big)
    if cause:
        return cause
    rel = _rel_l2(a, b) if a.shape == b.shape else math.inf
    if rel > limit and 2 <= b.ndim <= 5:
        cause = _layout(a, b, rel, limit, layout_hint)
        if cause:
            return cause
    if a.shape != b.shape:
        return _unknown_shape(a, b, "no axis permutation matches")
    finite = np.isfinite(a) & np.isfinite(b)
    if not finite.all():  # non-finite on both sides (overflow ruled that pair out): compare the rest
        a, b = np.where(finite, a, 0.0), np.where(finite, b, 0.0)
        rel = _rel_l2(a, b)
    if rel > limit:
        cause = _underflow(a, b, a - b, fmt) or _found(patterns.cancellation(a, b, inputs, rel, u, limit))
        if cause:
            return cause
    if rel <= limit and not failed:
        bits = math.log2(rel / u) if rel > 0 else -math.inf
        return Cause("precision", f"precision: rel_l2 {rel:.3g} <= limit {limit:.3g} ({name}, u={u:.3g}"
                     f"{f', bits_lost {bits:.1f}' if rel > 0 else ', bit-identical'})",
                     {"rel_l2": rel, "limit": limit, "u": u, "dtype": name,
                      "bits_lost": bits if rel > 0 else None})
    d = a - b
    if not math.isfinite(rel):  # an all-zero reference: no relative pattern to fit
        return Cause("unknown", f"unknown: the reference is all zero, actual rms {math.sqrt(_dot(a.ravel(), a.ravel()) / a.size):.3g}",
                     {"rel_l2": None, "max_abs": float(np.abs(d).max()), "problem": "reference all zero"})
    fits = _fits(a, b, d, rel)
    axes = _axes(b, channel_axes)
    names = tuple(axis_names) if axis_names is not None else patterns.axis_names(layer, b.shape)
    names = names if names and len(names) == b.ndim else None
    weighted = patterns.has_weights(layer) if weighted is None else weighted
    inputs = inputs if inputs is None or np.shape(inputs) == b.shape else None
    return (_found(patterns.narrow_format(a, b, rel, u))
            or _found(patterns.op_substitution(a, b, inputs, rel, limit))
            or _found(patterns.softmax_temperature(a, b, rel))
            or _found(patterns.row_scale(a, b, inputs, rel, limit, names, fits["scale_residual"]))
            or (_scale_or_offset(fits, rel, limit) if a.size >= FIT_MIN_SIZE else None)
            or _found(patterns.channel_permutation(a, b, rel, limit, axes, names))
            or _found(patterns.positions(a, b, rel, limit, names, patterns.is_attention(layer)))
            or _channel(a, b, d, rel, axes, names)
            or _found(patterns.narrow_weights(a, b, rel, u, weighted))
            or _unknown(a, b, d, rel, fits, limit if failed and rel <= limit else None))


def _found(found: tuple | None) -> Cause | None:
    return Cause(*found) if found else None


def _axes(b: np.ndarray, axes) -> list[int]:
    """The channel axes to look at: axis 1 and the last axis (or the caller's), rank 2 and up."""
    if b.ndim < 2:
        return []
    return sorted({1, b.ndim - 1} if axes is None else {int(x) % b.ndim for x in axes})


def classify_samples(pairs, fmt: dtypes.Format = dtypes.FP32, inputs=None, **kwargs) -> Cause:
    """classify() over several samples of one layer: `pairs` of (actual, expected) arrays (or
    (sample, actual, expected) as parity.core.compare.compare_layer takes them), concatenated on axis 0.
    fmt: the format they were computed in (parity.core.dtypes.facts). inputs: the layer's input per
    sample (same order), or None."""
    pairs = [p[-2:] for p in pairs]
    if not pairs:
        raise ValueError("classify_samples: no samples")
    if inputs is not None and len(inputs) != len(pairs):
        inputs = None
    if len(pairs) == 1 or min(np.ndim(a) for a, _ in pairs) == 0:
        return _classify(*pairs[0], fmt, inputs=None if inputs is None else inputs[0], **kwargs)
    if inputs is not None and len({np.shape(x)[1:] for x in inputs}) == 1:
        inputs = np.concatenate([np.asarray(x) for x in inputs])
    else:
        inputs = None
    return _classify(np.concatenate([np.asarray(a) for a, _ in pairs]),
                     np.concatenate([np.asarray(b) for _, b in pairs]), fmt, inputs=inputs, **kwargs)


def _rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    d = (a - b).ravel()
    sd, sb = _dot(d, d), _dot(b.ravel(), b.ravel())
    return math.sqrt(sd / sb) if sb > 0 else (0.0 if sd == 0 else math.inf)


def _overflow(a, b, name: str, big: float) -> Cause | None:
    fin_b = np.isfinite(b)
    if a.shape == b.shape:
        bad = ~np.isfinite(a) & fin_b
        n_nan, n_inf = int(np.isnan(a[bad]).sum()), int(np.isinf(a[bad]).sum())
    else:  # a layout change may move them: compare counts
        n_nan = max(0, int(np.isnan(a).sum()) - int(np.isnan(b).sum()))
        n_inf = max(0, int(np.isinf(a).sum()) - int(np.isinf(b).sum()))
    absb = np.abs(np.where(fin_b, b, 0.0))
    beyond = int((absb > big).sum())
    if not (n_nan or n_inf or beyond):
        return None
    max_ref = float(absb.max()) if absb.size else 0.0
    clamped = int(((np.abs(a) == big) & (absb > big)).sum()) if a.shape == b.shape else 0
    parts = []
    if beyond:
        parts.append(f"{beyond:,} values above {big:.6g} ({name}'s largest) at this layer"
                     + (f", {clamped:,} of them clamped to it" if clamped else ""))
    if n_nan or n_inf:
        parts.append(f"{n_inf:,} inf / {n_nan:,} NaN in actual where the reference is finite")
    return Cause("overflow", f"overflow: {'; '.join(parts)} (max |reference| {max_ref:.4g})",
                 {"nan_actual": n_nan, "inf_actual": n_inf, "beyond_max": beyond, "clamped": clamped,
                  "max_abs_expected": max_ref, "dtype_max": big, "dtype": name})


UNDERFLOW_SHARE = 0.5  # underflow: the flushed values carry at least this share of the squared error


def _underflow(a, b, d, fmt: dtypes.Format) -> Cause | None:
    """Values the format flushes: nonzero in the reference, below its smallest normal there, and 0 (or
    a subnormal) in actual, carrying >= UNDERFLOW_SHARE of the squared error."""
    absb = np.abs(b)
    low = (absb > 0) & (absb < fmt.tiny)
    if not low.any():
        return None
    flushed = low & (a == 0)
    d2 = d * d
    total = float(np.add.reduce(d2.ravel()))
    share = float(np.add.reduce(d2[low].ravel())) / total if total > 0 else 0.0
    if not flushed.any() or share < UNDERFLOW_SHARE:
        return None
    sub = dtypes.subnormal_min(fmt)
    return Cause("underflow", f"underflow: {int(flushed.sum()):,} values nonzero in the reference are 0 in actual "
                 f"({int(low.sum()):,} below {fmt.name}'s smallest normal {fmt.tiny:.3g}, "
                 f"{int((absb[low] < sub / 2).sum()):,} below its smallest subnormal {sub:.3g}); they carry "
                 f"{100 * share:.1f}% of the squared error",
                 {"flushed": int(flushed.sum()), "below_normal": int(low.sum()),
                  "below_subnormal": int((absb[low] < sub / 2).sum()), "error_share": share,
                  "dtype": fmt.name, "tiny": fmt.tiny, "subnormal_min": sub})


def _perm_candidates(shape: tuple, hint) -> list[tuple]:
    """Non-identity permutations of len(shape) axes, hints first, one per distinct mapping (axes of
    size 1 can go anywhere without changing the data)."""
    n = len(shape)
    hints = [] if hint is None else list(hint)
    if hints and all(isinstance(i, (int, np.integer)) for i in hints):
        hints = [hints]  # one permutation
    seen, out = set(), []
    for p in [tuple(int(i) for i in h) for h in hints] + list(itertools.permutations(range(n))):
        if sorted(p) != list(range(n)):
            continue
        key = tuple(i for i in p if shape[i] != 1)
        if key == tuple(sorted(key)) or key in seen:
            continue
        seen.add(key)
        out.append(p)
    return out


def _permuted_view(a: np.ndarray, b_shape: tuple, p: tuple) -> np.ndarray:
    """`a` read as expected.transpose(p) and mapped back to expected's axes (a view when possible)."""
    return a.reshape([b_shape[i] for i in p]).transpose(np.argsort(p))


def _layout(a, b, rel: float, limit: float, hint) -> Cause | None:
    cands = _perm_candidates(b.shape, hint)
    if not cands:
        return None
    flat = np.unique(np.linspace(0, b.size - 1, min(b.size, LAYOUT_SAMPLE)).astype(np.int64))
    idx = np.unravel_index(flat, b.shape)
    bs = b.reshape(-1)[flat]
    nb = _dot(bs, bs) or 1.0
    scored = []
    for p in cands:
        v = _permuted_view(a, b.shape, p)[idx] - bs
        scored.append((_dot(v, v) / nb, p))
    scored.sort(key=lambda t: t[0])
    tol = max(LAYOUT_MAX_REL, limit)
    for score, p in scored[:3]:
        if score > (10 * tol) ** 2:
            break
        after = _rel_l2(_permuted_view(a, b.shape, p), b)
        if after <= tol and (math.isinf(rel) or after * LAYOUT_GAIN <= rel):
            perm = [int(i) for i in p]
            label = PERM_NAMES.get(tuple(perm), "")
            reinterp = tuple(a.shape) != tuple(b.shape[i] for i in p)
            how = "its buffer reshaped to the permuted shape" if reinterp else "transposed"
            return Cause("layout", f"layout: actual = reference {how} by {perm}{f' ({label})' if label else ''}"
                         f": rel_l2 {'n/a (shapes differ)' if math.isinf(rel) else f'{rel:.3g}'}"
                         f" -> {after:.3g} after undoing it",
                         {"perm": perm, "inverse": [int(i) for i in np.argsort(p)], "name": label,
                          "reinterpreted": reinterp, "actual_shape": list(a.shape),
                          "expected_shape": list(b.shape),
                          "rel_l2_before": None if math.isinf(rel) else rel, "rel_l2_after": after})
    return None


def _fits(a, b, d, rel: float) -> dict:
    """Least-squares scale and constant offset, with their residual rel_l2."""
    bf, df = b.ravel(), d.ravel()
    sb = _dot(bf, bf)
    s = _dot(a.ravel(), bf) / sb if sb > 0 else 1.0
    r = df - (s - 1.0) * bf
    c = float(df.mean()) if df.size else 0.0
    r2 = df - c
    norm = math.sqrt(sb) if sb > 0 else 1.0
    return {"scale": s, "scale_residual": math.sqrt(_dot(r, r)) / norm,
            "offset": c, "offset_residual": math.sqrt(_dot(r2, r2)) / norm,
            "rms_expected": norm / math.sqrt(max(bf.size, 1))}


def _explains(residual: float, rel: float, limit: float) -> bool:
    """A fit explains the error: what it leaves is 10x smaller, or within the precision limit and at most
    half the error (a 1.002 scale under fp16 rounding noise: the noise stays, the scale is the fault)."""
    return rel > 0 and (residual * FIT_GAIN <= rel or (residual <= limit and 2 * residual <= rel))


def _scale_or_offset(f: dict, rel: float, limit: float = 0.0) -> Cause | None:
    ok_s = _explains(f["scale_residual"], rel, limit)
    ok_c = _explains(f["offset_residual"], rel, limit)
    if ok_s and (not ok_c or f["scale_residual"] <= f["offset_residual"]):
        return Cause("scale", f"scale: actual ~= {f['scale']:.6g} x reference (rel_l2 {rel:.3g} -> "
                     f"{f['scale_residual']:.3g} after scaling)",
                     {"s": f["scale"], "rel_l2": rel, "residual_rel_l2": f["scale_residual"]})
    if ok_c:
        return Cause("offset", f"offset: actual ~= reference {f['offset']:+.4g} (rel_l2 {rel:.3g} -> "
                     f"{f['offset_residual']:.3g} after subtracting it; reference rms {f['rms_expected']:.3g})",
                     {"c": f["offset"], "rel_l2": rel, "residual_rel_l2": f["offset_residual"],
                      "rms_expected": f["rms_expected"]})
    return None


def _channel(a, b, d, rel: float, axes: list[int], names: tuple | None = None) -> Cause | None:
    d2, b2 = d * d, b * b
    best = None
    for ax in axes:
        n = b.shape[ax]
        if n < 2:
            continue
        others = tuple(i for i in range(b.ndim) if i != ax)
        e, eb = d2.sum(axis=others), b2.sum(axis=others)
        total = float(e.sum())
        if total <= 0:  # no error to place (a failed layer within the limit may have none)
            continue
        order = np.argsort(-e, kind="stable")
        k = int(np.searchsorted(np.cumsum(e[order]) / total, CHANNEL_ENERGY) + 1)
        if k > max(1, int(CHANNEL_SHARE * n)) or k >= n:
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            rel_c = np.sqrt(np.where(eb > 0, e / eb, np.where(e > 0, np.inf, 0.0)))
        top, rest = order[:k], order[k:]
        contrast = float(rel_c[top].min()) / max(float(np.median(rel_c[rest])), 1e-300)
        if contrast < CHANNEL_CONTRAST:
            continue
        share = float(e[top].sum()) / total
        if best is None or (k, -share) < (best[1], -best[2]):
            best = (ax, k, share, top, rel_c, float(np.median(rel_c[rest])), n)
    if best is None:
        return None
    ax, k, share, top, rel_c, rest_rel, n = best
    listed = [int(i) for i in top[:LIST_MAX]]
    ta, tb = np.take(a, listed, axis=ax), np.take(b, listed, axis=ax)
    others = tuple(i for i in range(b.ndim) if i != ax)
    sab, sbb = (ta * tb).sum(axis=others), (tb * tb).sum(axis=others)
    scales = [float(x) / float(y) if y > 0 else None for x, y in zip(sab, sbb)]
    shown = ", ".join(f"{c} (x{s:.4g})" if s is not None else str(c) for c, s in zip(listed, scales))
    what = names[ax] if names else None
    label, unit = ("position", "tokens") if what == "token" else ("channel", "channels")
    return Cause(label, f"{label}: {100 * share:.1f}% of the squared error in {k} of {n} {unit} "
                 f"along {patterns.axis_word(ax, names)}: {shown}{', ...' if k > LIST_MAX else ''} (rel_l2 {rel:.3g})",
                 {"axis": int(ax), "axis_name": what, "channels": listed, "n_channels": k, "of": int(n),
                  "error_share": share, "scales": scales,
                  "rel_l2_channels": [float(rel_c[c]) for c in listed], "rel_l2_others_median": rest_rel,
                  "rel_l2": rel})


def _unknown(a, b, d, rel: float, f: dict, within: float | None = None) -> Cause:
    """`within`: the limit, when the verdict failed a layer whose rel_l2 is within it (the cause says so
    rather than `precision`, which would contradict the verdict)."""
    af, bf = a.ravel(), b.ravel()
    na, nb = math.sqrt(_dot(af, af)), math.sqrt(_dot(bf, bf))
    cos = _dot(af, bf) / (na * nb) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
    ad = np.abs(d)
    worst = int(ad.argmax()) if ad.size else 0
    max_abs = float(ad.ravel()[worst]) if ad.size else 0.0
    differ = float(np.count_nonzero(ad)) / ad.size if ad.size else 0.0
    why = ("no layout, scale, offset or channel pattern" if within is None else
           f"its rel_l2 is the size of this dtype's rounding (below {within:.3g}), yet the verdict fails it: "
           f"the verdict's limit is tighter than one rounding (a tolerance of atol = rtol = 0 does that), or "
           f"the failure sits in a few elements (largest error {max_abs:.3g}; {100 * differ:.4g}% of the "
           f"elements differ at all)")
    return Cause("unknown", f"unknown: rel_l2 {rel:.3g}, cosine {cos:.6g}, max_abs {max_abs:.3g}; {why}",
                 {"rel_l2": rel, "cosine": cos, "max_abs": max_abs, "within_limit": within,
                  "worst_index": [int(i) for i in np.unravel_index(worst, b.shape)] if b.size else [],
                  "scale_fit": f["scale"], "scale_residual": f["scale_residual"],
                  "offset_fit": f["offset"], "offset_residual": f["offset_residual"]})


def _unknown_shape(a, b, why: str) -> Cause:
    return Cause("unknown", f"unknown: shape mismatch, actual {list(a.shape)} vs reference {list(b.shape)} ({why})",
                 {"actual_shape": list(a.shape), "expected_shape": list(b.shape), "problem": why})


def int8_saturation(settings: dict | None, layer: dict, numeric: dict | None = None) -> Cause | None:
    """The int8-saturation cause of a failing layer when the cell's `settings` (status.json) say its
    GEMMs ran at saturation risk, else None. `layer`: the layer's metrics (name, rel_l2, tol_ratio,
    max_abs); `numeric`: classify()'s cause of the same values (as_dict), kept as evidence."""
    if not (settings or {}).get("saturation_risk"):
        return None
    flags = settings.get("cpu_int8_flags") or []
    ev = {"cpu_vnni": settings.get("cpu_vnni"), "cpu_int8_flags": flags,
          "reduce_range": settings.get("reduce_range"), "reduce_range_from": settings.get("reduce_range_from"),
          "u8s8": settings.get("u8s8"),
          **{k: layer.get(k) for k in ("rel_l2", "tol_ratio", "max_abs")},
          "numeric": {k: numeric.get(k) for k in ("label", "summary")} if numeric else None,
          "why": "without VNNI, u8 x s8 kernels add pairs of products in int16 with saturation "
                 "(2 x 255 x 127 > 32767)",
          "fix": "reduce_range: auto (or true): 7-bit weights cannot saturate the int16 pair sums"}
    nums = ", ".join(f"{k} {layer[k]:.3g}" for k in ("rel_l2", "tol_ratio") if isinstance(layer.get(k), (int, float)))
    return Cause("int8_saturation",
                 f"{SATURATION}: u8 x s8 GEMMs, reduce_range {settings.get('reduce_range_from')}, CPU int8 "
                 f"flags {', '.join(flags) or 'none'}{'; ' + nums if nums else ''}", ev)


def _layer_of(name: str) -> str:
    """`between:x` -> x, `x#1` -> x, `x:1` -> x: the layer an own value or a call belongs to."""
    name = name[len(store.BETWEEN):] if name.startswith(store.BETWEEN) else name
    return name.split("#")[0].split(":")[0]


def _reads(entry: dict, name: str) -> bool:
    """Whether the layer `name` reads the parameter of a range entry (status.json settings.range): a
    node output, node or torch module that reads it, or the module its name is under."""
    layer = _layer_of(name)
    owners = set(entry.get("outputs") or []) | set(entry.get("nodes") or []) | set(entry.get("modules") or [])
    return name in owners or layer in owners or str(entry.get("param", "")).rpartition(".")[0] == layer


def param_range(settings: dict | None, name: str, numeric: dict | None = None) -> Cause | None:
    """The range cause of layer `name` when the capture found (status.json settings.range,
    from the graph alone: parity.backends.ort_cpu.range_scan) parameters it reads that the cell's format
    cannot hold: their counts, largest / smallest values and what the cast makes of them; None else.
    `numeric`: classify()'s cause of the layer's values (as_dict), kept as evidence."""
    found = [e for e in (settings or {}).get("range") or [] if _reads(e, name)]
    if not found:
        return None
    parts = []
    for e in found:
        f = dtypes.facts(e["format"])
        what = []
        if e["over"]:
            what.append(f"{e['over']:,} of {e['numel']:,} values above {f.max:.6g} ({f.name}'s largest; max "
                        f"{e['max_abs']:.3g}): inf in a cast, {f.max:.6g} in onnxruntime's fp16 conversion")
        if e["under"]:
            what.append(f"{e['under']:,} nonzero values below {dtypes.subnormal_min(f):.3g} ({f.name}'s smallest "
                        f"subnormal; min {e['min_abs']:.3g}): 0 in a cast, {dtypes.subnormal_min(f):.3g} in "
                        f"onnxruntime's fp16 conversion")
        ops = ", ".join(sorted(set(e.get("ops") or []))) or "no node"
        parts.append(f"{e['param']} (read by {ops}): {'; '.join(what)}")
    label = "overflow" if any(e["over"] for e in found) else "underflow"
    return Cause("range", f"range ({label} of parameters at {found[0]['format']}): {' | '.join(parts)}",
                 {"params": found, "kind": label,
                  "numeric": {k: numeric.get(k) for k in ("label", "summary")} if numeric else None})


def origin_cause(cd, act: dict, ref: dict, gold: dict | None, own: dict | None, limit_of,
                 fmt: dtypes.Format) -> dict | None:
    """Why a cell's drift origin differs (`cd`: parity.pipeline.diff.CellDiff; act, ref, gold,
    own: its captured, fp32, fp64 and own values by (sample, name)): its own values against fp64 when
    the origin is an own-error record, else its captured values against fp64 (oracle) or fp32
    (tolerance). The precision limit is the oracle's: `limit_of(record)` gives a judged record's limit
    (k times the trusted backend's error) as a rel_l2 (parity.core.oracle.limit_rel at the cell's u, k,
    slack). `fmt`: the number format the cell computes in."""
    name = cd.summary["drift_origin"]
    rec = next((r for r in cd.own if r["name"] == name), None)
    if rec is not None and own is not None and gold is not None:
        values, expected, exp_name = own, gold, store.own_reference_name(name)
    elif gold is not None and cd.mode == "oracle":
        values, expected, exp_name = act, gold, store.reference_name(name)
        rec = next((d.oracle for d in cd.layers if d.name == name and d.oracle), None)
    else:
        values, expected, exp_name, rec = act, ref, store.reference_name(name), None
    samples = [s for s in range(len(expected)) if (s, name) in values and (s, exp_name) in expected]
    pairs = [(values[s, name].array, expected[s, exp_name].array) for s in samples]
    if not pairs:
        return None
    limit = limit_of(rec) if rec else None  # the verdict's own limit, as a rel_l2
    failed = not rec["passed"] if rec and "passed" in rec else \
        any(not d.passed for d in cd.layers if d.name == name)  # the verdict failed it: never `precision`
    return classify_samples(pairs, fmt, limit=limit, inputs=_inputs(gold, name, samples), name=name,
                            failed=failed).as_dict()


def _inputs(gold: dict | None, name: str, samples: list[int]) -> list | None:
    """The layer's input per sample, for causes' op_substitution: the fp64 reference's `pre:<call>`
    (the call's first floating input, recorded by the reference stage), None when it has none (a
    `between:` record, the model output, a plain: output, a reference without fp64 or pre: values)."""
    pre = store.PRE + name
    if gold is None or name.startswith((store.BETWEEN, store.PLAIN)) or store.is_output(name):
        return None
    if not all((s, pre) in gold for s in samples):
        return None
    return [gold[s, pre].array for s in samples]
