"""ONNX Runtime CPUExecutionProvider. fp32 runs the exported graphs as they are; fp16 converts them
with onnxruntime.transformers.float16 (weights and compute in fp16, graph inputs/outputs kept fp32
through Cast nodes). Never imports torch, except in run_op (suites: the op is exported with torch).

Options (conf/providers/<p>.yaml `options:`), shared by every ORT provider:
  graph_optimization_level  disabled | basic | extended | all (ort_cpu_noopt: disabled)
  provider_options          the execution provider's options (e.g. device_id, trt_fp16_enable)
  fallback                  further execution providers, in order (default: none, so a node the EP
                            cannot take fails the session instead of silently running elsewhere)

Own error (infer_own): one more session, on the cut graph of layers.onnx (parity.models.onnx_cut:
each leaf fed from the reference's input to it, the ops between leaves from the reference's leaf
outputs), converted like layers.onnx (fp16: same conversion, fp32 I/O), built at the first sample.
`own_source` (a weightless ModelProto whose external data is in the model directory) replaces
layers.onnx there: parity.analysis.torch_reduce cuts the plain graph with its leaf outputs added.

Runner.mixed (the mixed-precision plan): the plain graph converted with chosen nodes left in float32
(convert_float_to_float16's node_block_list; ort_int8: the quantizer's nodes_to_exclude).
"""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, numpy_helper

from parity.backends import fault
from parity.core import dtypes, modelfiles, store
from parity.backends.runner import OpSkip, Runner, SessionError, Unavailable, interleave
from parity.models import onnx_cut, onnx_weights, torchlib_table
from parity.models.onnx_weights import Converted

