"""The fp64 golden run of a graph given as an ONNX file (the oracle's yardstick, issue 9), node by node.

The ONNX reference evaluator (numpy) runs the graph cast to float64 (onnx_source.to_float64: the
main graph, every If/Loop/Scan body and every model-local function); onnxruntime cannot, having no
float64 Conv, GlobalAveragePool or Erf kernel. The evaluator's own loop is replaced by one here
(`Golden.run`, the same steps: each node on its inputs and, for a node with subgraphs, every value
computed so far as the outer scope its bodies read), so that a node it cannot run does not cost the
whole golden run. Such a node falls back, alone:

1. onnxruntime on that node at float64 (exact where it has the float64 kernel: MatMul, Relu,
   BatchNormalization, ...);
2. onnxruntime on the file's own float32 node, its floating inputs cast down to float32 and its
   outputs back up to float64;
3. the evaluator on that float32 node.

A node "cannot run" when the evaluator lacks it (a custom domain, com.microsoft contrib ops), raises
(an AxisError, a type it has no implementation for), or, checked against the fp32 reference
(onnxruntime, unfused; `ref`), cannot be right: an output of another shape (the evaluator's
GlobalMaxPool drops a 3-D input's last axis, which a tf2onnx graph's Squeeze then fails on), or
values that leave the reference (rel_l2 > DIVERGE on SAMPLE strided values, 10x more than the node's
inputs did) where onnxruntime alone, on the same inputs, disagrees with the evaluator beyond the op's
scale. A real fp32 breakage leaves the reference while both agree on the same inputs: it stays (a
saturated sigmoid: onnxruntime's ~1e-7 absolute error on 4e-8 outputs). The evaluator's
BatchNormalization of opsets 9-13 computes training mode whenever `momentum` is set (Paddle2ONNX sets
it): _BatchNormInference replaces it. Every node that fell back is recorded (`Golden.fell`: node,
op, how it ran, why); the reference stage writes that into fp64.parquet's metadata, which the diff's
verdict reason repeats. When no way works, GoldenError says which node and why.

With `conditions=True`, each node that sums products (SUMS: Conv, ConvTranspose, MatMul, Gemm) run by
the float64 evaluator also runs on the absolute values of its inputs: sum_k |w_k x_k| per output, the
magnitude of the products it sums. `Golden.conditions()` gives, per output, rms of that magnitude over
rms of the output (over every sample): the summation's condition number kappa. A rounding of the
operands by u leaves a relative error of at most ~2 u kappa in the result, so where kappa >> 1 (a
band-pass filter on audio far louder than its pass band: basic-pitch's constant-Q transform, kappa
~100) a narrow format's error is amplified kappa times, in every backend alike: cancellation
(parity.analysis.cancellation names it at the drift origin). Cost: one more evaluation of those nodes.

Cost: the common case is the evaluator's own loop plus a shape and a SAMPLE-value comparison per
reference value (PP-OCRv4's detector, 96x96, 331 values: 0.79-1.14 s of CPU against 0.72-0.84 s for
the evaluator's own run, at load 8); onnxruntime sessions are made only for the nodes checked or
falling back, once per node, and reused for every sample.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator, op_run
from onnx.reference.ops.op_batch_normalization import BatchNormalization_9, _batchnorm_test_mode

from parity.models.onnx_source import implicit_inputs

ORT64, ORT32, EVAL32 = "onnxruntime float64", "onnxruntime float32", "evaluator float32"
SUMS = ("Conv", "ConvTranspose", "MatMul", "Gemm")  # nodes whose outputs are sums of products


class GoldenError(RuntimeError):
    """No way found to run one node of the graph, in float64 or float32: the message names it."""


class _Unloadable:
    """Stands in for a node the evaluator has no implementation of: raises when run (so that node
    falls back), instead of failing the evaluator's construction for the whole graph."""

    has_linked_attribute = False

    def __init__(self, node, error: Exception):
        self.onnx_node, self.error = node, error
        self.op_type, self.input, self.output = node.op_type, list(node.input), list(node.output)

    def need_context(self) -> bool:
        return False

    def run(self, *args, **kwargs):
        raise RuntimeError(f"no implementation in the ONNX reference evaluator: {one_line(self.error)}")


