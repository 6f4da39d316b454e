"""The quantised oracle of an int4 / int8 cell (issue 35 item 3), written by its capture.

A quantised cell cannot match the fp32 reference to any tolerance that still sees a bug: int4's own
error is 10-25% per layer. So its reference is the quantised model itself, computed exactly: the
export's per-layer graph (layers.onnx) with every weight MatMul the provider quantises replaced by
parity's own quantisation of that weight (parity.models.quant_sim: same scheme and settings,
independent of onnxruntime's quantiser), dequantised, times the activations quantised as the
scheme does at run time (int4 at accuracy_level 4: int8 per block; int8_dynamic: uint8 per tensor);
run in float64 by the ONNX reference evaluator (parity.pipeline.onnx_fp64), every layer recorded.

The graph is the reference's own model only if the export is right, and a fault injected into the
exported graph would be in the oracle too. So the graph's own fp64 run, unquantised, is compared
with the reference's fp64 values (fp64.parquet), and the oracle is corrected by the difference:
  oracle = fp64(quantised graph) - fp64(graph) + fp64 reference
(the correction is 0 up to fp64 rounding when the graph is the reference's export; a weight or op
changed in the graph shows as that difference, at its layer). Where the graph's value is a pure
scale c of the reference's (a weight scaled in the checkpoint), oracle = fp64(quantised graph) / c'
+ (fp64 reference - fp64(graph) / c') with c' = graph / reference: the quantised weight scaled back,
as parity's quantisation of the reference's own weight would give (_correction).

The yardstick (the trusted backend's error at this precision): the same quantised graph run in
float32 by onnxruntime with optimisation off, measured against the fp64 run. It is what a correct
kernel gets wrong: fp32 rounding, amplified where a value near a quantisation step's edge rounds to
the other step (accuracy_level 4's activations: measured on tiny_llama, 2e-7 of rms at the first
projections, 7e-3 at the last down_proj).

Written into the capture directory: quant_fp64.parquet (the oracle, layer names as the reference's),
quant_fp32.parquet (the yardstick run, corrected the same way), quant_oracle.json (the scheme, the
cost of quantisation per layer: rel_l2 of the oracle vs the fp32 reference, and at the output; the
graph's deviation from the reference; and for int4 the provider's packed MatMulNBits initializers
compared with parity's, weight by weight). The diff judges the cell against them by the oracle
(parity.pipeline.diff) and reports the cost apart from the verdict.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
import onnxruntime as ort

from parity.backends import load_runner
from parity.backends.loader import calibration_feeds
from parity.core import store
from parity.core.io import write_json
from parity.models import onnx_cut, onnx_int4, onnx_weights, quant_sim, quant_static
from parity.config import schema
from parity.pipeline.onnx_fp64 import Golden
from parity.models.onnx_source import to_float64

GOLD, FLOOR, INFO = "quant_fp64.parquet", "quant_fp32.parquet", "quant_oracle.json"
MAX_WEIGHT_BYTES = 256 << 20
FAULT_EXTRA = ("__prefault", "__scale")
SCALE_MIN, SCALE_EXACT = 1e-4, 1e-5  # _correction: a graph value that is a pure scale of the reference's  # the tensors options.fault adds to an output it scales  # the evaluator holds the graph in float64 in memory: small models only


def scheme_of(job, settings: dict) -> tuple[str, dict] | None:
    """(scheme, options) of a quantised cell (int4 | int8_dynamic | int8_static), None for any other."""
    mode = schema.mode(job.dtype_cfg)
    opts = dict(job.provider_cfg.get("options") or {})
    if mode == "int4_weight":
        return "int4", onnx_int4.options(job.provider_cfg)
    if mode in ("int8_dynamic", "int8_static"):
        return mode, {**opts, "reduce_range": bool(settings.get("reduce_range"))}
    return None


def static_params(job, m, opts: dict) -> tuple[dict, list[str]]:
    """(parity's int8_static quantisation of `m`: parity.models.quant_static.params, calibrated on the
    cell's calibration samples; the nodes whose weight it quantises). ValueError where parity cannot
    reproduce onnxruntime's quantiser (then the cell is judged by tolerance): a calibration other than
    MinMax, an op whose QDQ placement parity does not simulate."""
    method = opts.get("calibrate_method", "MinMax")
    if method != "MinMax":
        raise ValueError(f"calibrate_method {method}: parity calibrates MinMax only (Entropy and Percentile choose "
                         "their range from onnxruntime's own histogram bins) <providers.*.options.calibrate_method>")
    if job.calibration is None or not Path(job.calibration).exists():
        raise ValueError("int8_static: no calibration samples (inputs.calibration)")
    par = quant_static.params(m, calibration_feeds(job.calibration), opts,
                              lambda t: onnx_int4.read(t, job.model_dir))
    if par["unsupported"]:
        raise ValueError(f"int8_static: parity does not simulate onnxruntime's QDQ placement for "
                         f"{', '.join(par['unsupported'][:4])} ({len(par['unsupported'])} nodes of "
                         f"{', '.join(sorted(quant_static.UNSUPPORTED))})")
    nodes = [n.name for n in m.graph.node if n.op_type in ("MatMul", "Gemm", "Conv")
             and any(i in par["is_weight"] for i in n.input)]
    return par, nodes


def quantised_nodes(m, scheme: str, opts: dict) -> list[str]:
    """The weight MatMuls the provider quantises (Gemms rewritten in `m` first where it does: int4 with
    gemm_to_matmul; quantize_dynamic always turns a Gemm with a constant weight into MatMulInteger + Add)."""
    if scheme == "int4" and opts.get("gemm_to_matmul", True) or scheme == "int8_dynamic":
        onnx_int4.gemm_to_matmul(m)
    return onnx_int4.weight_matmuls(m, False)


def write(job, feeds: list, out: Path, reference: Path | None, settings: dict) -> list[str]:
    """Write the quantised oracle of the cell `job` into `out` (module docstring); the lines to print.
    Nothing is written (and the diff judges by tolerance) for a scheme without one, a model too large,
    or a graph the float64 evaluator cannot run: the line says why (the capture itself stands)."""
    try:
        return _write(job, feeds, out, reference, settings)
    except Exception as e:  # noqa: BLE001  any failure of the oracle: none written, the cell judged by tolerance
        for f in (GOLD, FLOOR, INFO):
            (Path(out) / f).unlink(missing_ok=True)
        why = (str(e).strip().splitlines() or [""])[0][:300]
        return [f"capture@{job.model}-{job.dtype}-{job.provider}: no quantised oracle ({type(e).__name__}: {why}); "
                "judged by tolerance"]


def _write(job, feeds: list, out: Path, reference: Path | None, settings: dict) -> list[str]:
    found = scheme_of(job, settings or {})
    if found is None:
        return []
    scheme, opts = found
    key = f"capture@{job.model}-{job.dtype}-{job.provider}"
    d = Path(job.model_dir)
    size = (d / "weights.bin").stat().st_size if (d / "weights.bin").exists() else 0
    if size > MAX_WEIGHT_BYTES:
        return [f"{key}: no quantised oracle (weights {size / 2**20:.0f} MiB > {MAX_WEIGHT_BYTES >> 20} MiB: "
                "the float64 evaluator is for small models); judged by tolerance"]
    m = onnx_weights.load_with_data(d / "layers.onnx")
    par = None
    if scheme == "int8_static":  # the provider's graph first: which Softmax onnxruntime fuses is simulated
        par, nodes = static_params(job, m, opts)
        checks = packed_check(job, m, nodes, opts, par)
        sim = quant_static.simulated(m, par, lambda t: onnx_int4.read(t, d))
    else:
        nodes = quantised_nodes(m, scheme, opts)
        sim = quant_sim.simulated(m, scheme, opts, d, nodes)
        checks = packed_check(job, m, nodes, opts, scheme=scheme)
    ref64 = store.read_dict(reference) if reference is not None and Path(reference).exists() else {}
    gold, floor, graph = _runs(m, sim, feeds, ref64)
    shift, dev = _correction(graph, ref64)
    gold = [{n: _corrected(v, shift[k].get(n)) for n, v in g.items()} for k, g in enumerate(gold)]
    floor = [{n: _corrected(v, shift[k].get(n)) for n, v in f.items()} for k, f in enumerate(floor)]
    names = [o.name for o in m.graph.output]
    for path, runs in ((out / GOLD, gold), (out / FLOOR, floor)):  # the layers, then the gold's pre: inputs
        store.write(path, [t for k, r in enumerate(runs) for t in store.rows_from(k, list(r.items()))],
                    {"cell": f"{job.model}-{job.dtype}-{job.provider}", "kind": path.stem})
    ref32 = Path(reference).parent / "fp32.parquet" if reference is not None else None
    cost = _cost(gold, store.read_dict(ref32) if ref32 is not None and ref32.exists() else {}, names)
    info = {"scheme": scheme, "options": {k: opts[k] for k in sorted(opts) if k != "fault"},
            "quantised_nodes": len(nodes), "layers": _layer_of(m, nodes),
            "checked_against_reference": bool(ref64), "graph_vs_reference": dev,
            "cost": cost, "cost_output": cost.get("output"),
            "weights": checks if par is None else checks["weights"]}
    if par is not None:  # int8_static: the activations' calibrated parameters against the provider's too
        info["activations"] = checks["activations"]
    write_json(out / INFO, info)
    return [_line(key, info)]


def _runs(m, sim, feeds: list, ref64: dict):
    """(fp64 of the quantised graph, fp32 of it on onnxruntime unoptimised, fp64 of the graph as
    exported), each [{layer: float64 array}] per sample. The fp64 runs also hold the reference's
    `pre:<call>` inputs (the causes' op_substitution reads them from the gold): the graph's value
    that equals each one in the graph's own fp64 run (_pre_values)."""
    names = [o.name for o in m.graph.output]
    g_sim, g_graph = Golden(sim, to_float64(sim)), Golden(m, to_float64(m))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(sim.SerializeToString(), so, providers=["CPUExecutionProvider"])
    gold, floor, graph = [], [], []
    for k, f in enumerate(feeds):
        f64 = {n: (v.astype(np.float64) if v.dtype.kind == "f" else v) for n, v in f.items()}
        a, b = g_sim.run(f64), g_graph.run(f64)
        pre = _pre_values(b, ref64, k)
        gold.append({**{n: np.asarray(a[n], np.float64) for n in names}, **{p: np.asarray(a[t], np.float64)
                                                                           for p, t in pre.items() if t in a}})
        graph.append({**{n: np.asarray(b[n], np.float64) for n in names}, **{p: np.asarray(b[t], np.float64)
                                                                            for p, t in pre.items() if t in a}})
        floor.append({n: np.asarray(v, np.float64) for n, v in zip(names, sess.run(names, f))})
    return gold, floor, graph


def _pre_values(values: dict, ref64: dict, k: int) -> dict:
    """{`pre:<call>` of the reference: the name of the graph's value equal to it (rel_l2 <= 1e-5: the export
    folds some constants in float32, 1e-7 apart) in
    `values`, the graph's fp64 run of sample k}; a pre: value matched by none is left out."""
    out = {}
    by_shape: dict = {}
    for n, v in values.items():
        if isinstance(v, np.ndarray) and v.dtype.kind == "f":
            by_shape.setdefault(v.shape, []).append(n)
    for (s, n), t in ref64.items():
        if s != k or not store.is_pre(n):
            continue
        want = t.array.astype(np.float64)
        scale = max(float(np.linalg.norm(want)), 1e-300)
        hit = next((c for c in by_shape.get(want.shape, []) if float(np.linalg.norm(values[c] - want)) <= 1e-5 * scale),
                   None)
        if hit is not None:
            out[n] = hit
    return out


def _correction(graph: list, ref64: dict) -> tuple[list, dict]:
    """(per sample {layer: (c, fp64 reference - c x fp64 graph)}, the largest deviation {layer, rel_l2}):
    the oracle of a layer is c x its quantised run + that remainder. c is 1 (the correction is the
    difference), except where the graph's value is a pure scale of the reference's at a layer, over
    every sample (|c - 1| > SCALE_MIN, residual after scaling <= SCALE_EXACT of its norm: a weight
    edited in the checkpoint the export was written from): there the quantised run is scaled, as
    quantising the reference's own weight would scale it (symmetric schemes: q(c w) = c q(w) exactly),
    so the provider's error at that layer stays the weight's scale, not a scale blurred by the
    quantisation's own error. Nothing where the reference has no fp64 value of a layer."""
    worst = {"layer": None, "rel_l2": 0.0}
    pairs: dict = {}
    for k, g in enumerate(graph):
        for n, v in g.items():
            t = ref64.get((k, n))
            if t is not None and t.array.shape == v.shape:
                pairs.setdefault(n, []).append((k, t.array.astype(np.float64), v))
    shift = [{} for _ in graph]
    for n, rows in pairs.items():
        c = _pure_scale(rows)
        for k, r, v in rows:
            shift[k][n] = (c, r - c * v)
            rel = float(np.linalg.norm(r - v) / max(np.linalg.norm(r), 1e-300))
            if rel > worst["rel_l2"]:
                worst = {"layer": n, "rel_l2": rel}
    return shift, worst


def _corrected(v: np.ndarray, fix: tuple | None) -> np.ndarray:
    """c x v + remainder (_correction); v itself where the reference has no value of the layer."""
    return v if fix is None else fix[0] * v + fix[1]


def _pure_scale(rows: list) -> float:
    """c when the reference's values (r) are c x the graph's (v) over every sample (module docstring
    of _correction), else 1.0."""
    gg = sum(float(np.vdot(v, v)) for _, _, v in rows)
    rr = sum(float(np.vdot(r, r)) for _, r, _ in rows)
    if gg <= 0 or rr <= 0:
        return 1.0
    c = sum(float(np.vdot(r, v)) for _, r, v in rows) / gg
    res = np.sqrt(sum(float(np.sum((r - c * v) ** 2)) for _, r, v in rows) / rr)
    return c if abs(c - 1.0) > SCALE_MIN and res <= SCALE_EXACT else 1.0


def _cost(gold: list, ref32: dict, names: list) -> dict:
    """The quantisation's expected cost per layer: rel_l2 of the oracle vs the fp32 reference."""
    out = {}
    for n in names:
        num = den = 0.0
        for k, g in enumerate(gold):
            t = ref32.get((k, n))
            if t is None or t.array.shape != g[n].shape:
                break
            num += float(np.sum((g[n] - t.array) ** 2))
            den += float(np.sum(t.array.astype(np.float64) ** 2))
        else:
            if den > 0:
                out[n] = float(np.sqrt(num / den))
    return out


def _layer_of(m, nodes: list) -> dict:
    """Quantised node -> the layer (graph output) its MatMul writes, or the node itself; a model output is
    followed by the module that writes it (its node's name_scopes), as "output (lm_head)"."""
    outs = {o.name for o in m.graph.output}
    by = {n.name: n for n in m.graph.node}
    consumers: dict = {}
    for n in m.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    res = {}
    for name in nodes:
        o = by[name].output[0]
        if o not in outs:  # a bias Add after the MatMul (Gemm rewritten, or the exporter's)
            nxt = [c for c in consumers.get(o, []) if c.op_type == "Add"]
            o = nxt[0].output[0] if len(nxt) == 1 else o
        res[name] = o if o in outs else name
        if onnx_cut.is_output(res[name]):  # the model's own output (a head): name the module too, "output (lm_head)"
            mods = [c.removeprefix(onnx_cut.PREFIX) for c in onnx_cut.scopes(by[name]) if c.startswith(onnx_cut.PREFIX)]
            res[name] += f" ({mods[-1]})" if mods else ""
    return res


def packed_check(job, m, nodes: list, opts: dict, par: dict | None = None, scheme: str = "int4"):
    """Each quantised weight's MatMulNBits initializers in the provider's layers graph (the runner's
    own conversion) against parity's quantisation of the graph's weight: the share of blocks whose
    packed bytes, scales or zero points differ. int8_dynamic: each MatMulInteger weight's integers,
    scales and zero points (_compare_int8). int8_static (`par`: parity's quantisation): every
    quantised initializer and activation of the provider's QDQ graph (static_check)."""
    # the provider's own runner class, by name (no runner in the capture stage's import closure)
    runner = load_runner(job.provider_cfg["runner"], job.provider_cfg.get("import"))(job)
    if not hasattr(runner, "quantized"):
        return []
    try:
        if par is not None:
            return static_check(runner, job, m, par)
        return (_compare_int8 if scheme == "int8_dynamic" else _compare)(runner, job, m, nodes, opts)
    finally:
        runner.deactivate()


def _compare(runner, job, m, nodes: list, opts: dict) -> list[dict]:
    q, folder = runner.quantized(Path(job.model_dir) / "layers.onnx")
    qinits = {t.name: t for t in q.graph.initializer}
    inits = {t.name: t for t in m.graph.initializer}
    layer = _layer_of(m, nodes)
    by_name = {n.name: n for n in q.graph.node if n.op_type == "MatMulNBits"}
    src = {n.name: n for n in m.graph.node}
    out = []
    for name in nodes:
        qn = by_name.get(f"{name}_Q4")
        if qn is None:
            out.append({"node": name, "layer": layer[name], "missing": True})
            continue
        w = onnx_int4.read(inits[src[name].input[1]], job.model_dir).astype(np.float32)
        want = quant_sim.int4_packed(w, int(opts["block_size"]), bool(opts["is_symmetric"]))
        got = [onnx_int4.read(qinits[i], folder or job.model_dir) for i in qn.input[1:]]
        rec = {"node": name, "layer": layer[name]}
        for (k, w), g in zip(want.items(), got):
            g = g.reshape(w.shape) if g.size == w.size else g
            diff = (g != w) if g.shape == w.shape else np.ones(w.shape, bool)
            per_block = diff.reshape(w.shape[0], w.shape[1], -1).any(-1) if diff.ndim == 3 else diff
            rec[k] = float(per_block.mean())
        rec["matches"] = all(rec[k] == 0.0 for k in want)
        out.append(rec)
    return out


def _compare_int8(runner, job, m, nodes: list, opts: dict) -> list[dict]:
    """int8_dynamic: each weight MatMul's integers in the provider's graph (quantize_dynamic's
    `<weight>_quantized`, `_scale`, `_zero_point`; a Gemm's transposed weight under its Gemm's name;
    options.fault's copy `<weight>__fault`) against parity's quantisation (quant_sim.int8_weight):
    the share of weight elements whose integer minus zero point, and of scales, that differ."""
    q, _ = runner.quantized(Path(job.model_dir) / "layers.onnx")
    qinits = {t.name: t for t in q.graph.initializer}
    inits, src, layer = {t.name: t for t in m.graph.initializer}, {n.name: n for n in m.graph.node}, _layer_of(m, nodes)
    unsigned = opts.get("weight_type") == "QUInt8"
    out = []
    for name in nodes:
        w_name = src[name].input[1]
        orig = w_name.removesuffix(f"_t_{name}")  # gemm_to_matmul's transposed copy of a Gemm's weight
        base = next((b for b in (orig, orig + "__fault") if b + "_quantized" in qinits), None)
        if base is None:
            out.append({"node": name, "layer": layer[name], "missing": True})
            continue
        got_q, got_s, got_zp = (numpy_helper.to_array(qinits[base + s]) for s in ("_quantized", "_scale", "_zero_point"))
        w = onnx_int4.read(inits[w_name], job.model_dir).astype(np.float32)
        ints, scale = quant_sim.int8_weight(w, bool(opts.get("per_channel")), bool(opts.get("reduce_range")), unsigned)
        got = got_q.astype(np.float32) - got_zp.astype(np.float32)
        same_shape = got.shape == ints.shape and got_s.size == scale.size
        rec = {"node": name, "layer": layer[name],
               "packed": float((got != ints).mean()) if same_shape else 1.0,
               "scales": float((got_s.ravel() != scale.ravel()).mean()) if same_shape else 1.0}
        rec["matches"] = rec["packed"] == 0.0 and rec["scales"] == 0.0
        out.append(rec)
    return out


def static_check(runner, job, m, par: dict) -> dict:
    """{"weights": [per quantised initializer: {node, layer, tensor, scales, zero_points, packed (share
    differing), matches}], "activations": {compared, differ, fused_softmax}} of the provider's QDQ graph
    against parity's quantisation; sets par["fused_softmax"] (quant_static.fused_softmax: simulated
    as onnxruntime's QLinearSoftmax kernel quantises). ValueError when the two place Q/DQ pairs on different tensors (the oracle
    would then be another model: the cell is judged by tolerance, the line names them)."""
    q, _ = runner.quantized(Path(job.model_dir) / "layers.onnx")
    par["fused_softmax"] = quant_static.fused_softmax(q, (job.provider_cfg.get("options") or {}).get(
        "graph_optimization_level", "all"))
    prov = {k.removesuffix("__fault"): v for k, v in quant_static.provider_params(q).items()
            if not k.endswith(FAULT_EXTRA)}  # options.fault's copies and Mul (parity.backends.fault), as the tensors they stand for
    res = quant_static.compare(par, prov)
    only = res["placement"]
    if only["parity_only"] or only["provider_only"]:
        raise ValueError(f"int8_static: Q/DQ placement differs from the provider's (parity only: "
                         f"{only['parity_only'][:3]}, provider only: {only['provider_only'][:3]})")
    consumer = {i: n.name for n in m.graph.node for i in n.input}
    layer = _layer_of(m, [n for n in consumer.values() if n])
    out = []
    for t, rec in sorted(res["initializers"].items()):
        node = consumer.get(t)
        out.append({"node": node, "layer": layer.get(node, t), "tensor": t, **rec,
                    "matches": not any(rec.values())})
    act = res["activations"]
    return {"weights": out, "activations": {"compared": act["compared"], "differ": act["differ"],
                                            "fused_softmax": sorted(par["fused_softmax"])}}


def _line(key: str, info: dict) -> str:
    bad = [w["layer"] for w in info["weights"] if not w.get("matches", False)]
    dev = info["graph_vs_reference"]
    return (f"{key}: quantised oracle ({info['scheme']}, {info['quantised_nodes']} weight MatMuls): cost at the "
            f"output rel_l2 {info['cost_output'] or 0:.3g} vs fp32 (not judged)"
            + (f"; graph vs reference: largest rel_l2 {dev['rel_l2']:.2g} at {dev['layer']}" if info["checked_against_reference"]
               else "; not checked against a reference fp64 run")
            + (f"; packed weights differ from parity's at {', '.join(bad[:4])}" if bad else
               ("; packed weights identical to parity's" if info["weights"] else ""))
            + _act_line(info.get("activations")))


def _act_line(act: dict | None) -> str:
    """int8_static: the provider's calibrated activation parameters against parity's."""
    if not act:
        return ""
    if act["differ"]:
        return (f"; calibrated scale or zero point differs from parity's at {len(act['differ'])} of {act['compared']} "
                f"activations (first {act['differ'][0]})")
    return f"; calibrated scales and zero points identical to parity's at {act['compared']} activations"