OPT_LEVELS = {"disabled": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
              "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


class OrtRunner(Runner):
    ep = "CPUExecutionProvider"
    onnx_based = True
    options_schema = {"graph_optimization_level": ("disabled", "basic", "extended", "all"),
                      "provider_options": "mapping", "fallback": "list",
                      "fault": "fault"}  # diagnostic: emulate a miscompiled node (parity.backends.fault)

    @classmethod
    def settings(cls, job) -> dict:
        """At fp16, the parameters fp16 cannot hold (range_scan), from the graph's values alone: the
        diff names them as the cause of the layer that reads them (parity.analysis.causes.param_range)."""
        if job.dtype_cfg.get("torch") != "float16":
            return {}
        found = range_scan(Path(job.model_dir) / "model.onnx", "fp16")
        return {"range": found} if found else {}

    @classmethod
    def availability(cls, job):
        try:
            import onnxruntime as ort  # optional: a missing onnxruntime is an UNAVAILABLE status
        except ImportError as e:
            return f"onnxruntime is not installed ({e})"
        if cls.ep not in ort.get_available_providers():
            hint = "" if cls.ep == "CPUExecutionProvider" else " (it needs onnxruntime-gpu and an NVIDIA GPU)"
            return f"{cls.ep} is not among onnxruntime's providers {ort.get_available_providers()}{hint}"
        return None

    def _torch_dtype(self) -> str:
        """The cell's element type (dtypes.<d>.torch), whatever the conf dtype is called."""
        return self.job.dtype_cfg.get("torch", "float32")

    def _fault(self) -> dict | None:
        """options.fault (parity.backends.fault): a diagnostic fault injected into every graph run."""
        return (self.job.provider_cfg.get("options") or {}).get("fault")

    def _convert(self, path) -> tuple[str | bytes, Path | None]:
        """(the graph at `path` for the cell's dtype as onnxruntime takes it, the folder of its external
        data): fp32 is the file as it is, passed by path (onnxruntime reads weights.bin beside it,
        memory-mapped; nothing is loaded here); fp16 is the weightless graph converted and serialised,
        its weights converted one tensor at a time into this runner's temp weights file
        (parity.models.onnx_weights). With options.fault, the fault is applied first. A ModelProto
        (reduce, the own-error cut) is converted in place; its external data is in the model directory.
        The folder is None when the graph has no external data (or is a path)."""
        m = None
        if not isinstance(path, (str, Path)):  # a ModelProto in memory
            m, path = path, None
        torch_dtype = self._torch_dtype()
        if torch_dtype not in ("float32", "float16"):
            raise ValueError(f"{type(self).__name__} has no conversion for dtype {self.job.dtype} "
                             f"(dtypes.{self.job.dtype}.torch: {torch_dtype}). Valid: float32, float16")

        if m is None and torch_dtype == "float32" and not self._fault():
            return str(path), None
        if m is None:
            m = onnx_weights.load_graph(path)
        base = Path(path).parent if path is not None else Path(getattr(self.job, "model_dir", None) or ".")  # OpJob: no model dir
        if self._fault():
            m = fault.inject(m, self._fault(), base)
        if torch_dtype == "float16":
            m, base = onnx_weights.to_float16(m, base, self._converted(), keep_io_types=True), self._converted().dir
        return m.SerializeToString(), (base if onnx_weights.has_external(m) else None)

    def _converted(self):
        """This runner's temp weights file of converted tensors (parity.models.onnx_weights.Converted)."""
        if getattr(self, "_conv", None) is None:
            self._conv = Converted()
        return self._conv

    # -- reduce (parity.analysis.reduce): any ONNX graph, as this provider runs it --
    def prepared(self, path) -> bytes:
        """The graph at `path` (or a ModelProto, its weights inline) as this provider hands it to
        onnxruntime (dtype conversion, fault), serialised."""
        m, folder = self._convert(path)
        if folder is not None:
            raise ValueError("prepared(): the graph's weights are external data; reduce hands it a graph "
                             "with its weights inline (onnx.load of model.onnx reads weights.bin)")
        return Path(m).read_bytes() if isinstance(m, str) else m

    def run_graph(self, model: bytes, feeds: dict) -> dict:
        """Run a prepared graph (serialised) on this provider: {output name: value}."""
        sess = self._session(None, model)
        return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))

    def repro_settings(self) -> dict:
        """What repro.py needs to run a graph as this provider does, with onnxruntime alone."""
        opt = (self.job.provider_cfg.get("options") or {}).get("graph_optimization_level", "all")
        return {"ep": self.ep, "provider_options": self.provider_options(), "opt_level": OPT_LEVELS[opt]}

    def _session(self, path, model: bytes | None = None, folder: Path | None = None, arena: bool = True):
        """A session on `path` converted to the cell's dtype (_convert), or on `model` (serialised) as it
        is, its external data in `folder`. onnxruntime memory-maps the weights file and keeps only
        what its kernels repack: the sessions of a process share the file's pages. arena=False: no
        CPU memory arena, for the graphs whose run returns every layer's value (layers.onnx, the
        own-error cut): the arena grows by powers of two around those outputs and keeps what it grew
        (resnet50's capture: 1.28 GiB peak RSS with it, 1.00 without; the same values)."""
        if model is None:
            model, folder = self._convert(path)
        so = self._session_options()
        if not arena:
            so.enable_cpu_mem_arena = False
        if folder is not None:  # a graph from memory: where its external data is
            so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
        sess = self._ort().InferenceSession(model, sess_options=so, providers=self._providers())
        if self.ep not in sess.get_providers():  # onnxruntime falls back to CPU silently
            raise Unavailable(f"onnxruntime created the session without {self.ep} (it ran on "
                              f"{sess.get_providers()}): the EP's libraries or device are missing")
        return sess

    @staticmethod
    def _ort():
        return ort

    def _session_options(self):
        """The provider's session options (graph_optimization_level, threads), model and suites alike."""
        ort = self._ort()
        so = ort.SessionOptions()
        opt = (self.job.provider_cfg.get("options") or {}).get("graph_optimization_level", "all")
        if opt not in OPT_LEVELS:
            raise ValueError(f"providers.{self.job.provider}.options.graph_optimization_level: "
                             f"unknown level '{opt}'. Valid: {', '.join(OPT_LEVELS)}")
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPT_LEVELS[opt])
        so.use_deterministic_compute = True
        so.log_severity_level = 3
        if self.job.threads:
            so.intra_op_num_threads = self.job.threads
        return so

    # -- mixed precision (Runner.mixed): items are node names of the plain graph, model.onnx --
    plan_items = "onnx_nodes"

    def _plan_source(self):
        """model.onnx (weightless; with options.fault, faulted), loaded once for every mixed() call: value_info of initializers
        dropped (the dynamo exporter records them; converters then insert casts twice or fail on stale
        shapes) and shapes inferred once, so each conversion can skip shape inference."""
        if getattr(self, "_plan_src", None) is None:
            m = onnx_weights.load_graph(self.job.model_dir / "model.onnx")
            if self._fault():  # options.fault acts on every graph the provider runs, the plan's too
                m = fault.inject(m, self._fault(), self.job.model_dir)
            inits = {t.name for t in m.graph.initializer}
            keep = [v for v in m.graph.value_info if v.name not in inits]
            del m.graph.value_info[:]
            m.graph.value_info.extend(keep)
            self._plan_src = onnx.shape_inference.infer_shapes(m)
        return self._plan_src

    def mixed(self, reduced, flip=()):
        src = self._plan_source()
        nodes = {n.name for n in src.graph.node}
        fp32 = set(flip) if reduced else nodes - set(flip)
        m = onnx.ModelProto()
        m.CopyFrom(src)  # weightless: a copy of the graph only
        folder = self.job.model_dir
        if fp32 != nodes:  # everything in fp32: the exported graph as it is
            m, folder = self._mixed_model(m, fp32)
        self.plain = None  # the previous mixed session's weights go before the next one loads its own
        self.plain = self._session(None, m.SerializeToString(), folder)
        self.plain_names = [o.name for o in self.plain.get_outputs()]
        self._mixed = True  # self.plain is not model.onnx: never closed (_release_for)

    def _mixed_model(self, m, fp32_nodes: set):
        """(`m` at the cell's dtype with the nodes `fp32_nodes` left in float32, the folder of its
        external data) (fp16: convert_float_to_float16's node_block_list, Casts inserted around them)."""
        if self._torch_dtype() != "float16":
            raise ValueError(f"{type(self).__name__} has no mixed precision for dtype {self.job.dtype}")
        conv = self._converted()
        return mixed_fp16(m, fp32_nodes, shapes_inferred=True, weights=(self.job.model_dir, conv)), conv.dir

    def provider_options(self) -> dict:
        """Options for self.ep: conf `options.provider_options`, as strings (what ORT takes)."""
        po = (self.job.provider_cfg.get("options") or {}).get("provider_options") or {}
        return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in po.items()}

    def _providers(self) -> list:
        fallback = (self.job.provider_cfg.get("options") or {}).get("fallback") or []
        po = self.provider_options()
        return [(self.ep, po) if po else self.ep, *fallback]

    def activate(self) -> None:
        if self._fault():
            fault.check(onnx_weights.load_graph(self.job.model_dir / "model.onnx"), self._fault(),
                        f"providers.{self.job.provider}.options.fault")
        self.layers = self.plain = self.own = None
        self._opened, self._keep_open = set(), False
        self._open("plain")  # the first session run_capture uses (plain graph first): an unavailable EP fails the activation

    def _open(self, kind: str) -> None:
        """Open the session `kind` (layers | plain) if it is closed. Each session holds its kernels'
        repacked copy of the weights (~W for a MatMul-heavy model; onnxruntime's Python API cannot
        share those between sessions), and a capture runs the graphs one after the other (layers,
        plain, then the own-error cut): so opening one closes the others, and at most one holds its
        weights at a time. A session asked for again after it was closed means the caller interleaves
        them: from then on every session stays open."""
        if getattr(self, kind) is not None:
            return
        self._release_for(kind)
        setattr(self, kind, self._loaded(self.job.model_dir / ("layers.onnx" if kind == "layers" else "model.onnx"),
                                         arena=kind != "layers"))
        if kind == "layers":
            self.names = [o.name for o in self.layers.get_outputs()]
        else:
            self.plain_names = [o.name for o in self.plain.get_outputs()]

    def _release_for(self, kind: str) -> None:
        """Close the sessions other than `kind` before `kind` opens (see _open); a mixed plain graph
        (Runner.mixed) is never closed."""
        opened = self.__dict__.setdefault("_opened", set())
        if kind in opened:
            self._keep_open = True
        opened.add(kind)
        if not getattr(self, "_keep_open", False):
            closed = [o for o in ("layers", "plain", "own") if o != kind and getattr(self, o, None) is not None
                      and not (o == "plain" and getattr(self, "_mixed", False))]
            for other in closed:
                setattr(self, other, None)

    def _loaded(self, path: Path, arena: bool = True):
        """A session on `path` at the cell's dtype. The conversion raising is EXPORT_FAIL; onnxruntime
        refusing the converted graph (e.g. a float16 LayerNormalization whose statistics outputs
        stay float32 in the converter's types) is SessionError, INFER_FAIL naming the conversion."""
        model, folder = self._convert(path)
        try:
            return self._session(None, model, folder, arena)
        except Unavailable:
            raise
        except Exception as e:
            dt = self._torch_dtype()
            conv = (f" as converted to {dt} (onnxruntime.transformers.float16, float32 inputs/outputs)"
                    if dt == "float16" else f" as prepared for {self.job.dtype}" if not isinstance(model, str) else "")
            msg = re.sub(r"^\[ONNXRuntimeError\][^/]*/\S+ .*?\) ", "", (str(e).strip().splitlines() or [""])[0])
            raise SessionError(f"onnxruntime cannot load {path.name}{conv}: {type(e).__name__}: {msg}") from e

    def infer(self, feeds):
        self._open("layers")
        return list(zip(self.names, self.layers.run(None, feeds)))

    def infer_plain(self, feeds):
        self._open("plain")
        return list(zip(self.plain_names, self.plain.run(None, feeds)))

    @property
    def own_unsupported(self) -> str | None:
        if modelfiles.is_onnx_file(self.job.model_cfg):
            return "ONNX-file model: own error not measured (every node output is a layer; see reduce)"
        if str(self.job.dtype_cfg.get("mode", "")).startswith("int8"):
            return "int8: own error not measured (the quantized graph is not fed from the reference)"
        return None

    def _own_session(self, ref: dict) -> None:
        m = getattr(self, "own_source", None)  # another graph with leaf outputs (torch_reduce: the plain one)
        if m is None:
            m = onnx_weights.load_graph(self.job.model_dir / "layers.onnx")  # weightless: cut the graph only
        pre = {n.removeprefix(store.PRE): store.shape_in(ref, n) for n in ref if store.is_pre(n)}
        lv = onnx_cut.analyse(m, pre)
        for c in [c for c in lv.inputs if c not in pre]:
            del lv.inputs[c]
            lv.skipped[c] = "the reference has no pre:<call> input for it"
        self.own_cut = lv
        cut = onnx_cut.cut(m, lv)
        self._release_for("own")  # one session's weights at a time (_open)
        self.own = self._session(cut, arena=False)  # in memory; its external data: weights.bin

    def infer_own(self, feeds, ref):
        if getattr(self, "own", None) is None:
            self._own_session(ref)
        feed = dict(feeds)
        for i in self.own.get_inputs():
            if i.name not in feed:
                ref_name = i.name.removeprefix("ref:")  # pre:<call> keeps its name
                feed[i.name] = np.asarray(ref[ref_name], dtype=np.float32)
        names = [o.name for o in self.own.get_outputs()]
        got = dict(zip(names, self.own.run(None, feed)))
        between = {n.removeprefix(store.BETWEEN): v for n, v in got.items() if n.startswith(store.BETWEEN)}
        return interleave([(n, got[n]) for n in self.own_cut.calls], between)

    def own_skipped(self) -> list[str]:
        cut = getattr(self, "own_cut", None)
        return [f"{c}: {why}" for c, why in cut.skipped.items()] if cut is not None else []

    def deactivate(self) -> None:
        self.layers = self.plain = self.own = None
        if getattr(self, "_conv", None) is not None:  # after the sessions that read it
            self._conv.close()
            self._conv = None

    def run_op(self, side, args, kwargs, grad=None):
        """The op exported alone (TorchScript exporter, suites_run.onnx_opset) and run in a session
        with this provider's options (_session_options), fed the cell's inputs."""
        import torch  # lazy: only run_op (suites) needs torch (+1.84 s, BENCHMARKS 22); an ORT capture never loads it

        from parity.backends import ops  # lazy: parity.backends.ops loads torch (as above)

        sd = ops.side_at(side, ops.TORCH_DTYPES[self.job.dtype])
        data, names, ts = _export_op(sd, args, kwargs, self.job.onnx_opset, getattr(self.job, "exporter", "legacy"))
        model = onnx.load_from_string(data)
        onnx_ops = sorted({n.op_type for n in model.graph.node})
        graph_inputs = {i.name for i in model.graph.input}
        try:
            self.op_session = sess = self._session(None, data)  # kept: what the case ran with
        except Unavailable as e:
            raise OpSkip("UNAVAILABLE", str(e)) from None
        except Exception as e:
            raise OpSkip("INFER_FAIL", "onnxruntime session: " + ops.reason_of(e)) from None
        feeds = {n: (t.detach().numpy() if t.dtype != torch.bfloat16 else t.detach().float().numpy())
                 for n, t in zip(names, ts) if n in graph_inputs}  # the exporter drops unused inputs
        try:
            res, ms = ops.timed(lambda: sess.run(None, feeds), self.job.repeats)
        except Exception as e:
            raise OpSkip("INFER_FAIL", "onnxruntime run: " + ops.reason_of(e)) from None
        with torch.no_grad():
            ref_names = [n for n, _ in ops.leaves(ops.call(sd, args, kwargs))]  # output names/count
        if len(ref_names) != len(res):
            raise OpSkip("INFER_FAIL", f"ONNX graph has {len(res)} outputs, eager op {len(ref_names)}")
        return [(f"out:{n}", torch.from_numpy(np.asarray(r))) for n, r in zip(ref_names, res)], ms, onnx_ops