class _BatchNormInference(BatchNormalization_9):
    """BatchNormalization of opsets 9-13 with one output: inference, on the running mean and variance.
    The evaluator's own (onnx 1.23) computes training mode whenever `momentum` is set, as Paddle2ONNX
    writes it: batch statistics mixed in, 3.6e-2 rel_l2 from onnxruntime on PP-OCRv4's detector."""

    def _run(self, x, scale, bias, mean, var, epsilon=None, **kwargs):  # noqa: ARG002  momentum: training only
        return (_batchnorm_test_mode(x, scale, bias, mean, var, epsilon=epsilon),)


class _Lenient(ReferenceEvaluator):
    """The ONNX reference evaluator, where a node without an implementation is _Unloadable (subgraph
    evaluators are of this class too: the evaluator makes them with its own class), and
    BatchNormalization-9 in inference is _BatchNormInference."""

    def _load_impl(self, node, input_types=None):
        if node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx") and \
                9 <= self.opsets.get(node.domain, 0) <= 13 and len([o for o in node.output if o]) == 1:
            return _BatchNormInference
        try:
            return super()._load_impl(node, input_types)
        except op_run.RuntimeContextError:
            if input_types is None:  # the evaluator retries with the input types (its _init)
                raise
            return lambda n, run_params: _Unloadable(n, RuntimeError("a context-dependent function"))
        except Exception as e:  # noqa: BLE001  unknown domain or op, no implementation: that node falls back
            return lambda n, run_params, err=e: _Unloadable(n, err)


def one_line(e: Exception) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300] if text else ''}"


