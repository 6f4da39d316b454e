"""Parity's own quantisation of a graph's weights, independent of onnxruntime's quantisers (issue 35
item 3: the quantised oracle), and the graph that computes the quantised model exactly.

INT4 block-wise (what ort_int4's MatMulNBits holds; MLAS's blockwise quantiser, checked byte for
byte against onnxruntime's packing): each output column's K weights in blocks of `block_size` (the
last block zero-padded); symmetric: scale = v / -8 with v the block's value of largest magnitude
(sign kept), q = clip(round(w / scale) + 8, 0, 15), zero point 8; asymmetric: lo = min(w, 0),
hi = max(w, 0), scale = (hi - lo) / 15, zero point = clip(round(-lo / scale), 0, 15), q =
clip(round(w / scale) + zp, 0, 15). Packed (N, blocks, block_size / 2) uint8, the even element in
the low nibble, the padding 0; zero points (N, ceil(blocks / 2)) uint8 the same way (an odd count padded with 8); scales (N, blocks) float32.
Dequantised: (q - zp) x scale, exact in float64.

accuracy_level 4 (int8 compute): MatMulNBits quantises its activations per block of `block_size`
along K to int8 at run time, symmetric, scale = max|a| / 127, q = round(a / scale) (measured: a
one-node graph matches this simulation to rel_l2 2e-7, and the exact dequantised product only to
5e-3, tests/test_35_quant_oracle.py).

INT8 dynamic (ort_int8's int8_dynamic, quantize_dynamic's MatMul -> MatMulInteger): weights int8 per
tensor (or per output channel), symmetric: scale = max|w| / q_max (q_max 127, or 64 with
reduce_range); the embedding tables a Gather reads uint8 over [min, max] (quantize_dynamic's GatherQuant), q = clip(round(w / scale), -q_max - 1, q_max); activations per call, uint8
asymmetric over the tensor's range including 0 (DynamicQuantizeLinear): scale = (max - min) / 255,
zp = clip(round(-min / scale), 0, 255), a' = (clip(round(a / scale) + zp, 0, 255) - zp) x scale.

`simulated` rewrites each weight MatMul the provider quantises as the dequantised weight (its
integers and scales as initializers, multiplied in the graph: exact when the graph is cast to
float64) times the activations quantised per the scheme, all in ONNX ops, so the same graph runs in
float64 (the oracle) and in float32 (its trusted fp32 run). Never imports torch.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from parity.models import onnx_int4


def round_half_away(x: np.ndarray) -> np.ndarray:
    """Round to nearest, ties away from zero (C's roundf, as onnxruntime's block quantiser rounds);
    numpy's round sends ties to even: 8.5 -> 8 where onnxruntime packs 9."""
    t = np.trunc(x)
    return np.where(np.abs(x - t) == 0.5, t + np.sign(x), np.round(x))