def _export_op(side, args, kwargs, opset: int, exporter: str = "legacy"):
    """(serialised ONNX, input names, input tensors) of one side with the legacy (TorchScript) or the
    dynamo exporter; complex tensors as real [..., 2] views (ops.Wrap); OpSkip EXPORT_FAIL if it fails."""
    import torch  # lazy: only run_op (suites) needs torch (+1.84 s, BENCHMARKS 22); an ORT capture never loads it

    from parity.backends import ops  # lazy: parity.backends.ops loads torch (as above)

    ts = [torch.view_as_real(t) if t.is_complex() else t for _, t in ops.leaves([args, kwargs])]
    wrap = ops.Wrap(side, args, kwargs).eval()
    buf = io.BytesIO()
    names = [f"in{i}" for i in range(len(ts))]
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()), torch.no_grad():
            warnings.simplefilter("ignore")
            if exporter == "dynamo":
                torchlib_table.install()  # listed once per process, not per case
                prog = torch.onnx.export(wrap, tuple(ts), None, dynamo=True, opset_version=int(opset),
                                         input_names=names, verbose=False)
                return prog.model_proto.SerializeToString(), names, ts
            torch.onnx.export(wrap, tuple(ts), buf, dynamo=False, opset_version=int(opset),
                              input_names=names, do_constant_folding=False)
    except Exception as e:
        raise OpSkip("EXPORT_FAIL", f"torch.onnx.export ({exporter}): " + ops.reason_of(e)) from None
    return buf.getvalue(), names, ts


