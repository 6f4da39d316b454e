"""The cause labels that name a mechanism, each with the numbers that show it (parity.analysis.causes
tries them in its order; see its docstring). numpy only; every sum in a fixed order (parity.core.compare.dot),
so the same arrays give the same evidence, byte for byte.

  narrow_format        the layer's values are numbers of a narrower format than the cell's (fp16 or bf16
                       in an fp32 cell, bf16 in an fp16 cell): >= 99.9% of the nonzero values are
                       representable in it and rel_l2 <= 32 u of that format. "rounded to fp16 at this
                       layer" when the values are the reference rounded to it (rel_l2 against
                       round(reference, fp16) at least 4x smaller than against the reference, rel_l2 <= 2 u);
                       else "computed in fp16 at this layer" (more than one rounding). Values of which more
                       than 25% fit 4 significand bits fewer than the format (small integers, masks; 1 in
                       16 for rounded reals) are not claimed.
  channel_permutation  the values are the reference's channels in another order along axis 1 or the last
                       axis: each channel that carries the error matches one reference channel (per-channel
                       vectors compared over up to 4096 sampled positions, fewer for many channels: a
                       one-to-one match), and
                       undoing it leaves rel_l2 <= max(1e-3, limit) and 10x smaller than before.
  op_substitution      the layer computes another elementwise op than the reference: applied to the layer's
                       input (the fp64 reference's `pre:<call>`), a candidate op (Relu, LeakyRelu(alpha),
                       Clip(0, 6), Sigmoid, HardSigmoid(1/6 or 0.2), SiLU, HardSwish, GELU erf or tanh,
                       Tanh, Elu, Softplus, Identity) matches the values at least 10x better than the
                       reference does, and better than the op that matches the reference. Judged on up to
                       16384 sampled elements (math.erf is one Python call per element).
  softmax_temperature  reference and values are softmaxes (non-negative, summing to 1 along the last axis
                       or axis 1) and the values equal softmax(t x) for one t != 1, x the reference's
                       logits up to a per-row constant (log of the reference output): t is the least-squares
                       slope of the centred log-probabilities; the residual is at least 10x smaller than
                       the error.
  cancellation         the layer subtracts nearly equal values: its input (the fp64 reference's `pre:<call>`)
                       is at least 16x larger than its output (rms) and mostly a common offset (|mean| >=
                       0.9 rms: a large input divided down, a normalisation, is not), and the error is what one rounding of
                       the input in the cell's format leaves in the output: rel_l2 <= 8 u rms(input) /
                       rms(output) (while more than the precision limit at the output's own scale).
Each function returns (label, summary, evidence) or None.
"""

from __future__ import annotations

import math

import numpy as np

from parity.core import dtypes
from parity.core.compare import dot as _dot

NARROW = {f: dtypes.facts(f).u for f in ("bf16", "fp16")}  # narrowest first: a bf16 number in range is an fp16 one too
COARSE_BITS = 4            # values rounded to a format fit 4 significand bits fewer about 1 time in 16; when
COARSE_SHARE = 0.25        # more than this share do (small integers, masks), they are no evidence of it
NARROW_SHARE = 0.999       # share of nonzero values representable in the narrower format
NARROW_MAX_U = 32.0        # rel_l2 at most this many of its u (a few roundings, not a different value)
ROUNDED_MAX_U = 2.0        # one rounding: rel_l2 <= 2 u ...
ROUNDED_GAIN = 4.0         # ... and round(reference) explains it: this many times smaller residual
GAIN = 10.0                # permutation, substitution, temperature: residual this many times smaller
PERM_TAIL = 1e-4           # the channels left out of the match carry at most this share of the error
PERM_MAX = 1024            # channels matched at most (a one-to-one match over their vectors)
PERM_SAMPLE = 4096         # positions per channel vector in the match, at most ...
PERM_WORK = 2 ** 24        # ... and channels^2 x positions at most this (at least 64 positions)
OP_SAMPLE = 16384          # elements the substitution candidates are computed on
SOFTMAX_SUM = 1e-3         # |row sum - 1| for a softmax
TINY = 1e-30               # probabilities below this carry no usable log
LIST_MAX = 8

