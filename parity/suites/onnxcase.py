"""Suite cases of kind `onnx`: a whole ONNX model with its inputs and expected outputs, in the layout of
ONNX's backend tests (a folder with `model.onnx` and `test_data_set_<k>/{input,output}_<j>.pb`):

    - {id: test_relu, onnx: {path: data/onnx/onnx_node/test_relu, op: Relu}}

The provider runs the file through its runner (Runner.onnx_based: the same options and session
settings as in the model pipeline; `prepared` converts it to the cell's dtype as the model pipeline
does, fp16 keeping float32 inputs and outputs); the reference is the test's expected outputs (one
sample per data set), and the case is judged against them by tolerance, not by the fp64 oracle
(a conformance test's expected outputs are its truth; its `oracle_note` says so). A file stamped with an opset the installed onnxruntime cannot read is SKIPPED
with onnxruntime's reason; one stamped only with a newer IR version is run with it lowered
(parity.pipeline.onnx_source.runtime_error) and says so in its note. Inputs or outputs that are not
tensors (sequences, optionals, maps) or hold strings are SKIPPED, saying so: the tensor store and the
diff compare numeric tensors (a limit of parity, not of the provider). Imported by the suite workers only (onnx, onnxruntime, numpy)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from parity.backends.base import OpSkip

# the suite diff's verdict on these cases (parity.suites.diff): their tests' expected outputs are the truth
NO_ORACLE = "judged by tolerance against the test's expected outputs (no float64 run for ONNX model cases)"


def read_pb(f: Path):
    """A TensorProto .pb as a numpy array; OpSkip UNSUPPORTED for sequences/optionals/maps/strings."""
    import onnx
    from onnx import numpy_helper

    data = f.read_bytes()
    t = onnx.TensorProto()
    t.ParseFromString(data)
    if t.data_type == 0 or t.data_type == onnx.TensorProto.STRING:
        what = "a string tensor" if t.data_type == onnx.TensorProto.STRING else "not a tensor (a sequence, optional or map)"
        raise OpSkip("UNSUPPORTED", f"{f.parent.name}/{f.name} is {what}: parity compares numeric tensors")
    return numpy_helper.to_array(t)


def plain(a: np.ndarray) -> np.ndarray:
    """Types numpy stores natively; bfloat16 / float8 / int4 (ml_dtypes) as float32, which holds them
    exactly."""
    a = np.asarray(a)
    if a.dtype.kind in "biufc" and a.dtype.type.__module__ == "numpy":
        return a
    return a.astype(np.float32)


def data_sets(folder: Path) -> list[tuple[list, list]]:
    """[(inputs, expected outputs)] per test_data_set_<k>, in k order."""
    out = []
    for d in sorted(folder.glob("test_data_set_*"), key=lambda d: int(d.name.rsplit("_", 1)[1])):
        ins = sorted(d.glob("input_*.pb"), key=lambda f: int(f.stem.split("_")[1]))
        outs = sorted(d.glob("output_*.pb"), key=lambda f: int(f.stem.split("_")[1]))
        out.append(([read_pb(f) for f in ins], [read_pb(f) for f in outs]))
    if not out:
        raise OpSkip("INVALID", f"{folder}: no test_data_set_<k> folder (inputs and expected outputs)")
    return out


def run(case: dict, cell: dict, runner_class, runner_for) -> dict:
    """Run one `onnx` case on the cell's provider: a result dict as parity.suites.execute returns."""
    import onnx

    from parity.pipeline import onnx_source

    cls = runner_class(cell)
    if not cls.onnx_based or not hasattr(cls, "prepared"):
        return {"status": "UNSUPPORTED", "reason": f"an ONNX model case runs on ONNX-based providers only; "
                                                   f"{cell['provider']} ({cls.__name__}) runs torch"}
    runner = runner_for(cell)
    if getattr(runner.job, "dtype_cfg", None) is None:  # what `prepared` converts by, as in a model cell
        runner.job.dtype_cfg = {"torch": cell["torch_dtype"], "mode": "cast"}
    folder = Path(case["onnx"]["path"])
    m = onnx.load(str(folder / "model.onnx"))
    inits = {t.name for t in m.graph.initializer}
    for v in [*(i for i in m.graph.input if i.name not in inits), *m.graph.output]:
        if not v.type.HasField("tensor_type") or v.type.tensor_type.elem_type == onnx.TensorProto.STRING:
            what = "a string tensor" if v.type.HasField("tensor_type") else "not a tensor (a sequence, optional or map)"
            return {"status": "SKIPPED", "reason": f"graph value '{v.name}' is {what}: parity compares numeric tensors"}
    try:
        note = onnx_source.runtime_error(m, folder / "model.onnx", f"case {case['id']}")
    except onnx_source.OnnxSourceError as e:
        return {"status": "SKIPPED", "reason": str(e).split(": ", 2)[-1]}
    sets = data_sets(folder)
    for j, a in enumerate(sets[0][0]):
        if plain(a) is not a:  # bfloat16, float8, int4/int2 (ml_dtypes)
            return {"status": "SKIPPED", "reason": f"input {j} is {a.dtype}: onnxruntime's Python API takes no "
                                                   f"numpy array of that type (a limit of the runtime's feed)"}
    names = [i.name for i in m.graph.input if i.name not in inits]
    outs = [o.name for o in m.graph.output]
    ops = sorted({n.op_type for n in m.graph.node})
    try:
        model = runner.prepared(m)
    except Exception as e:
        raise OpSkip("EXPORT_FAIL", f"conversion to {cell['torch_dtype']}: {type(e).__name__}: {e}") from None
    try:
        sess = runner._session(None, model)
    except Exception as e:
        conv = "" if cell["torch_dtype"] == "float32" else f" (converted to {cell['torch_dtype']})"
        raise OpSkip("INFER_FAIL", f"onnxruntime session{conv}: " + _first(e)) from None
    res = {"status": "OK", "reason": "", "outputs": [], "reference": [], "onnx_ops": ops, "oracle_note": NO_ORACLE,
           **({"note": note} if note else {})}
    ms = []
    for k, (ins, want) in enumerate(sets):
        sfx = f"#s{k}" if k else ""
        feeds = dict(zip(names, ins))
        t0 = time.perf_counter()
        try:
            got = sess.run(None, feeds)
        except Exception as e:
            raise OpSkip("INFER_FAIL", "onnxruntime run: " + _first(e)) from None
        ms.append((time.perf_counter() - t0) * 1e3)
        for name, g, w in zip(outs, got, want):
            res["outputs"].append((f"out:{name}{sfx}", plain(g)))
            res["reference"].append((f"out:{name}{sfx}", plain(w)))
    res["latency_ms"], res["ref_latency_ms"] = float(np.median(ms)), None
    return res


def _first(e: BaseException) -> str:
    from parity.pipeline.onnx_source import ORT_PREFIX

    return f"{type(e).__name__}: " + ORT_PREFIX.sub("", (str(e).strip().splitlines() or [""])[0])