def range_scan(path: Path, fmt: str) -> list[dict]:
    """The float initializers and Constant values of the graph at `path` that the format `fmt` cannot
    hold (parity.core.dtypes.out_of_range: |x| above its max, nonzero |x| below its smallest subnormal),
    each with the nodes that read it (their names, op types, outputs and the torch module scopes they
    were exported in, pkg.torch.onnx.name_scopes: a leaf module is a layer's name): one read of
    each tensor, memory-mapped. onnxruntime's convert_float_to_float16 clamps such values to +-65504
    and +-5.96e-8; a torch .half() makes them inf and 0."""
    f, m, maps, out = dtypes.facts(fmt), onnx_weights.load_graph(path), {}, []
    readers: dict[str, list] = {}
    for n in m.graph.node:
        for x in n.input:
            readers.setdefault(x, []).append(n)
    tensors = [(t.name, t) for t in m.graph.initializer] + [
        (n.output[0], a.t) for n in m.graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"]
    for name, t in tensors:
        if t.data_type not in (TensorProto.FLOAT, TensorProto.DOUBLE):
            continue
        a = onnx_weights.tensor_view(t, path.parent, maps) if onnx_weights.is_external(t) else numpy_helper.to_array(t)
        r = dtypes.out_of_range(a, f)
        if r is None or not (r["over"] or r["under"]):
            continue
        ns = readers.get(name, [])
        out.append({"param": name, "format": f.name, **r, "nodes": [n.name for n in ns], "ops": [n.op_type for n in ns],
                    "outputs": [o for n in ns for o in n.output],
                    "modules": sorted({sc.removeprefix(onnx_cut.PREFIX) for n in ns for sc in onnx_cut.scopes(n) if sc})})
    maps.clear()
    return out


class OrtCpuRunner(OrtRunner):
    pass


def mixed_fp16(m, fp32_nodes, shapes_inferred: bool = False, weights=None):
    """`m` in float16 with the nodes `fp32_nodes` computing in float32 (float32 graph I/O):
    convert_float_to_float16's node_block_list, then two repairs. The converter stores every tensor
    between two blocked nodes in float16 (blocked output -> Cast fp16 -> Cast fp32 -> blocked input),
    so nothing kept would see float32 values: each such Cast pair becomes an Identity of the float32
    value (fold_cast_pairs). And it names repeated Casts alike (dedupe_nodes). `weights`: for a
    weightless `m`, (folder of its external data, parity.models.onnx_weights.Converted to write the
    converted weights to); None when its weights are inline."""
    base, store = weights if weights is not None else (None, None)
    m = onnx_weights.to_float16(m, base, store, keep_io_types=True, node_block_list=sorted(fp32_nodes),
                                disable_shape_infer=shapes_inferred)
    return dedupe_nodes(fold_cast_pairs(m))


def fold_cast_pairs(m):
    """Cast(float32 -> float16) followed by Cast(-> float32): the second becomes Identity of the first's
    float32 input (no rounding between float32 nodes); the first goes when nothing else reads it."""
    def to(n):
        return next((a.i for a in n.attribute if a.name == "to"), None) if n.op_type == "Cast" else None

    g = m.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*g.input, *g.value_info, *g.output]}
    types.update({t.name: t.data_type for t in g.initializer})
    down = {n.output[0]: n for n in g.node if to(n) == TensorProto.FLOAT16
            and types.get(n.input[0]) == TensorProto.FLOAT}
    for n in g.node:
        if to(n) == TensorProto.FLOAT and n.input[0] in down:
            n.op_type, n.input[0] = "Identity", down[n.input[0]].input[0]
            del n.attribute[:]
    read = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    keep = [n for n in g.node if not (n.op_type == "Cast" and n.output[0] in down and n.output[0] not in read)]
    if len(keep) != len(g.node):
        del g.node[:]
        g.node.extend(keep)
    return m


def dedupe_nodes(m):
    """Drop repeated identical nodes. convert_float_to_float16 (onnxruntime 1.31) inserts one
    `<value>_cast_to_fp32` Cast per blocked consumer of an fp16 value, all with the same name, input
    and output, which onnxruntime rejects ("two nodes with same node name")."""
    seen, keep = set(), []
    for n in m.graph.node:
        key = n.SerializeToString(deterministic=True)
        if key not in seen:
            seen.add(key)
            keep.append(n)
    if len(keep) != len(m.graph.node):
        del m.graph.node[:]
        m.graph.node.extend(keep)
        names, vi = set(), []
        for v in m.graph.value_info:
            if v.name not in names:
                names.add(v.name)
                vi.append(v)
        del m.graph.value_info[:]
        m.graph.value_info.extend(vi)
    return m

