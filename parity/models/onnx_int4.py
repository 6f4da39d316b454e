"""INT4 weight-only quantization of a weightless ONNX graph, one weight at a time: what
onnxruntime's MatMulNBitsQuantizer (DEFAULT algorithm, QOperator format) makes of an in-memory model,
without ever holding the model's weights in a protobuf (that quantizer needs the whole model as one,
so it stops at protobuf's 2 GiB limit; a 1.1B model's fp32 weights are 4.4 GB).

For every MatMul whose B is a 2-D initializer (weight_matmuls: the rule the ort_int4 provider counts
by; Gemms with a constant B first rewritten as MatMul + Add, gemm_to_matmul; the quantizer's own rule, a constant B, 2-D or with unit leading dims,
never differs on the graphs parity exports), not in `exclude`:
- B is read on its own (from its external data file, np.fromfile at its offset, or inline), and
  quantized by the quantizer's own per-tensor function (DefaultWeightOnlyQuantizer.qbits_block_quant,
  which calls onnxruntime's C++ quantize_matmul_4bits): packed (N, K/block, block/2) uint8, scales
  (N, K/block) in B's dtype, zero points (N, ceil(K/block/2)) uint8 when not symmetric;
- the node becomes com.microsoft MatMulNBits `<node>_Q4` with inputs (A, `<B>_Q4`, `<B>_scales`
  [, `<B>_zero_points`]) and attributes K, N, bits 4, block_size, accuracy_level (left out at 0), as
  the quantizer writes it; initializers no node reads any more are dropped. (A weight two MatMuls
  share is quantized once; the quantizer would append its tensors twice under one name.)
The packed tensors go to a Converted store (parity.models.onnx_weights: one temp weights file,
appended one tensor at a time, keyed by name and settings, so the layers, plain and mixed graphs of a
runner quantize each weight once), and so do the graph's other external initializers (onnxruntime
reads one folder of external data per graph). With no store, every tensor stays inline (small graphs
given with their weights: reduce). Peak memory: about three times the largest weight.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.helper import tensor_dtype_to_np_dtype
from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, DefaultWeightOnlyQuantizer

from parity.models import onnx_weights

BITS = 4
# the ort_int4 provider's options and their defaults (parity.backends.ort_int4 reads them from here, and so
# does the quantised oracle, parity.pipeline.quant_reference, without importing a runner)
DEFAULTS = {"block_size": 32, "accuracy_level": 4, "is_symmetric": True, "gemm_to_matmul": True}


def options(provider_cfg: dict) -> dict:
    """The cell's int4 options: the conf's `options:` over DEFAULTS."""
    o = provider_cfg.get("options") or {}
    return {k: o.get(k, v) for k, v in DEFAULTS.items()}


def _attr(node, name: str, default):
    a = next((a for a in node.attribute if a.name == name), None)
    return default if a is None else onnx.helper.get_attribute_value(a)


def _gemm_ok(node, inits: dict) -> bool:
    """A Gemm the rewrite takes: a constant 2-D B, A not transposed, alpha = beta = 1."""
    b = inits.get(node.input[1]) if len(node.input) > 1 else None
    return (node.op_type == "Gemm" and b is not None and len(b.dims) == 2 and _attr(node, "transA", 0) == 0
            and _attr(node, "alpha", 1.0) == 1.0 and _attr(node, "beta", 1.0) == 1.0)


def weight_matmuls(m, gemm: bool, exclude=()) -> list[str]:
    """Node names the quantizer turns into MatMulNBits, in graph order: MatMuls with a 2-D constant
    initializer as B (and, with `gemm`, Gemms the rewrite takes), not in `exclude`."""
    inits = {t.name: t for t in m.graph.initializer}
    out = []
    for n in m.graph.node:
        if n.name in exclude:
            continue
        b = inits.get(n.input[1]) if len(n.input) > 1 else None
        if n.op_type == "MatMul" and b is not None and len(b.dims) == 2 or gemm and _gemm_ok(n, inits):
            out.append(n.name)
    return out


def _transposed(t, name: str):
    return numpy_helper.from_array(numpy_helper.to_array(t).T.copy(), name)


def gemm_to_matmul(m, exclude=(), transpose=_transposed) -> int:
    """Rewrite, in place, each Gemm `weight_matmuls` takes (not in `exclude`) as MatMul(A, B') with the
    Gemm's name (B' = transpose(B, `<B>_t_<gemm>`) when transB) plus Add(C) named `<gemm>_bias`.
    Returns how many."""
    inits = {t.name: t for t in m.graph.initializer}
    nodes, n_done = [], 0
    for n in m.graph.node:
        if n.name in exclude or not _gemm_ok(n, inits):
            nodes.append(n)
            continue
        b = n.input[1]
        if _attr(n, "transB", 0):
            b = f"{n.input[1]}_t_{n.name}"
            m.graph.initializer.append(transpose(inits[n.input[1]], b))
        has_c = len(n.input) > 2 and n.input[2]
        mm_out = f"{n.output[0]}_matmul" if has_c else n.output[0]
        nodes.append(onnx.helper.make_node("MatMul", [n.input[0], b], [mm_out], name=n.name))
        if has_c:
            nodes.append(onnx.helper.make_node("Add", [mm_out, n.input[2]], [n.output[0]], name=f"{n.name}_bias"))
        n_done += 1
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return n_done


def block_quantizer(block_size: int, is_symmetric: bool, accuracy_level: int):
    """onnxruntime's DefaultWeightOnlyQuantizer for these settings. Its module calls
    logging.basicConfig(level=INFO) on import: the root logger's handlers and level are put back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level

    for h in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(h)
    root.setLevel(level)
    return DefaultWeightOnlyQuantizer(DefaultWeightOnlyQuantConfig(
        block_size=block_size, is_symmetric=is_symmetric, accuracy_level=accuracy_level, bits=BITS))


