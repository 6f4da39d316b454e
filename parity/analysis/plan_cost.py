"""The quantisation's expected cost of each plan candidate (issue 35 item 3: the plan ranks blocks by
quantisation cost), computed by parity, independently of the provider's quantiser.

For an int4 (int4_weight) or int8 (int8_dynamic) cell, the quantised model is the plain graph
(model.onnx) with the candidate's weight MatMuls replaced by parity's own quantisation
(parity.models.quant_sim.simulated: the weight quantised with the cell's scheme and settings and
dequantised, times the activations quantised as the scheme does at run time), every other node as
exported, run in float32 by onnxruntime (the trusted CPU kernels, ORT_ENABLE_BASIC: the dequantised
weights are folded once). Its cost is the output's rel_l2 against the fp32 reference with only that
candidate quantised; the provider's deviation is the rel_l2 between the provider's output (the same
candidate quantised by the provider, the plan's sensitivity run) and parity's. A correct provider
deviates by its kernels' rounding (measured in docs/plan.md); a deviation above
DEVIATION_LIMIT x the cost is a bug, not precision (a wrong scale, packing or kernel), and is flagged.

Memory: the graph stays weightless; the dequantised weights go to a temp weights file (quant.bin,
each weight quantised once per plan) beside a hard link to the model's own external data (a copy
across file systems), so a 1.1B model's graph never meets protobuf's 2 GiB
limit, and only one weight is quantised at a time. Never imports torch.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper
from onnx.external_data_helper import set_external_data

from parity.config import schema
from parity.models import onnx_int4, onnx_weights, quant_sim

DEVIATION_LIMIT = 0.25  # flag a candidate whose provider deviates from parity's quantisation by more than this x its cost
QUANT_FILE = "quant.bin"
INLINE_BELOW = 1024  # bytes: smaller new tensors stay inline


def scheme(job, settings: dict) -> tuple[str, dict] | None:
    """(quant_sim scheme, options) of a cell the cost is computed for (int4_weight, int8_dynamic), else None."""
    mode = schema.mode(job.dtype_cfg)
    if mode == "int4_weight":
        return "int4", onnx_int4.options(job.provider_cfg)
    if mode == "int8_dynamic":
        opts = dict(job.provider_cfg.get("options") or {})
        return "int8_dynamic", {**opts, "reduce_range": bool((settings or {}).get("reduce_range"))}
    return None


def _externalise(tensors, folder: Path) -> None:
    """Move `tensors` (inline, quant_sim's) to the end of folder/QUANT_FILE as external data."""
    with open(folder / QUANT_FILE, "ab") as f:
        for t in tensors:
            if onnx_weights.is_external(t) or len(t.raw_data) < INLINE_BELOW:
                continue
            f.seek(0, os.SEEK_END)
            f.write(b"\0" * ((-f.tell()) % 64))
            pos = f.tell()
            f.write(t.raw_data)
            set_external_data(t, QUANT_FILE, offset=pos, length=len(t.raw_data))
            t.data_location = onnx.TensorProto.EXTERNAL
            t.ClearField("raw_data")


class QuantModel:
    """The plain graph with chosen weight MatMuls quantised by parity, run on onnxruntime in float32.
    Each weight is quantised once (quant_sim's nodes for it kept, their tensors appended to the temp
    QUANT_FILE), so the plan's whole-model run pays for every weight and each candidate's run after it
    only builds a session."""

    def __init__(self, model_dir: Path, scheme_opts: tuple[str, dict], threads: int | None = None):
        self.model_dir, (self.scheme, self.opts), self.threads = Path(model_dir), scheme_opts, threads
        self.src = onnx_weights.load_graph(self.model_dir / "model.onnx")  # weightless
        self._tmp = tempfile.TemporaryDirectory(prefix="parity-quantcost-")
        self.folder = Path(self._tmp.name)
        self._done: dict[str, tuple[list, list]] = {}  # node -> (quant_sim's nodes, their tensors in QUANT_FILE)

    def close(self) -> None:
        self._tmp.cleanup()

    def graph(self, nodes):
        """(weightless graph with `nodes` quantised, how many weight MatMuls it quantised): new weights
        in QUANT_FILE, the model's own external files linked (or copied) beside it: onnxruntime
        refuses external data outside the folder it is given, symlinks included."""
        m = onnx.ModelProto()
        m.CopyFrom(self.src)
        want = set(nodes)
        if self.scheme == "int8_dynamic" or self.opts.get("gemm_to_matmul", True):
            others = [n.name for n in m.graph.node if n.op_type == "Gemm" and n.name not in want]
            onnx_int4.gemm_to_matmul(m, others, lambda t, name: numpy_helper.from_array(
                onnx_int4.read(t, self.model_dir).T.copy(), name))
        targets = [n for n in onnx_int4.weight_matmuls(m, False) if n in want]
        inits = {t.name: t for t in m.graph.initializer}
        pieces = {n.name: self._piece(m, n, inits) for n in m.graph.node if n.name in targets}
        out = [x for n in m.graph.node for x in (pieces[n.name][0] if n.name in pieces else [n])]
        del m.graph.node[:]
        m.graph.node.extend(out)
        used = {i for n in out for i in n.input}
        keep = [t for t in m.graph.initializer if t.name in used]
        del m.graph.initializer[:]
        m.graph.initializer.extend(keep + [t for p in pieces.values() for t in p[1]])
        del m.graph.value_info[:]
        for loc in {onnx_weights.external_info(t)["location"] for t in m.graph.initializer if onnx_weights.is_external(t)}:
            if loc != QUANT_FILE and not (self.folder / loc).exists():
                try:
                    os.link(self.model_dir / loc, self.folder / loc)
                except OSError:  # another file system: one copy for every run of this model
                    shutil.copyfile(self.model_dir / loc, self.folder / loc)
        return m, len(pieces)

    def _piece(self, m, node, inits: dict) -> tuple[list, list]:
        """(nodes, tensors) replacing the weight MatMul `node` of `m`: quant_sim.simulated of a graph
        holding that node and its weight alone, the new tensors moved to QUANT_FILE; once per node."""
        if node.name not in self._done:
            stub = onnx.ModelProto()
            stub.CopyFrom(m)
            del stub.graph.node[:], stub.graph.initializer[:], stub.graph.value_info[:]
            stub.graph.node.append(node)
            stub.graph.initializer.append(inits[node.input[1]])
            sim = quant_sim.simulated(stub, self.scheme, self.opts, self.model_dir, [node.name])
            new = [t for t in sim.graph.initializer if t.name.startswith("quant_sim/")]
            _externalise(new, self.folder)
            self._done[node.name] = (list(sim.graph.node), new)
        return self._done[node.name]

    def run(self, nodes, feeds: list[dict]) -> list[dict]:
        """The model's outputs per feed with `nodes` quantised by parity (one fresh session)."""
        m, _ = self.graph(nodes)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.use_deterministic_compute = True
        so.log_severity_level = 3
        if self.threads:
            so.intra_op_num_threads = self.threads
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(self.folder))
        sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        del m
        names = [o.name for o in sess.get_outputs()]
        return [dict(zip(names, sess.run(names, f))) for f in feeds]


def rel_l2(outs: list[dict], refs: list[dict]) -> float:
    """rel_l2 over every output of every sample of `outs` against `refs` (float64 sums)."""
    num = den = 0.0
    for got, want in zip(outs, refs):
        for k, b in want.items():
            a, b = np.asarray(got[k], np.float64), np.asarray(b, np.float64)
            num, den = num + float(np.sum((a - b) ** 2)), den + float(np.sum(b * b))
    return float(np.sqrt(num / den)) if den > 0 else (0.0 if num == 0 else float("inf"))


def flagged(cost: float, deviation: float) -> bool:
    """The provider's deviation from parity's quantised model exceeds what its rounding explains."""
    return bool(deviation > DEVIATION_LIMIT * cost)