def int4_blocks(w: np.ndarray, bs: int, sym: bool):
    """(q (N, blocks, bs) uint8, scales (N, blocks) float32, zero points (N, blocks) uint8) of the
    (K, N) weight `w`, block-wise along K (module docstring)."""
    k, n = w.shape
    nb = -(-k // bs)
    wt = np.zeros((n, nb * bs), np.float32)
    wt[:, :k] = np.asarray(w, np.float32).T
    b = wt.reshape(n, nb, bs)
    if sym:
        mx, mn = b.max(-1), b.min(-1)
        big = np.where(np.abs(mx) > np.abs(mn), mx, mn)
        scale = (big / np.float32(-8)).astype(np.float32)
        zp = np.full(scale.shape, 8, np.float32)
    else:
        lo, hi = np.minimum(b.min(-1), 0), np.maximum(b.max(-1), 0)
        scale = ((hi - lo) / np.float32(15)).astype(np.float32)
        zp = None
    inv = np.divide(np.float32(1), scale, out=np.zeros_like(scale), where=scale != 0).astype(np.float32)
    if zp is None:
        zp = np.clip(round_half_away(-lo * inv), 0, 15).astype(np.float32)
    q = np.clip(round_half_away(b * inv[..., None] + zp[..., None]), 0, 15).astype(np.uint8).reshape(n, nb * bs)
    q[:, k:] = 0  # the padding packs as 0, as onnxruntime writes it
    return q.reshape(n, nb, bs), scale, zp.astype(np.uint8)


def pack_nibbles(v: np.ndarray, pad: int = 0) -> np.ndarray:
    """Pairs along the last axis into bytes, the even element in the low nibble (odd length: `pad` last;
    onnxruntime pads zero points with 8)."""
    if v.shape[-1] % 2:
        v = np.concatenate([v, np.full(v.shape[:-1] + (1,), pad, v.dtype)], -1)
    return (v[..., 0::2] | (v[..., 1::2] << 4)).astype(np.uint8)


def int4_packed(w: np.ndarray, bs: int, sym: bool) -> dict:
    """MatMulNBits' initializers for weight `w` as parity quantises it: {"packed", "scales"
    [, "zero_points"]} (module docstring)."""
    q, scale, zp = int4_blocks(w, bs, sym)
    out = {"packed": pack_nibbles(q), "scales": scale}
    if not sym:
        out["zero_points"] = pack_nibbles(zp, 8)
    return out


def int8_weight(w: np.ndarray, per_channel: bool, reduce_range: bool, unsigned: bool = False):
    """(q - zero point as float32, scale as float32 broadcasting over (K, N)) of an int8 weight
    quantised symmetric per tensor or per output column (QInt8; QUInt8: asymmetric over [min, max])."""
    w = np.asarray(w, np.float32)
    axis = 0 if per_channel else None
    if unsigned:
        qmax = 127.0 if reduce_range else 255.0
        lo = np.minimum(w.min(axis=axis, keepdims=per_channel), 0)
        hi = np.maximum(w.max(axis=axis, keepdims=per_channel), 0)
        scale = ((hi - lo) / np.float32(qmax)).astype(np.float32)
        scale = np.where(scale == 0, np.float32(1), scale)
        zp = np.clip(np.round(-lo / scale), 0, qmax)
        q = np.clip(np.round(w / scale) + zp, 0, qmax) - zp
    else:
        qmax = 64.0 if reduce_range else 127.0  # onnxruntime's ranges: [-64, 64] reduced, else [-127, 127]
        amax = np.abs(w).max(axis=axis, keepdims=per_channel)
        scale = (np.asarray(amax, np.float64) * 2 / (2 * qmax)).astype(np.float32)
        scale = np.where(scale == 0, np.float32(1), scale)
        q = np.clip(np.round(w / scale), -qmax, qmax)
    return q.astype(np.float32), np.asarray(scale, np.float32)


class _Graph:
    """Nodes and initializers added to a graph, named under one prefix."""

    def __init__(self, prefix: str):
        self.prefix, self.nodes, self.inits = prefix, [], []

    def const(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), f"{self.prefix}/c_{name}"))
        return f"{self.prefix}/c_{name}"

    def op(self, op: str, inputs: list, name: str, **attrs) -> str:
        out = f"{self.prefix}/{name}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out


def _reduce(g: _Graph, op: str, x: str, name: str, opset: int) -> str:
    """op (ReduceMax | ReduceMin) over the last axis, kept (axes an input from opset 18)."""
    if opset >= 18:
        return g.op(op, [x, g.const(f"{name}_axes", np.array([-1], np.int64))], name, keepdims=1)
    return g.op(op, [x], name, axes=[-1], keepdims=1)