_ERF = np.frompyfunc(math.erf, 1, 1)


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    d = (a - b).ravel()
    sd, sb = _dot(d, d), _dot(b.ravel(), b.ravel())
    return math.sqrt(sd / sb) if sb > 0 else (0.0 if sd == 0 else math.inf)


def round_to(v: np.ndarray, fmt: str) -> np.ndarray:
    """`v` (float64) rounded to the nearest `fmt` number (fp16, bf16: round to nearest even), as float64."""
    with np.errstate(over="ignore", invalid="ignore"):
        if fmt == "fp16":
            return v.astype(np.float16).astype(np.float64)
        bits = v.astype(np.float32).view(np.uint32)
        bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
        return bits.view(np.float32).astype(np.float64)


# ---- narrower format ------------------------------------------------------------------------------

def narrow_format(a, b, rel: float, u_cell: float) -> tuple | None:
    nz = a != 0
    n = int(nz.sum())
    if n < 4:
        return None
    for fmt, u in NARROW.items():
        if u <= 1.5 * u_cell or rel > NARROW_MAX_U * u:
            continue
        fa = round_to(a, fmt)
        representable = int((fa == a)[nz].sum())
        if representable < NARROW_SHARE * n or _coarse(a[nz], round(-math.log2(u)) - COARSE_BITS) > COARSE_SHARE * n:
            continue
        fb = round_to(b, fmt)
        after, equal = rel_l2(a, fb), int((a == fb).sum())
        rounded = rel <= ROUNDED_MAX_U * u and after * ROUNDED_GAIN <= rel
        what = (f"rounded to {fmt} at this layer" if rounded else
                f"computed in {fmt} at this layer (its values are {fmt} numbers; rel_l2 {rel / u:.3g} u_{fmt} "
                f"is more than one rounding)")
        return ("narrow_format",
                f"narrow_format: {what}: {'all' if representable == n else representable} of {n} nonzero values "
                f"representable in {fmt}; rel_l2 {rel:.3g} = {rel / u:.3g} u_{fmt}; against round(reference, "
                f"{fmt}) rel_l2 {after:.3g}, {100.0 * equal / a.size:.2f}% of values equal",
                {"format": fmt, "u": u, "rounded": rounded, "representable": representable, "nonzero": n,
                 "rel_l2": rel, "rel_l2_u": rel / u, "rel_l2_vs_rounded_reference": after,
                 "equal_to_rounded_reference": equal, "numel": int(a.size)})
    return None


def _coarse(v: np.ndarray, bits: int) -> int:
    """How many of `v` have a significand of at most `bits` bits (the implicit one included)."""
    m, e = np.frexp(v)  # v = m 2^e, 0.5 <= |m| < 1
    return int((np.ldexp(np.round(np.ldexp(m, bits)), -bits) == m).sum())


# ---- channel permutation --------------------------------------------------------------------------

