"""Suite cases of kind `onnx`: a whole ONNX model with its inputs and expected outputs, in the layout of
ONNX's backend tests (a folder with `model.onnx` and `test_data_set_<k>/{input,output}_<j>.pb`):

    - {id: test_relu, onnx: {path: data/onnx/onnx_node/test_relu, op: Relu}}

The provider runs the file through its runner (Runner.onnx_based: the same options and session
settings as in the model pipeline; `prepared` converts it to the cell's dtype as the model pipeline
does, fp16 keeping float32 inputs and outputs); the reference is the test's expected outputs (one
sample per data set), and the case is judged against them by tolerance, not by the fp64 oracle
(a conformance test's expected outputs are its truth; its `oracle_note` says so).

What the harness does so that a valid test runs as given (each says so in the case's note):
- values of every ONNX type: tensors of any element type (bfloat16, float8, float4, int4/int2 are fed
  and read back as raw ONNX data, since onnxruntime's numpy feed takes none of them), sequences (one
  tensor per element plus the length), optionals (an empty one is a marker tensor), strings (each
  compared exactly through a 64-bit digest of its UTF-8 bytes); maps are SKIPPED;
- a file stamped with an IR version newer than onnxruntime reads is run with it lowered
  (parity.models.onnx_source.runtime_error); one stamped with an ai.onnx opset newer than it reads
  is run with the stamp lowered when every node's op has the same definition at the newest opset it
  reads (the ops' since_version); otherwise it is SKIPPED naming the op version the runtime lacks;
- onnxruntime's own refusals of an op or type it has no kernel for (NOT_IMPLEMENTED, an unregistered
  op, "not supported") are UNSUPPORTED with its message; other session/run errors are INFER_FAIL.

At a dtype other than fp32, `exercised` says whether the op really computed at that precision: the
converted graph's outputs against the plain graph's (fp32) on the same inputs, and on the inputs
rounded to the dtype (parity.core.dtypes.SHOWS, the rule of parity.core.oracle.precision: rel_l2 >=
u/16 shows the rounding).
Imported by the suite workers only (onnx, onnxruntime, numpy)."""

from __future__ import annotations

import ctypes
import hashlib
import re
import time
from functools import lru_cache
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
from onnx import defs, helper, numpy_helper as nh

from parity.backends.runner import OpSkip
from parity.core import dtypes
from parity.models import onnx_weights
from parity.models import onnx_source
from parity.models.onnx_source import ORT_PREFIX

# the suite diff's verdict on these cases (parity.suites.diff): their tests' expected outputs are the truth
NO_ORACLE = "judged by tolerance against the test's expected outputs (no float64 run for ONNX model cases)"

STRING_NOTE = "string values compared exactly as 64-bit digests of their UTF-8 bytes"
# onnxruntime's own words for an op, type or attribute it has no kernel or schema for
UNSUPPORTED_RE = re.compile(r"NOT_IMPLEMENTED|is not a registered function/op|[Nn]ot supported|not implemented|"
                            r"Unrecognized attribute")
UNAVAILABLE_RE = re.compile(r"locale")  # a kernel needing what this machine lacks (StringNormalizer's locale)


def read_value(f: Path, tp):
    """A .pb of the graph value typed `tp` (onnx TypeProto): an ndarray, a list (sequence), None or an
    element (optional), a dict (map)."""
    kind = tp.WhichOneof("value") if tp is not None else "tensor_type"
    proto = {"sequence_type": onnx.SequenceProto, "optional_type": onnx.OptionalProto,
             "map_type": onnx.MapProto}.get(kind, onnx.TensorProto)()
    proto.ParseFromString(f.read_bytes())
    if kind == "sequence_type":
        return nh.to_list(proto)
    if kind == "optional_type":
        return nh.to_optional(proto)
    if kind == "map_type":
        return nh.to_dict(proto)
    return nh.to_array(proto)


def plain(a: np.ndarray) -> np.ndarray:
    """Types numpy stores natively; bfloat16 / float8 / float4 / int4 / int2 (ml_dtypes) as float32,
    which holds them exactly; strings as int64 digests (exact comparison)."""
    a = np.asarray(a)
    if a.dtype.kind in "OUS":
        return np.array([_digest(s) for s in a.ravel()], np.int64).reshape(a.shape)
    if a.dtype.kind in "biufc" and a.dtype.type.__module__ == "numpy":
        return a
    return a.astype(np.float32)


def _digest(s) -> int:
    b = s if isinstance(s, bytes) else str(s).encode("utf-8")
    return int.from_bytes(hashlib.blake2b(b, digest_size=8).digest(), "little", signed=True)