class Golden:
    """The float64 run of `m64` (onnx_source.to_float64 of `m32`, the graph as the file computes it:
    same nodes, same order), node by node with fallbacks (module docstring)."""

    def __init__(self, m32, m64, conditions: bool = False):
        self.m32, self.m64 = m32, m64
        self._cond: dict[str, list[float]] | None = {} if conditions else None  # output -> [sum |w x|^2, sum y^2]
        self.ev = _Lenient(m64)
        self.nodes32 = list(m32.graph.node)
        self.fell: dict[int, dict] = {}      # node index -> {node, op, ran, why}, first sample's reason
        self._sessions: dict = {}            # (node index, how) -> onnxruntime session or evaluator

    def run(self, feeds: dict, ref: dict | None = None) -> dict:
        """Every value of the graph for one sample ({name: array}). `ref`: {name: array} of the fp32
        reference (onnxruntime, unfused), which a node's outputs are checked against (_checked)."""
        results = {"": None, **self.ev.rt_inits_, **feeds}
        rel: dict[str, float] = {}  # rel_l2 of each checked value to the reference: where divergence starts
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # exp overflow in a saturated sigmoid: IEEE's inf is right
            for idx, node in enumerate(self.ev.rt_nodes_):
                proto, outs, err = node.onnx_node, None, None
                if idx not in self.fell:
                    try:
                        args = [results[i] for i in proto.input]
                        outs = node.run(*args, context=results) if node.need_context() else node.run(*args)
                        self._checked(idx, outs, results, ref, rel)
                        self._magnitude(node, args, outs)
                    except Exception as e:  # noqa: BLE001  whatever the evaluator raises: this node falls back
                        outs, err = None, e
                if outs is None:
                    outs = self._fallback(idx, results, ref, err)
                for name, v in zip(proto.output, outs):
                    if name:
                        results[name] = v
        return results

    def _magnitude(self, node, args: list, outs) -> None:
        """Sums of squares of the node's outputs and of the same node on |inputs| (module docstring)."""
        proto = node.onnx_node
        if self._cond is None or proto.op_type not in SUMS or proto.domain not in ("", "ai.onnx"):
            return
        absed = [np.abs(a) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in args]
        try:
            mags = node.run(*absed)
        except Exception:  # noqa: BLE001  evidence only: the node's own values stand, its kappa is unknown
            return
        for name, y, mag in zip(proto.output, outs, mags):
            y, mag = np.asarray(y, np.float64), np.abs(np.asarray(mag, np.float64))
            if name and y.size and np.isfinite(y).all() and np.isfinite(mag).all():
                acc = self._cond.setdefault(name, [0.0, 0.0])
                acc[0] += float(np.vdot(mag.ravel(), mag.ravel()))
                acc[1] += float(np.vdot(y.ravel(), y.ravel()))

    def conditions(self) -> dict[str, float]:
        """{output: kappa = rms(sum |w x|) / rms(sum w x)} of the SUMS nodes run so far (module
        docstring); an output that is all zero has none."""
        return {k: float(np.sqrt(m / y)) for k, (m, y) in (self._cond or {}).items() if y > 0}

    def _checked(self, idx: int, outs, results: dict, ref: dict | None, rel: dict) -> None:
        """Raise when the evaluator's outputs of node `idx` cannot be right: a shape other than the
        reference's, or values that leave the reference (rel_l2 > DIVERGE, 10x more than its inputs
        did) where onnxruntime alone, on the same inputs rounded to float32, disagrees with the
        evaluator on them too (the evaluator's BatchNormalization-9 read `momentum` as training mode)."""
        if not ref:
            return
        node = self.ev.rt_nodes_[idx]
        proto = node.onnx_node
        _shapes(proto, outs, ref)
        for name, v in zip(proto.output, outs):
            if name not in ref:
                continue
            rel[name] = r = _rel(*_sample(v, ref[name]))
            upstream = max((rel.get(i, 0.0) for i in proto.input), default=0.0)
            if r <= DIVERGE or r <= 10 * upstream or node.need_context():
                continue
            vals = {i: _down(results[i]) for i in dict.fromkeys(x for x in proto.input if x)}
            try:
                theirs = self._run_alone(idx, ORT32, self.nodes32[idx], vals)
            except Exception:  # noqa: BLE001  onnxruntime cannot check it: the evaluator's values stand
                return
            mine = node.run(*[_up(vals[i]) if i else None for i in proto.input])
            scale = max((_rms(v) for v in vals.values() if isinstance(v, np.ndarray) and v.dtype.kind == "f"),
                        default=0.0)
            for a, b, o in zip(mine, theirs, proto.output):
                d = _rms(np.asarray(a, np.float64) - _up(b))
                if not d <= DIVERGE * max(_rms(b), scale):  # relative to the op's scale: a saturated
                    raise ValueError(  # sigmoid's ~1e-7 absolute error on 4e-8 outputs is onnxruntime's
                        f"output '{o}': the evaluator and onnxruntime differ on the same inputs (rms {d:.3g} "
                        f"of {_rms(b):.3g}; rel_l2 {r:.3g} from the fp32 reference)")
            return

    def _fallback(self, idx: int, results: dict, ref: dict | None, err: Exception | None) -> list:
        """Node `idx` run alone (module docstring: 1-3), the way that worked before first."""
        n64, n32 = self.ev.rt_nodes_[idx].onnx_node, self.nodes32[idx]
        tried = [ORT64, ORT32, EVAL32]
        if idx in self.fell:
            tried.remove(self.fell[idx]["ran"])
            tried.insert(0, self.fell[idx]["ran"])
        errors = []
        for how in tried:
            node = n64 if how == ORT64 else n32
            vals = {i: results[i] for i in dict.fromkeys(i for i in [*node.input, *implicit_inputs(node)] if i)}
            if how != ORT64:
                vals = {k: _down(v) for k, v in vals.items()}
            try:
                outs = self._run_alone(idx, how, node, vals)
                if ref:
                    _shapes(node, outs, ref)
            except Exception as e:  # noqa: BLE001  the next way is tried; all of them are named if none works
                errors.append(f"{how}: {one_line(e)}")
                continue
            if idx not in self.fell:
                self.fell[idx] = {"node": n64.name or n64.output[0], "op": n64.op_type, "ran": how,
                                  "why": one_line(err) if err is not None else ""}
            return [_up(o) for o in outs] if how != ORT64 else list(outs)
        first = f"float64 evaluator: {one_line(err)}; " if err is not None else ""
        raise GoldenError(f"node '{n64.name or n64.output[0]}' ({n64.op_type}) runs in no way tried: "
                          f"{first}{'; '.join(errors)}")

    def _run_alone(self, idx: int, how: str, node, vals: dict) -> list:
        key = (idx, how)
        if how == EVAL32:
            if key not in self._sessions:
                self._sessions[key] = ReferenceEvaluator(self._one_node(node, vals, how))
            return self._sessions[key].run(None, vals)
        # lazy: onnxruntime (+0.1 s) only for a graph with a node the evaluator cannot run
        import onnxruntime as ort

        if key not in self._sessions:
            so = ort.SessionOptions()
            so.log_severity_level = 4  # a node that fails is reported by the exception
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            so.intra_op_num_threads = 1
            self._sessions[key] = ort.InferenceSession(self._one_node(node, vals, how).SerializeToString(), so,
                                                       providers=["CPUExecutionProvider"])
        return self._sessions[key].run(None, {k: np.asarray(v) for k, v in vals.items()})

    def _one_node(self, node, vals: dict, how: str):
        """A model of `node` alone: its inputs (and the outer-scope values its bodies read) are graph
        inputs typed as the values given (no shapes: samples may differ), its outputs untyped."""
        ins = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), None)
               for k, v in vals.items()]
        outs = [onnx.ValueInfoProto(name=o) for o in node.output if o]
        g = helper.make_graph([node], "parity_fp64_node", ins, outs)
        m = self.m64 if how == ORT64 else self.m32  # the opsets and model-local functions of its graph
        return helper.make_model(g, opset_imports=list(m.opset_import), ir_version=m.ir_version,
                                 functions=list(m.functions))