def read(t: TensorProto, base_dir) -> np.ndarray:
    """Tensor `t`'s values: inline, or read from its external data under `base_dir` (a private copy,
    not a map: the pages read do not stay in the process)."""
    if not onnx_weights.is_external(t):
        return numpy_helper.to_array(t)

    info = onnx_weights.external_info(t)
    dt = np.dtype(tensor_dtype_to_np_dtype(t.data_type))
    count = int(np.prod(t.dims, dtype=np.int64))
    with open(Path(base_dir) / info["location"], "rb") as f:
        f.seek(int(info.get("offset", 0)))
        arr = np.fromfile(f, dtype=dt, count=count)
    if arr.size != count:
        raise ValueError(f"{t.name}: its external data file {info['location']} ends early")
    return arr.reshape(tuple(t.dims))


class _Tensors:
    """Where the output graph's tensors go: `store` (external, in store.dir) or inline (no store)."""

    def __init__(self, base_dir, store, tag: str):
        self.base, self.store, self.tag = Path(base_dir), store, tag

    def make(self, name: str, key: str, data_type: int, dims, fill) -> TensorProto:
        """TensorProto `name` (data_type, dims) whose bytes are fill() (an array), computed only when
        the store does not hold (name, key) yet."""
        if self.store is None:
            return numpy_helper.from_array(np.ascontiguousarray(fill()), name)
        t = TensorProto(name=name, data_type=data_type, dims=list(dims))
        off, n = self.store.put((name, key), fill)
        onnx_weights.set_external(t, onnx_weights.WEIGHTS, off, n)
        return t

    def relocate(self, t: TensorProto, source) -> None:
        """Point external tensor `t` at the store (its bytes copied there once), or make it inline."""
        if self.store is None:
            t.CopyFrom(numpy_helper.from_array(source(), t.name))
            return
        off, n = self.store.put((t.name, f"src:{t.data_type}"), source)
        onnx_weights.set_external(t, onnx_weights.WEIGHTS, off, n)