def _match(A: np.ndarray, B: np.ndarray, rows: np.ndarray) -> np.ndarray | None:
    """For each channel in `rows`, the reference channel among `rows` whose vector is nearest (relative
    squared distance on sampled positions); None unless the match is one-to-one."""
    m = min(A.shape[1], PERM_SAMPLE, max(64, PERM_WORK // len(rows) ** 2))
    cols = np.unique(np.linspace(0, A.shape[1] - 1, m).astype(np.int64))
    As, Bs = A[np.ix_(rows, cols)], B[np.ix_(rows, cols)]
    na, nb = np.einsum("ij,ij->i", As, As), np.einsum("ij,ij->i", Bs, Bs)
    cross = np.einsum("ik,jk->ij", As, Bs)  # not BLAS: one thread, a fixed order (a threaded matmul stalls under load)
    dist = (na[:, None] + nb[None, :] - 2.0 * cross) / (na[:, None] + nb[None, :] + 1e-300)
    best = np.argmin(dist, axis=1)
    if len(np.unique(best)) != len(rows):
        return None
    return rows[best]


def _cycles(perm: np.ndarray) -> list[list[int]]:
    seen, out = set(), []
    for i in range(len(perm)):
        if i in seen or perm[i] == i:
            continue
        cyc, j = [], i
        while j not in seen:
            seen.add(j)
            cyc.append(int(j))
            j = int(perm[j])
        out.append(cyc)
    return out


def _describe(cycles: list[list[int]]) -> str:
    if all(len(c) == 2 for c in cycles):
        parts = [f"{c[0]} and {c[1]}" for c in cycles[:LIST_MAX]]
        more = "; ..." if len(cycles) > LIST_MAX else ""
        return f"channel{'s' if len(parts) == 1 else ' pairs'} {'; '.join(parts)}{more} swapped"
    moves = [(i, c[(k + 1) % len(c)]) for c in cycles for k, i in enumerate(c)]
    shown = ", ".join(f"{i}<-{j}" for i, j in moves[:LIST_MAX])
    return f"channels moved (actual channel <- reference channel): {shown}{', ...' if len(moves) > LIST_MAX else ''}"


def channel_permutation(a, b, rel: float, limit: float, axes, names: tuple | None = None) -> tuple | None:
    tol = max(1e-3, limit)
    for ax in axes:
        n = b.shape[ax]
        if n < 2:
            continue
        A, B = np.moveaxis(a, ax, 0).reshape(n, -1), np.moveaxis(b, ax, 0).reshape(n, -1)
        D = A - B
        e = np.einsum("ij,ij->i", D, D)
        total = float(e.sum())
        if total <= 0:
            continue
        order = np.argsort(-e, kind="stable")
        k = int(np.searchsorted(np.cumsum(e[order]) / total, 1.0 - PERM_TAIL) + 1)
        if k < 2 or k > PERM_MAX:
            continue
        src = _match(A, B, np.sort(order[:k]))
        if src is None:
            continue
        perm = np.arange(n)
        perm[np.sort(order[:k])] = src
        if (perm == np.arange(n)).all():
            continue
        after = rel_l2(a, np.take(b, perm, axis=ax))
        if after > tol or after * GAIN > rel:
            continue
        cycles = _cycles(perm)
        moved = [[int(i), int(perm[i])] for c in cycles for i in c]
        return ("channel_permutation",
                f"channel_permutation: {_describe(cycles)} along {axis_word(ax, names)} of {n} (rel_l2 {rel:.3g} -> "
                f"{after:.3g} after undoing it)",
                {"axis": int(ax), "axis_name": names[ax] if names else None, "of": int(n), "cycles": cycles, "moved": moved, "rel_l2": rel,
                 "rel_l2_after": after})
    return None


# ---- op substitution ------------------------------------------------------------------------------

def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _gelu_erf(x):
    return 0.5 * x * (1.0 + _ERF(x / math.sqrt(2.0)).astype(np.float64))


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


OPS = {  # name as in ONNX -> f(x); LeakyRelu's alpha is fitted to the values
    "Identity": lambda x: x,
    "Relu": lambda x: np.maximum(x, 0.0),
    "LeakyRelu": None,
    "Clip(0, 6)": lambda x: np.clip(x, 0.0, 6.0),
    "Sigmoid": _sigmoid,
    "HardSigmoid(alpha=1/6)": lambda x: np.clip(x / 6.0 + 0.5, 0.0, 1.0),
    "HardSigmoid(alpha=0.2)": lambda x: np.clip(0.2 * x + 0.5, 0.0, 1.0),
    "SiLU": lambda x: x * _sigmoid(x),
    "HardSwish": lambda x: x * np.clip(x / 6.0 + 0.5, 0.0, 1.0),
    "Gelu(erf)": _gelu_erf,
    "Gelu(tanh)": _gelu_tanh,
    "Tanh": np.tanh,
    "Elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))),
    "Softplus": lambda x: np.logaddexp(0.0, x),
}


def _leaky(x, v) -> tuple[str, np.ndarray]:
    neg = x < 0
    xn = x[neg]
    alpha = _dot(v[neg], xn) / _dot(xn, xn) if xn.size and _dot(xn, xn) > 0 else 0.0
    return f"LeakyRelu(alpha={alpha:.4g})", np.where(neg, alpha * x, x)


def _best_op(x, v) -> tuple[str, float, dict]:
    """The candidate op whose f(x) is nearest to v: (name, rel_l2, every candidate's rel_l2). Ties
    (within 2x, e.g. LeakyRelu(alpha=1e-17) and Relu) go to the earlier, simpler op."""
    rels = {}
    for name, f in OPS.items():
        if f is None:
            label, y = _leaky(x, v)
        else:
            label, y = name, f(x)
        rels[label] = rel_l2(v, y)
    best = min(rels.values())
    name = next(k for k, r in rels.items() if r <= 2.0 * best + 1e-300)
    return name, rels[name], rels


def op_substitution(a, b, x, rel: float, limit: float) -> tuple | None:
    if x is None or np.shape(x) != b.shape:
        return None
    x = np.asarray(x, dtype=np.float64)
    idx = np.unique(np.linspace(0, b.size - 1, min(b.size, OP_SAMPLE)).astype(np.int64))
    xs, as_, bs = x.ravel()[idx], a.ravel()[idx], b.ravel()[idx]
    if not np.isfinite(xs).all():
        return None
    rel_s = rel_l2(as_, bs)
    got, got_rel, rels = _best_op(xs, as_)
    ref, ref_rel, _ = _best_op(xs, bs)
    if got == ref or got_rel * GAIN > rel_s or got_rel > max(1e-3, limit):
        return None
    known = ref_rel * GAIN <= rel_s
    where = (f"where the reference computes {ref} (rel_l2 {ref_rel:.3g})" if known else
             "; the reference matches none of the candidate ops")
    return ("op_substitution",
            f"op_substitution: the layer computes {got} {where}: on the layer's input, actual vs {got} applied to it "
            f"rel_l2 {got_rel:.3g}, actual vs the reference {rel_s:.3g} (on {len(idx)} of {b.size} elements)",
            {"op": got, "reference_op": ref if known else None, "rel_l2_op": got_rel,
             "rel_l2_reference_op": ref_rel, "rel_l2": rel, "rel_l2_sampled": rel_s, "sampled": int(len(idx)),
             "candidates": {k: v for k, v in sorted(rels.items(), key=lambda kv: kv[1])[:4]}})


# ---- softmax temperature --------------------------------------------------------------------------

def _softmax(z, ax):
    z = z - z.max(axis=ax, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=ax, keepdims=True)


def softmax_temperature(a, b, rel: float) -> tuple | None:
    if b.ndim < 1 or (b < 0).any() or (a < 0).any():
        return None
    for ax in dict.fromkeys([b.ndim - 1] + ([1] if b.ndim > 2 else [])):
        if b.shape[ax] < 2 or np.abs(b.sum(axis=ax) - 1).max() > SOFTMAX_SUM \
                or np.abs(a.sum(axis=ax) - 1).max() > SOFTMAX_SUM:
            continue
        m = (a > TINY) & (b > TINY)
        cnt = np.maximum(m.sum(axis=ax, keepdims=True), 1)
        la, lb = np.log(np.where(m, a, 1.0)), np.log(np.where(m, b, 1.0))
        lac = (la - (la * m).sum(axis=ax, keepdims=True) / cnt) * m
        lbc = (lb - (lb * m).sum(axis=ax, keepdims=True) / cnt) * m
        den = _dot(lbc.ravel(), lbc.ravel())
        if den <= 0:
            continue
        t = _dot(lac.ravel(), lbc.ravel()) / den
        after = rel_l2(a, _softmax(t * np.log(np.maximum(b, 1e-300)), ax))
        if after * GAIN > rel or abs(t - 1.0) <= after:
            continue
        return ("softmax_temperature",
                f"softmax_temperature: actual ~= softmax(t x) along axis {ax} with t = {t:.6g}, x the reference's "
                f"logits (log of its output, up to a per-row constant): rel_l2 {rel:.3g} -> {after:.3g}",
                {"t": t, "axis": int(ax), "rel_l2": rel, "rel_l2_after": after})
    return None


# ---- catastrophic cancellation --------------------------------------------------------------------

CANCEL_RATIO = 16.0        # input rms at least this many times the output's
CANCEL_K = 8.0             # error at most this many roundings of the input, relative to the output
CANCEL_OFFSET = 0.9        # the input is mostly a common offset: |mean| >= this share of its rms


def cancellation(a, b, x, rel: float, u: float, limit: float) -> tuple | None:
    if x is None or not math.isfinite(rel):
        return None
    x = np.asarray(x, dtype=np.float64).ravel()
    x = x[np.isfinite(x)]
    if not x.size:
        return None
    rin, rout = math.sqrt(_dot(x, x) / x.size), math.sqrt(_dot(b.ravel(), b.ravel()) / max(b.size, 1))
    mean = float(np.add.reduce(x)) / x.size
    if rout == 0 or rin < CANCEL_RATIO * rout or abs(mean) < CANCEL_OFFSET * rin:
        return None  # a small output from a large input by division (a normalisation) is no cancellation
    explained = u * rin / rout  # the relative error one rounding of the input leaves in the output
    if rel > CANCEL_K * explained or rel <= limit:
        return None
    return ("cancellation",
            f"cancellation: the layer's input is {rin / rout:.3g}x larger than its output (rms {rin:.3g} vs "
            f"{rout:.3g}): one rounding of the input (u {u:.3g}) is rel_l2 ~{explained:.3g} of the output; "
            f"measured {rel:.3g}",
            {"rms_input": rin, "rms_output": rout, "ratio": rin / rout, "u": u, "explained_rel_l2": explained,
             "rel_l2": rel})


# ---- axes by what they are ------------------------------------------------------------------------

ATTENTION_WORDS = ("attn", "attention", "sdpa", "softmax")
SEQUENCE_WORDS = ("layers.", ".h.", "encoder.layer", "decoder.layer", "blocks.", "attn", "attention", "mlp",
                  "embed", "wte", "wpe", "lm_head", "norm", "ln_", "proj", "encoder_layer", "transformer.")


def axis_names(name: str | None, shape: tuple) -> tuple | None:
    """What each axis of a layer's value is, from the layer's name and rank (the model's structure as its
    module names show it): (B, C, H, W) for rank 4 outside attention, (batch, head, token, key) inside it;
    (batch, token, hidden) for rank 3 in a transformer's modules (decoder/encoder layers, attention, MLP,
    embeddings, norms, heads); (batch, feature) for rank 2. None where the layout is not known (a rank-3
    value outside a transformer may be (B, C, T)): axes are then named by number only."""
    n = (name or "").lower()
    rank = len(shape)
    if rank == 4:
        return ("batch", "head", "token", "key") if any(w in n for w in ATTENTION_WORDS) else \
            ("batch", "channel", "height", "width")
    if rank == 3 and any(w in n for w in SEQUENCE_WORDS):
        return ("batch", "token", "vocab" if ("lm_head" in n or "logits" in n) else "hidden")
    if rank == 2:
        return ("batch", "feature")
    return None


WEIGHT_WORDS = ("proj", "fc", "linear", "conv", "dense", "lm_head", "c_attn", "query", "key", "value",
                "classifier", "head", "embed", "wte", "wpe", "downsample")


def is_attention(name: str | None) -> bool:
    return any(w in (name or "").lower() for w in ATTENTION_WORDS)


def has_weights(name: str | None) -> bool:
    """Whether a layer's module name says it holds weights (a projection, a conv, an embedding, a head)."""
    return any(w in (name or "").lower().rpartition(".")[2] for w in WEIGHT_WORDS)


def axis_word(ax: int, names: tuple | None) -> str:
    """`axis 1 (token)`, or `axis 1` where the axis is not known."""
    return f"axis {ax} ({names[ax]})" if names and ax < len(names) else f"axis {ax}"


# ---- positions: the error starts at a token (attention mask / causality leak) ---------------------

def positions(a, b, rel: float, limit: float, names: tuple | None, attention: bool) -> tuple | None:
    """The error sits at token positions only, every token before the first one within the precision
    limit (per-token rel_l2 <= limit): in an attention layer a mask/causality leak (`mask_leak`: the
    positions that see what they should not), elsewhere a fault at those positions (`position`: an
    embedding row, a position id)."""
    if not names or "token" not in names:
        return None
    ax = names.index("token")
    n = b.shape[ax]
    if n < 2:
        return None
    others = tuple(i for i in range(b.ndim) if i != ax)
    d = a - b
    e, eb = (d * d).sum(axis=others), (b * b).sum(axis=others)
    total = float(e.sum())
    if total <= 0:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        rel_t = np.sqrt(np.where(eb > 0, e / eb, np.where(e > 0, np.inf, 0.0)))
    bad = np.flatnonzero(rel_t > limit)
    if not bad.size:
        return None
    t0 = int(bad[0])
    clean_share = float(e[:t0].sum()) / total
    if t0 < 1:
        return None  # no clean token before it: no positional pattern
    listed = [int(i) for i in bad[:LIST_MAX]]
    more = ", ..." if len(bad) > LIST_MAX else ""
    tokens = f"token {listed[0]}" if len(bad) == 1 else f"tokens {', '.join(map(str, listed))}{more}"
    ev = {"axis": int(ax), "axis_name": "token", "first": t0, "tokens": listed, "n_tokens": int(len(bad)),
          "of": int(n), "rel_l2_tokens": [float(rel_t[i]) for i in listed],
          "rel_l2_before_max": float(rel_t[:t0].max()), "error_share_before": clean_share, "rel_l2": rel}
    where = (f"the error starts at token {t0} of {n} ({axis_word(ax, names)}): tokens 0-{t0 - 1} within precision "
             f"(per-token rel_l2 <= {float(rel_t[:t0].max()):.3g}), {len(bad)} token(s) wrong: {tokens}")
    if attention:
        return ("mask_leak", f"mask_leak: attention mask/causality leak: {where} (rel_l2 {rel:.3g})", ev)
    return ("position", f"position: a fault at token positions: {where} (rel_l2 {rel:.3g})", ev)


# ---- per-row scale: a normalisation's epsilon -----------------------------------------------------

ROW_SCALE_SPREAD = 0.25    # at least this share of the rows has a scale off 1 by more than the noise


def row_scale(a, b, x, rel: float, limit: float, names: tuple | None, global_residual: float) -> tuple | None:
    """actual ~= s_r x expected with one least-squares scale per row (per token: every axis but the last,
    hidden one), the rows' scales differing (a global scale is tried before): a normalisation's epsilon
    (RMSNorm / LayerNorm divide each row by sqrt(mean + eps)). With the layer's input `x` (same shape):
    the epsilon change each row's scale implies, (1/s^2 - 1)(mean(x^2) + eps) ~ (1/s^2 - 1) mean(x^2).
    Tried before the global scale, claimed only where the per-row scales leave 10x less than one scale
    does (`global_residual`): rows of similar size make an epsilon change look like one scale."""
    if b.ndim < 2 or (names and names[-1] not in ("hidden", "feature")) or b.shape[-1] < 4:
        return None
    A, B = a.reshape(-1, b.shape[-1]), b.reshape(-1, b.shape[-1])
    if A.shape[0] < 2:
        return None
    bb = np.einsum("ij,ij->i", B, B)
    ok = bb > 0
    s = np.where(ok, np.einsum("ij,ij->i", A, B) / np.where(ok, bb, 1.0), 1.0)
    r = A - s[:, None] * B
    after = math.sqrt(_dot(r.ravel(), r.ravel()) / max(_dot(B.ravel(), B.ravel()), 1e-300))
    if not (after * GAIN <= rel or (after <= limit and after * 2 <= rel)) or after * GAIN > global_residual:
        return None
    moved = np.abs(s - 1.0) > max(limit, after)
    if moved.mean() < ROW_SCALE_SPREAD:
        return None
    ev = {"rows": int(len(s)), "rows_scaled": int(moved.sum()), "scale_min": float(s.min()),
          "scale_max": float(s.max()), "scale_median": float(np.median(s)), "rel_l2": rel, "rel_l2_after": after}
    eps = ""
    if x is not None and np.shape(x) == b.shape:
        X = np.asarray(x, dtype=np.float64).reshape(B.shape)
        m = np.einsum("ij,ij->i", X, X) / X.shape[1]
        delta = (1.0 / np.where(s != 0, s * s, np.nan) - 1.0) * m
        med = float(np.nanmedian(delta))
        spread = float(np.nanpercentile(np.abs(delta - med), 90)) / abs(med) if med else math.inf
        ev.update(epsilon_change=med, epsilon_change_spread=spread)
        if spread <= 0.5:
            eps = f"; the scales fit an epsilon change of {med:+.3g} (sqrt((mean(x^2) + eps) / (mean(x^2) + eps {med:+.3g})))"
    row = "token" if names and "token" in names else "row"
    return ("row_scale",
            f"row_scale: each {row} scaled by its own factor ({ev['rows_scaled']} of {len(s)} {row}s, x{s.min():.5g} to "
            f"x{s.max():.5g}): a per-{row} normalisation, its epsilon{eps} (rel_l2 {rel:.3g} -> {after:.3g} after "
            f"the per-{row} scales)", ev)


# ---- weights stored in a narrower format ----------------------------------------------------------

NARROW_WEIGHT_U = (0.2, 1.2)  # one rounding of a layer's weights: rel_l2 ~ u / sqrt(3) of that format


def narrow_weights(a, b, rel: float, u_cell: float, weighted: bool) -> tuple | None:
    """An fp32 layer whose error is the size of one fp16 rounding of its weights (rel_l2 within
    0.2-1.2 u_fp16; about u / sqrt(3) for a product with weights rounded to nearest) while its values are
    no fp16 numbers (narrow_format did not claim them): weights stored in fp16 inside an fp32 graph (or
    its input rounded to fp16 on the way). `weighted`: the layer holds weights (a projection, a conv);
    what the numbers suggest, not a proof: re-run the layer with its weights rounded to confirm."""
    u = NARROW["fp16"]
    if not weighted or u_cell >= u or not (NARROW_WEIGHT_U[0] * u <= rel <= NARROW_WEIGHT_U[1] * u):
        return None
    return ("narrow_weights",
            f"narrow_weights: rel_l2 {rel:.3g} = {rel / u:.2f} u_fp16, the error one rounding of the layer's weights "
            f"to fp16 leaves (~0.58 u), in an fp32 layer whose values are no fp16 numbers: weights stored in fp16 "
            f"(or its input rounded to fp16); re-run the layer with its weights rounded to confirm",
            {"format": "fp16", "u": u, "rel_l2": rel, "rel_l2_u": rel / u, "range_u": list(NARROW_WEIGHT_U)})