def flat(name: str, v, notes: set) -> list[tuple[str, np.ndarray]]:
    """A graph value as named numeric tensors: a sequence as its length and one tensor per element,
    an empty optional as a marker, strings as digests."""
    if v is None:
        return [(f"{name}:empty-optional", np.zeros((), np.int8))]
    if isinstance(v, dict):
        raise OpSkip("SKIPPED", f"graph value '{name}' is a map: parity compares tensors and sequences of them")
    if isinstance(v, (list, tuple)):
        out = [(f"{name}:len", np.array(len(v), np.int64))]
        for i, x in enumerate(v):
            out += flat(f"{name}[{i}]", x, notes)
        return out
    a = np.asarray(v)
    if a.dtype.kind in "OUS":
        notes.add(STRING_NOTE)
    return [(name, plain(a))]


def data_sets(folder: Path, m) -> list[tuple[list, list]]:
    """[(inputs, expected outputs)] per test_data_set_<k>, in k order, typed by the graph's values."""
    inits = {t.name for t in m.graph.initializer}
    vin = [i for i in m.graph.input if i.name not in inits]
    out = []
    for d in sorted(folder.glob("test_data_set_*"), key=lambda d: int(d.name.rsplit("_", 1)[1])):
        ins = sorted(d.glob("input_*.pb"), key=lambda f: int(f.stem.split("_")[1]))
        outs = sorted(d.glob("output_*.pb"), key=lambda f: int(f.stem.split("_")[1]))
        out.append(([read_value(f, vin[j].type if j < len(vin) else None) for j, f in enumerate(ins)],
                    [read_value(f, m.graph.output[j].type if j < len(m.graph.output) else None)
                     for j, f in enumerate(outs)]))
    if not out:
        raise OpSkip("INVALID", f"{folder}: no test_data_set_<k> folder (inputs and expected outputs)")
    return out


# ------------------------------------------------------------------------------ opset stamps
@lru_cache(maxsize=None)
def ort_max_opset(domain: str = "") -> int:
    """The newest opset of `domain` the installed onnxruntime loads (probed as onnx_source does)."""
    top = defs.onnx_opset_version() if domain == "" else 5
    return next((v for v in range(top, 0, -1) if onnx_source._probe([helper.make_opsetid(domain, v)], 8) is None), 0)


def _nodes(g):
    for n in g.node:
        yield n
        for sub in onnx_weights.subgraphs(n):
            yield from _nodes(sub)


def lower_opset(m) -> str | None:
    """A model stamped with an ai.onnx opset newer than onnxruntime reads, whose every ai.onnx node has
    the same definition at the newest opset it reads (the op's since_version at the stamp is not newer),
    is restamped to that opset in place: the returned note says so. None when the stamp loads as it is;
    OpSkip SKIPPED naming the op versions the runtime lacks otherwise."""
    stamp = next((o for o in m.opset_import if o.domain in ("", "ai.onnx")), None)
    top = ort_max_opset("")
    if stamp is None or stamp.version <= top:
        return None
    newer = set()
    nodes = [*_nodes(m.graph), *(n for f in m.functions for n in f.node)]
    for n in nodes:
        if n.domain not in ("", "ai.onnx"):
            continue
        try:
            since = defs.get_schema(n.op_type, stamp.version, "").since_version
        except Exception:  # not an ai.onnx op at that opset: leave the runtime to say so
            continue
        if since > top:
            newer.add(f"{n.op_type}-{since}")
    if newer:
        raise OpSkip("SKIPPED", f"opset ai.onnx {stamp.version}: {', '.join(sorted(newer))} is newer than the "
                                f"installed onnxruntime {ort.__version__} implements (ai.onnx opset <= {top})")
    was = stamp.version
    stamp.version = top
    return (f"ai.onnx opset {was} lowered to {top}: onnxruntime {ort.__version__} reads opset <= {top} and every "
            f"op of the graph has the same definition there")


# ------------------------------------------------------------------------------ feeds and runs
def _exotic(elem_type: int) -> bool:
    """An element type onnxruntime's numpy feed/fetch cannot take (bfloat16, float8, float4, int4, int2)."""
    try:
        return helper.tensor_dtype_to_np_dtype(elem_type).type.__module__ != "numpy"
    except Exception:
        return False


def raw_values(m) -> bool:
    """Whether the graph's inputs or outputs hold a type that must go through raw OrtValues."""
    vals = [*m.graph.input, *m.graph.output]
    return any(v.type.HasField("tensor_type") and _exotic(v.type.tensor_type.elem_type) for v in vals)


def ort_value(a, elem_type: int):
    """An OrtValue of ONNX element type `elem_type` holding `a` (its raw ONNX data: packed 4/2-bit)."""
    a = np.asarray(a)
    if not _exotic(elem_type):
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a))
    raw = nh.from_array(a).raw_data
    v = ort.OrtValue.ortvalue_from_shape_and_type(list(a.shape), elem_type)
    if len(raw) != v.tensor_size_in_bytes():
        raise ValueError(f"{a.dtype}: {len(raw)} bytes of ONNX data for {v.tensor_size_in_bytes()} in onnxruntime")
    ctypes.memmove(v.data_ptr(), raw, len(raw))
    return v