DIVERGE = 1e-3  # rel_l2 from the fp32 reference past which a node's float64 output is checked


def _shapes(node, outs, ref: dict) -> None:
    """An output whose shape differs from the fp32 reference's: the evaluator computed something else."""
    for name, v in zip(node.output, outs):
        want = ref.get(name)
        if want is not None and tuple(np.shape(v)) != tuple(want.shape):
            raise ValueError(f"output '{name}' has shape {tuple(np.shape(v))} where onnxruntime's float32 "
                             f"reference has {tuple(want.shape)}")


SAMPLE = 4096  # values of each output compared with the reference (evenly strided): the check's cost


def _sample(a, b) -> tuple:
    """At most SAMPLE values of a and of b at the same places (flat, evenly strided)."""
    a, b = np.asarray(a).ravel(), np.asarray(b).ravel()
    step = max(1, a.size // SAMPLE)
    return a[::step], b[::step]


def _rms(a) -> float:
    a = np.asarray(a, np.float64)
    return float(np.sqrt(np.mean(np.square(a)))) if a.size else 0.0


def _rel(a, b) -> float:
    """rel_l2 of a against b (0 for two empty or two zero tensors; inf where a is not finite but b is)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.size == 0:
        return 0.0
    d, n = float(np.linalg.norm((a - b).ravel())), float(np.linalg.norm(b.ravel()))
    if not np.isfinite(d):
        return float("inf") if np.isfinite(b).all() else 0.0
    return d / n if n else (0.0 if d == 0 else float("inf"))


def _down(v):
    return v.astype(np.float32) if isinstance(v, np.ndarray) and v.dtype == np.float64 else v


def _up(v):
    v = np.asarray(v)
    return v.astype(np.float64) if v.dtype == np.float32 else v


def describe(fell: list[dict]) -> str:
    """One sentence naming the nodes that did not run in the float64 evaluator, and how they ran."""
    parts = [f"'{r['node']}' ({r['op']}) ran on {r['ran']}" + (f" ({r['why']})" if r["why"] else "")
             for r in fell]
    n = len(fell)
    return f"fp64 golden: {n} node{'s' if n != 1 else ''} not run by the float64 evaluator: " + "; ".join(parts)