def act_int8_blocks(g: _Graph, a: str, k: int, bs: int, opset: int) -> str:
    """`a` (..., K) quantised per block of `bs` along K to int8, symmetric, and dequantised."""
    nb = -(-k // bs)
    flat = g.op("Reshape", [a, g.const("flat", np.array([-1, k], np.int64))], "a2d")
    if nb * bs != k:
        flat = g.op("Pad", [flat, g.const("pads", np.array([0, 0, 0, nb * bs - k], np.int64))], "apad")
    blocks = g.op("Reshape", [flat, g.const("blocks", np.array([-1, nb, bs], np.int64))], "ablocks")
    amax = _reduce(g, "ReduceMax", g.op("Abs", [blocks], "aabs"), "amax", opset)
    scale = g.op("Div", [amax, g.const("q127", np.array(127.0, np.float32))], "ascale")
    zero = g.op("Equal", [amax, g.const("zero", np.array(0.0, np.float32))], "azero")
    safe = g.op("Where", [zero, g.const("one", np.array(1.0, np.float32)), scale], "asafe")
    q = g.op("Round", [g.op("Div", [blocks, safe], "adiv")], "around")
    deq = g.op("Reshape", [g.op("Mul", [q, safe], "adeq"), g.const("back", np.array([-1, nb * bs], np.int64))],
               "a2dq")
    if nb * bs != k:
        deq = g.op("Slice", [deq, g.const("s0", np.array([0], np.int64)), g.const("s1", np.array([k], np.int64)),
                             g.const("s2", np.array([1], np.int64))], "aslice")
    return g.op("Reshape", [deq, g.op("Shape", [a], "ashape")], "aq")


def act_uint8_tensor(g: _Graph, a: str, opset: int) -> str:
    """`a` quantised per tensor to uint8 over [min(a, 0), max(a, 0)] (DynamicQuantizeLinear), dequantised."""
    flat = g.op("Reshape", [a, g.const("flat", np.array([1, -1], np.int64))], "a1d")
    zero = g.const("zero", np.array(0.0, np.float32))
    hi = g.op("Max", [_reduce(g, "ReduceMax", flat, "amax", opset), zero], "ahi")
    lo = g.op("Min", [_reduce(g, "ReduceMin", flat, "amin", opset), zero], "alo")
    scale = g.op("Div", [g.op("Sub", [hi, lo], "arange"), g.const("q255", np.array(255.0, np.float32))], "ascale")
    safe = g.op("Where", [g.op("Equal", [scale, zero], "azero"), g.const("one", np.array(1.0, np.float32)), scale],
                "asafe")
    q255 = g.const("c255", np.array(255.0, np.float32))
    zp = g.op("Clip", [g.op("Round", [g.op("Div", [g.op("Neg", [lo], "aneg"), safe], "azdiv")], "azr"), zero, q255],
              "azp")
    q = g.op("Clip", [g.op("Add", [g.op("Round", [g.op("Div", [a, safe], "adiv")], "around"), zp], "aadd"), zero, q255],
             "aq8")
    return g.op("Mul", [g.op("Sub", [q, zp], "asub"), safe], "aq")


def _int4_weight(g: _Graph, w: np.ndarray, bs: int, sym: bool) -> str:
    """The dequantised (K, N) weight as graph ops: (q - zp) and scales as initializers, multiplied."""
    k, n = w.shape
    q, scale, zp = int4_blocks(w, bs, sym)
    ints = q.astype(np.float32) - zp.astype(np.float32)[..., None]  # small integers: exact
    deq = g.op("Mul", [g.const("wq", ints), g.const("wscale", scale[..., None])], "wdeq")
    flat = g.op("Reshape", [deq, g.const("wflat", np.array([n, -1], np.int64))], "wflat")
    if q.shape[1] * q.shape[2] != k:
        flat = g.op("Slice", [flat, g.const("ws0", np.array([0], np.int64)), g.const("ws1", np.array([k], np.int64)),
                              g.const("ws2", np.array([1], np.int64))], "wslice")
    return g.op("Transpose", [flat], "w", perm=[1, 0])


def _int8_weight(g: _Graph, w: np.ndarray, opts: dict) -> str:
    ints, scale = int8_weight(w, bool(opts.get("per_channel")), bool(opts.get("reduce_range")),
                              opts.get("weight_type") == "QUInt8")
    return g.op("Mul", [g.const("wq", ints), g.const("wscale", scale)], "w")


def simulated(m: onnx.ModelProto, scheme: str, opts: dict, base_dir, nodes: list[str]) -> onnx.ModelProto:
    """A copy of `m` (its weights read from `base_dir`; Gemms the provider rewrites already MatMul:
    onnx_int4.gemm_to_matmul) with each MatMul in `nodes` computing the quantised model: the weight
    as parity quantises it, dequantised, times the activations quantised per the scheme (`int4`:
    per block at accuracy_level 4; `int8_dynamic`: per tensor, uint8). Weights inline."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    opset = next((o.version for o in out.opset_import if o.domain in ("", "ai.onnx")), 18)
    inits = {t.name: t for t in out.graph.initializer}
    want, nodes_out, added = set(nodes), [], []
    for n in out.graph.node:
        if scheme == "int8_dynamic" and n.op_type == "Gather" and n.input[0] in inits and \
                inits[n.input[0]].data_type == TensorProto.FLOAT:  # an embedding table: int8 too
            g = _Graph(f"quant_sim/{n.name or n.output[0]}")
            w = onnx_int4.read(inits[n.input[0]], base_dir).astype(np.float32)
            ints, scale = int8_weight(w, False, False, True)  # GatherQuant: uint8 over [min, max], as an activation
            table = g.op("Mul", [g.const("wq", ints), g.const("wscale", scale)], "w")
            nodes_out.extend(g.nodes + [helper.make_node("Gather", [table, *n.input[1:]], list(n.output), name=n.name,
                                                         axis=next((a.i for a in n.attribute if a.name == "axis"), 0))])
            added.extend(g.inits)
            continue
        if n.name not in want:
            nodes_out.append(n)
            continue
        w = onnx_int4.read(inits[n.input[1]], base_dir).astype(np.float32)
        g = _Graph(f"quant_sim/{n.name}")
        if scheme == "int4":
            a = n.input[0]
            if int(opts.get("accuracy_level", 0)) == 4:
                a = act_int8_blocks(g, a, w.shape[0], int(opts["block_size"]), opset)
            wq = _int4_weight(g, w, int(opts["block_size"]), bool(opts["is_symmetric"]))
        else:
            a, wq = act_uint8_tensor(g, n.input[0], opset), _int8_weight(g, w, opts)
        g.nodes.append(helper.make_node("MatMul", [a, wq], [n.output[0]], name=n.name))
        nodes_out.extend(g.nodes)
        added.extend(g.inits)
    del out.graph.node[:]
    out.graph.node.extend(nodes_out)
    used = {i for nd in out.graph.node for i in nd.input}
    keep = [t for t in out.graph.initializer if t.name in used]
    del out.graph.initializer[:]
    for t in keep:
        if t.data_location == TensorProto.EXTERNAL:
            t.CopyFrom(numpy_helper.from_array(onnx_int4.read(t, base_dir), t.name))
    out.graph.initializer.extend(keep + added)
    del out.graph.value_info[:]
    return out