def quantize(m: onnx.ModelProto, base_dir, store, opts: dict, exclude=()):
    """`m` (weightless or not; external data under `base_dir`; changed in place) with its weight
    MatMuls (weight_matmuls, after gemm_to_matmul when opts.gemm_to_matmul) as
    MatMulNBits, the nodes in `exclude` left float32, its tensors in `store` (None: inline).
    Returns (m, names of the quantized nodes)."""
    exclude = set(exclude)
    del m.graph.value_info[:]
    transposed: dict[str, TensorProto] = {}  # Gemm transB rewrites: new name -> the source tensor
    if opts["gemm_to_matmul"]:
        gemm_to_matmul(m, exclude, transpose=lambda t, name: _lazy_t(t, name, transposed))
    names = weight_matmuls(m, False, exclude)
    bs, sym, acc = int(opts["block_size"]), bool(opts["is_symmetric"]), int(opts["accuracy_level"])
    out = _Tensors(base_dir, store, f"q{BITS}:b{bs}:{'sym' if sym else 'asym'}")
    q = block_quantizer(bs, sym, acc)
    inits = {t.name: t for t in m.graph.initializer}
    added: dict[str, TensorProto] = {}
    want = set(names)
    nodes = []
    for n in m.graph.node:
        if n.name not in want:
            nodes.append(n)
            continue
        b = inits[n.input[1]]
        k, cols = (int(d) for d in b.dims)
        ins = _quantized_weight(b, lambda b=b: _source(b, base_dir, transposed), q, out, added, sym)
        attrs = {"K": k, "N": cols, "bits": BITS, "block_size": bs, **({"accuracy_level": acc} if acc else {})}
        nodes.append(helper.make_node("MatMulNBits", [n.input[0], *ins], [n.output[0]], name=f"{n.name}_Q{BITS}",
                                      domain="com.microsoft", **attrs))
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    _finish(m, added, out, base_dir, transposed)
    return m, names


def _lazy_t(t: TensorProto, name: str, transposed: dict) -> TensorProto:
    """A placeholder for B transposed (dims reversed), its values made when read (_source)."""
    new = TensorProto(name=name, data_type=t.data_type, dims=list(reversed(t.dims)))
    transposed[name] = t
    return new


def _source(t: TensorProto, base_dir, transposed: dict) -> np.ndarray:
    if t.name in transposed:
        return np.ascontiguousarray(read(transposed[t.name], base_dir).T)
    return read(t, base_dir)


def _quantized_weight(b: TensorProto, source, q, out: _Tensors, added: dict, sym: bool) -> list[str]:
    """The names of B's packed weight, scales (and zero points), made once per B (qbits_block_quant)."""
    names = [f"{b.name}_Q{BITS}", f"{b.name}_scales"] + ([] if sym else [f"{b.name}_zero_points"])
    if names[0] in added:
        return names
    k, cols = (int(d) for d in b.dims)
    k_blocks = -(-k // q.config.block_size)
    shapes = [(cols, k_blocks, -(-q.config.block_size // 2)), (cols, k_blocks), (cols, -(-k_blocks // 2))]
    types = [TensorProto.UINT8, b.data_type, TensorProto.UINT8]
    got: dict = {}

    def part(i):
        def fill():
            if not got:
                arr = source()
                got["v"] = q.qbits_block_quant(arr)
                del arr
            return got["v"][i]
        return fill

    for i, name in enumerate(names):
        added[name] = out.make(name, out.tag, types[i], shapes[i], part(i))
    got.clear()
    return names


def _finish(m: onnx.ModelProto, added: dict, out: _Tensors, base_dir, transposed: dict) -> None:
    """The quantized tensors appended, initializers no node reads dropped (as the quantizer's
    clean_initializers does, graph inputs of the same name too), the others relocated to the store;
    the com.microsoft opset set to 1 (as the quantizer does, whatever it quantized)."""
    read_names = onnx_weights.read_by_nodes(m)
    keep = [t for t in m.graph.initializer if t.name in read_names] + list(added.values())
    gone = {t.name for t in m.graph.initializer} - read_names
    del m.graph.initializer[:]
    m.graph.initializer.extend(keep)
    ins = [i for i in m.graph.input if i.name not in gone]
    del m.graph.input[:]
    m.graph.input.extend(ins)
    for t in onnx_weights.initializers(m):
        if t.name in transposed or onnx_weights.is_external(t) and t.name not in added:
            t_src = TensorProto()
            t_src.CopyFrom(t)
            out.relocate(t, lambda s=t_src: _source(s, base_dir, transposed))
    for o in m.opset_import:
        if o.domain == "com.microsoft":
            o.version = 1
            break
    else:
        m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