def from_ort_value(v, elem_type: int) -> np.ndarray:
    """An OrtValue's tensor as numpy (an exotic type read back from its raw bytes, as ml_dtypes)."""
    if not _exotic(elem_type):
        return v.numpy()

    raw = ctypes.string_at(v.data_ptr(), v.tensor_size_in_bytes())
    return nh.to_array(helper.make_tensor("v", elem_type, v.shape(), raw, raw=True))


def run_session(sess, m, names: list[str], ins: list, raw: bool) -> list:
    """The session's outputs for one data set: numpy feeds, or raw OrtValues when `raw`."""
    if not raw:
        return sess.run(None, {n: v for n, v in zip(names, ins)})
    types = {v.name: v.type.tensor_type.elem_type for v in [*m.graph.input, *m.graph.output]}
    feeds = {n: ort_value(v, types[n]) for n, v in zip(names, ins)}
    outs = sess.run_with_ort_values(None, feeds)
    return [from_ort_value(v, types[o.name]) for v, o in zip(outs, m.graph.output)]


def refused(e: BaseException, what: str) -> OpSkip:
    """onnxruntime's error as a case status: UNSUPPORTED when the runtime says it has no kernel, schema
    or support for the op, type or attribute (its own words), UNAVAILABLE when the machine lacks what
    the kernel needs (a locale), INFER_FAIL otherwise."""
    msg = _first(e)
    if UNAVAILABLE_RE.search(msg):
        return OpSkip("UNAVAILABLE", f"onnxruntime {what}: this machine lacks what the kernel needs: {msg}")
    if UNSUPPORTED_RE.search(msg):
        return OpSkip("UNSUPPORTED", f"onnxruntime {ort.__version__} {what}: {msg}")
    return OpSkip("INFER_FAIL", f"onnxruntime {what}: {msg}")


def _first(e: BaseException) -> str:
    return f"{type(e).__name__}: " + ORT_PREFIX.sub("", (str(e).strip().splitlines() or [""])[0])


# ------------------------------------------------------------------------------ exercised
def _rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    keep = np.isfinite(a64) & np.isfinite(b64)
    den = float(np.sqrt(np.sum(b64[keep] ** 2)))
    num = float(np.sqrt(np.sum((a64[keep] - b64[keep]) ** 2)))
    return num / den if den else (0.0 if num == 0 else float("inf"))


def exercised(fmt: str, got: list, plain32: list, rounded32: list) -> dict | None:
    """Did the converted graph compute at `fmt` (torch dtype name)? got: its float outputs; plain32: the
    plain graph's on the same inputs; rounded32: the plain graph's on the inputs rounded to fmt, its
    outputs rounded to fmt. `exercised`: True (computed at fmt), False (fp32 kernels), None (cannot
    tell: only the storage rounding shows, as an fp32 kernel between casts or an exactly rounded op
    gives). None without float outputs."""
    f = dtypes.reduced(fmt)
    pairs = [(g, p, r) for g, p, r in zip(got, plain32, rounded32) if g.dtype.kind == "f" and g.size]
    if f is None or not pairs:
        return None
    u, label = f.u, f.name
    rel = max(_rel_l2(g, p) for g, p, _ in pairs)
    rel_r = max(_rel_l2(r, p) for _, p, r in pairs)  # what rounding to the format alone does here
    if rel_r < u * dtypes.SHOWS or all(np.array_equal(r, p, equal_nan=True) for _, p, r in pairs):
        how, ex = (f"values the {label} rounding leaves unchanged (the fp32 graph on {label}-rounded inputs, "
                   f"rounded: rel_l2 {rel_r:.2g} < u/16): cannot tell"), None
    elif all(np.array_equal(g, p, equal_nan=True) for g, p, _ in pairs):
        how, ex = f"outputs bit-identical to the fp32 graph's: onnxruntime ran fp32 kernels ({label} not exercised)", False
    elif rel < u * dtypes.SHOWS:
        how, ex = (f"outputs within fp32 noise of the fp32 graph's (rel_l2 {rel:.2g} < u/16 = {u * dtypes.SHOWS:.2g}): "
                   f"{label} not exercised"), False
    elif all(np.array_equal(g, r, equal_nan=True) for g, _, r in pairs):
        how, ex = (f"{label} storage only: outputs equal the fp32 graph's on {label}-rounded inputs, rounded to "
                   f"{label} (an fp32 kernel between casts, or an op exact at both: cannot tell)"), None
    else:
        how, ex = (f"{label} compute: outputs differ from the fp32 graph's on the same {label}-rounded values "
                   f"(rel_l2 vs fp32 {rel:.2g} >= u/16 = {u * dtypes.SHOWS:.2g})"), True
    return {"format": label, "exercised": ex, "rel_l2_vs_fp32": rel if np.isfinite(rel) else None, "evidence": how}


