"""Issue 10 part B: Hugging Face models from a config (arch.source: hf), real inputs from files,
and several input shapes per model (models.<m>.shapes) with per-shape results, on the real pipeline
(real DVC in a temp git repo, real onnxruntime, real Parquet)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import make_repo
from parity import store

TINY_BLOCK = """\
tiny_block:
  arch:
    source: parity
    name: transformer_block
    kwargs: {d_model: 32, n_heads: 2, d_ff: 64}
  input:
    - {name: input, shape: [2, 16, 32], dtype: float32, init: normal, mean: 0.0, std: 1.0}
  shapes:
    s16: {input: [2, 16, 32]}
    s128: {input: [2, 128, 32]}
  tolerances: []
"""

# A user's backend (a provider whose runner is their own module, declared with `import:`): ORT CPU
# limited to sequences of at most 64 (raises beyond), or drifting beyond 64 (every layer output
# offset by 1e-2): each fails at one shape only.
SEQ_RUNNERS = """\
from parity.backends.ort_cpu import OrtCpuRunner

LIMIT = 64


class SeqLimitRunner(OrtCpuRunner):
    def infer(self, feeds):
        if max(a.shape[1] for a in feeds.values()) > LIMIT:
            raise RuntimeError(f"sequence length {max(a.shape[1] for a in feeds.values())} exceeds this backend's limit {LIMIT}")
        return super().infer(feeds)


class SeqDriftRunner(OrtCpuRunner):
    def infer(self, feeds):
        out = super().infer(feeds)
        if max(a.shape[1] for a in feeds.values()) <= LIMIT:
            return out
        return [(n, v + 1e-2 if v.dtype.kind == "f" else v) for n, v in out]
"""


def _provider(name: str, cls: str) -> str:
    return (f"{name}:\n  runner: seqback:{cls}\n  import: seqback\n  dtypes: [fp32, fp16]\n"
            f"  uses: [onnxruntime, onnx, cpu]\n  options:\n    graph_optimization_level: all\n")


def _json(repo, rel):
    return json.loads((repo.path / rel).read_text())


def test_two_shapes_export_once_and_report_each(tmp_path):
    r = make_repo(tmp_path / "repo", models=("tiny_block",), dtypes=("fp32",),
                  providers=("torch_cpu", "ort_cpu", "seqlimit", "seqdrift"), compose=False)
    (r.path / "conf/models/tiny_block.yaml").write_text(TINY_BLOCK)
    (r.path / "seqback.py").write_text(SEQ_RUNNERS)
    (r.path / "conf/providers/seqlimit.yaml").write_text(_provider("seqlimit", "SeqLimitRunner"))
    (r.path / "conf/providers/seqdrift.yaml").write_text(_provider("seqdrift", "SeqDriftRunner"))
    r.commit("shapes")
    r.exp_run()

    # one export, the sequence axis dynamic
    import onnx

    m = onnx.load(str(r.path / "artifacts/models/tiny_block/model.onnx"), load_external_data=False)
    dims = [d.dim_param or d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    assert dims[0] == 2 and isinstance(dims[1], str) and dims[1] and dims[2] == 32
    lj = _json(r, "artifacts/models/tiny_block/layers.json")
    assert lj["dynamic_axes"] == {"input": {"1": "input_1"}}
    # every shape is a sample set of the cell: inputs.samples (2) per shape, label after label
    shapes = {t.sample: list(t.array.shape) for t in store.read(r.path / "artifacts/inputs/tiny_block.parquet")}
    assert shapes == {0: [2, 16, 32], 1: [2, 16, 32], 2: [2, 128, 32], 3: [2, 128, 32]}

    for prov in ("torch_cpu", "ort_cpu"):
        met = _json(r, f"artifacts/diff/tiny_block-fp32-{prov}/metrics.json")
        assert met["verdict"] == "PASS" and met["failing_shapes"] == []
        assert {k: v["verdict"] for k, v in met["shapes"].items()} == {"s16": "PASS", "s128": "PASS"}
        layers = _json(r, f"artifacts/diff/tiny_block-fp32-{prov}/layers.json")
        assert set(layers["shapes"]) == {"s16", "s128"}
        s128 = {d["name"]: d for d in layers["shapes"]["s128"]["layers"]}
        assert s128["fc1"]["shape"] == [2, 128, 64]

    # a backend that cannot run the long sequence: INFER_FAIL attributed to s128, s16 still compared
    st = _json(r, "artifacts/capture/tiny_block-fp32-seqlimit/status.json")
    assert st["status"] == "INFER_FAIL"
    assert st["shapes"]["s16"] == {"status": "OK", "reason": ""}
    assert st["shapes"]["s128"]["status"] == "INFER_FAIL"
    assert "at shape s128 (input [2, 128, 32])" in st["shapes"]["s128"]["reason"]
    assert "exceeds this backend's limit 64" in st["reason"] and "OK at s16" in st["reason"]
    met = _json(r, "artifacts/diff/tiny_block-fp32-seqlimit/metrics.json")
    assert met["verdict"] == "INFER_FAIL" and met["shape"] == "s128" and met["failing_shapes"] == ["s128"]
    assert met["shapes"]["s16"]["verdict"] == "PASS" and met["shapes"]["s128"]["verdict"] == "INFER_FAIL"

    # a backend that drifts at the long sequence only: FAIL at s128, its drift origin says so
    met = _json(r, "artifacts/diff/tiny_block-fp32-seqdrift/metrics.json")
    assert met["verdict"] == "FAIL" and met["failing_shapes"] == ["s128"]
    assert met["shapes"]["s16"]["verdict"] == "PASS"
    assert met["drift_origin_where"].endswith("at shape s128")

    summary = _json(r, "artifacts/report/summary.json")
    cells = summary.get("cells", summary)
    text = json.dumps(summary)
    assert "s128" in text, cells
    report = (r.path / "artifacts/report/report.md").read_text()
    assert "s128" in report and "s16" in report