def _round_to(a, fmt: str):
    a = np.asarray(a)
    if a.dtype != np.float32:
        return a
    if fmt == "bfloat16":
        return a.astype(ml_dtypes.bfloat16).astype(np.float32)
    return a.astype(np.float16).astype(np.float32) if fmt == "float16" else a


def check_exercised(runner, m, names, ins, got, fmt: str) -> dict | None:
    """exercised() of one data set: the plain graph run on the same and on the rounded inputs."""
    sess = runner._session(None, m.SerializeToString())
    plain32 = sess.run(None, dict(zip(names, ins)))
    rounded = sess.run(None, {n: _round_to(v, fmt) for n, v in zip(names, ins)})
    return exercised(fmt, [np.asarray(g) for g in got], [np.asarray(p) for p in plain32],
                     [_round_to(r, fmt) for r in rounded])


# ------------------------------------------------------------------------------ the case
def _stamps(m, folder: Path, cid: str) -> list[str]:
    """Notes of the stamps lowered so the installed onnxruntime reads the file (OpSkip SKIPPED if not)."""
    notes = [n for n in [lower_opset(m)] if n]
    try:
        ir = onnx_source.runtime_error(m, folder / "model.onnx", f"case {cid}")
    except onnx_source.OnnxSourceError as e:
        raise OpSkip("SKIPPED", str(e).split(": ", 2)[-1]) from None
    return notes + ([ir] if ir else [])


def _sessions(runner, m, dtype: str):
    """(session on the graph prepared for the cell's dtype, whether feeds go as raw OrtValues)."""
    try:
        model = runner.prepared(m)
    except Exception as e:
        raise OpSkip("EXPORT_FAIL", f"conversion to {dtype}: {type(e).__name__}: {e}") from None
    try:
        sess = runner._session(None, model)
    except Exception as e:
        raise refused(e, "session" + ("" if dtype == "float32" else f" (converted to {dtype})")) from None
    return sess, raw_values(m)


def run(case: dict, cell: dict, runner_class, runner_for) -> dict:
    """Run one `onnx` case on the cell's provider: a result dict as parity.suites.execute returns."""
    cls = runner_class(cell)
    if not cls.onnx_based or not hasattr(cls, "prepared"):
        return {"status": "UNSUPPORTED", "reason": f"an ONNX model case runs on ONNX-based providers only; "
                                                   f"{cell['provider']} ({cls.__name__}) runs torch"}
    runner = runner_for(cell)
    if getattr(runner.job, "dtype_cfg", None) is None:  # what `prepared` converts by, as in a model cell
        runner.job.dtype_cfg = {"torch": cell["torch_dtype"], "mode": "cast"}
    folder, dtype = Path(case["onnx"]["path"]), cell["torch_dtype"]
    m = onnx.load(str(folder / "model.onnx"))
    notes = _stamps(m, folder, case["id"])
    sets = data_sets(folder, m)
    for k, (_, want) in enumerate(sets):
        if len(want) != len(m.graph.output):
            raise OpSkip("INVALID", f"test_data_set_{k} has {len(want)} expected outputs for the graph's "
                                    f"{len(m.graph.output)}: the test cannot judge every output")
    inits = {t.name for t in m.graph.initializer}
    names = [i.name for i in m.graph.input if i.name not in inits]
    outs = [o.name for o in m.graph.output]
    sess, raw = _sessions(runner, m, dtype)
    res = {"status": "OK", "reason": "", "outputs": [], "reference": [], "onnx_ops": sorted({n.op_type for n in m.graph.node}),
           "oracle_note": NO_ORACLE}
    ms, found, ex = [], set(), None
    for k, (ins, want) in enumerate(sets):
        sfx = f"#s{k}" if k else ""
        t0 = time.perf_counter()
        try:
            got = run_session(sess, m, names[:len(ins)], ins, raw)
        except Exception as e:
            raise refused(e, "run") from None
        ms.append((time.perf_counter() - t0) * 1e3)
        for name, g, w in zip(outs, got, want):
            res["outputs"] += flat(f"out:{name}{sfx}", g, found)
            res["reference"] += flat(f"out:{name}{sfx}", w, found)
        if k == 0 and dtype != "float32" and not raw and all(isinstance(v, np.ndarray) for v in [*ins, *got]):
            ex = check_exercised(runner, m, names[:len(ins)], ins, got, dtype)
    notes += sorted(found)
    res["latency_ms"], res["ref_latency_ms"] = float(np.median(ms)), None
    return {**res, **({"note": "; ".join(notes)} if notes else {}), **({"exercised": ex} if ex else {})}
