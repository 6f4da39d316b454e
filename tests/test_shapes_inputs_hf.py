"""Issue 10 part B: Hugging Face models from a config (arch.source: hf), real inputs from files,
and several input shapes per model (models.<m>.shapes) with per-shape results, on the real pipeline
(real DVC in a temp git repo, real onnxruntime, real Parquet)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import make_repo
from parity.core import store

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
        ok = ("PASS", "BASELINE")  # torch_cpu is the oracle's own baseline backend: BASELINE
        assert met["verdict"] in ok and met["failing_shapes"] == []
        assert all(v["verdict"] in ok for v in met["shapes"].values()) and sorted(met["shapes"]) == ["s128", "s16"]
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


TINY_BERT = """\
tiny_bert:
  arch:
    source: hf
    name: bert
    kwargs: {vocab_size: 100, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 2,
             intermediate_size: 64, max_position_embeddings: 64}
  input:
    - {name: input_ids, shape: [2, 16], dtype: int64, init: tokens}
    - {name: attention_mask, shape: [2, 16], dtype: int64, init: ones}
  tolerances: []
"""


def test_tiny_hf_bert_from_config_runs_offline_on_torch_and_ort(tmp_path, monkeypatch):
    """A Hugging Face model from its config alone (no hub: HF_HUB_OFFLINE=1), random init from the
    seed, exported with the dynamo exporter, at fp32 and fp16 on torch_cpu and ort_cpu."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = make_repo(tmp_path / "repo", models=("tiny_bert",), compose=False)
    (r.path / "conf/models/tiny_bert.yaml").write_text(TINY_BERT)
    r.commit("tiny bert")
    r.exp_run()
    ids = [t.array for t in store.read(r.path / "artifacts/inputs/tiny_bert.parquet") if t.name == "input_ids"]
    assert all(a.dtype == np.int64 and a.min() >= 0 and a.max() < 100 for a in ids)  # within the vocabulary
    lj = _json(r, "artifacts/models/tiny_bert/layers.json")
    assert lj["exporter"] == "dynamo" and lj["outputs"] == ["output:0", "output:1"]  # last_hidden_state, pooler
    names = [d["name"] for d in lj["layers"]]
    assert "encoder.layer.1.output.dense" in names and "embeddings.word_embeddings" in names
    for dtype in ("fp32", "fp16"):
        for prov in ("torch_cpu", "ort_cpu"):
            met = _json(r, f"artifacts/diff/tiny_bert-{dtype}-{prov}/metrics.json")
            assert met["status"] == "OK" and met["layers"] >= 20, (dtype, prov, met)
            if dtype == "fp32":  # torch_cpu: the oracle's own baseline backend
                assert met["verdict"] == ("BASELINE" if prov == "torch_cpu" else "PASS"), (prov, met)
    # the same seed gives the same weights in another process: the reference is reproducible
    before = (r.path / "artifacts/reference/tiny_bert/fp32.parquet").read_bytes()
    r.run(["dvc", "repro", "-f", "-s", "reference@tiny_bert"])
    assert (r.path / "artifacts/reference/tiny_bert/fp32.parquet").read_bytes() == before


FILE_MLP = """\
tiny_mlp:
  arch:
    source: parity
    name: mlp
    kwargs: {in_features: 16, hidden: 32, out_features: 8}
  input:
    - {name: input, shape: [4, 16], dtype: float32, init: file, path: data/inputs/mlp.npy}
  tolerances: []
"""


def test_real_inputs_from_a_file_are_the_samples_and_a_dependency(tmp_path):
    r = make_repo(tmp_path / "repo", dtypes=("fp32",), providers=("ort_cpu",), compose=False)
    (r.path / "conf/models/tiny_mlp.yaml").write_text(FILE_MLP)
    data = np.random.default_rng(7).normal(size=(3, 4, 16)).astype(np.float32)
    np.save(r.path / "data/inputs/mlp.npy", data)
    r.commit("file inputs")
    r.exp_run()
    got = {t.sample: t.array for t in store.read(r.path / "artifacts/inputs/tiny_mlp.parquet")}
    assert sorted(got) == [0, 1]  # inputs.samples: 2 of the file's 3
    assert all(np.array_equal(got[k], data[k]) for k in got)
    assert _json(r, "artifacts/diff/tiny_mlp-fp32-ort_cpu/metrics.json")["verdict"] == "PASS"

    # the file is a dependency: a change re-runs the inputs stage (and what its new bytes feed)
    np.save(r.path / "data/inputs/mlp.npy", data * 2)
    ran = r.repro()
    assert "inputs@tiny_mlp" in ran and "diff@tiny_mlp-fp32-ort_cpu" in ran
    # a file that does not fit the spec: the stage fails naming the file, and writes nothing
    np.save(r.path / "data/inputs/mlp.npy", data[:, :, :8])
    (r.path / "artifacts/inputs/tiny_mlp.parquet").unlink()
    p = r.run(["dvc", "repro", "-s", "inputs@tiny_mlp"], check=False)
    assert p.returncode != 0
    assert "models.tiny_mlp.input 'input' (init: file, path: data/inputs/mlp.npy): array of shape [3, 4, 8]" in p.stderr + p.stdout
    assert not (r.path / "artifacts/inputs/tiny_mlp.parquet").exists()


def test_file_formats_and_token_bounds(tmp_path, monkeypatch):
    """.npy / .npz / Parquet (tensor store and a plain column) load the same samples; token ids
    outside the vocabulary are refused, naming the file."""
    from parity.pipeline import inputfiles

    monkeypatch.chdir(tmp_path)
    d = tmp_path / "data/inputs"
    d.mkdir(parents=True)
    ids = np.random.default_rng(0).integers(0, 50, size=(2, 1, 8))
    np.save(d / "ids.npy", ids)
    np.savez(d / "ids.npz", input_ids=ids)
    store.write(d / "ids.parquet", [store.Tensor(k, "input_ids", 0, ids[k]) for k in range(2)])
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"input_ids": [list(a.ravel()) for a in ids]}), d / "col.parquet")
    arch = {"source": "hf", "name": "bert", "kwargs": {"vocab_size": 50}}
    for f, extra in (("ids.npy", {}), ("ids.npz", {}), ("ids.parquet", {}), ("col.parquet", {})):
        spec = {"name": "input_ids", "shape": [1, 8], "dtype": "int64", "init": "file",
                "path": f"data/inputs/{f}", **extra}
        if f == "col.parquet":
            spec["shape"] = [8]
            got = _load_file(spec, arch, 2)
            assert np.array_equal(got, ids.reshape(2, 8)), f
        else:
            assert np.array_equal(_load_file(spec, arch, 2), ids), f
    spec = {"name": "input_ids", "shape": [1, 8], "dtype": "int64", "init": "file", "path": "data/inputs/ids.npy"}
    with pytest.raises(inputfiles.InputError, match=r"data/inputs/ids.npy\): values span \[\d+, \d+\], outside \[0, 10\)"):
        _load_file(spec, {**arch, "kwargs": {"vocab_size": 10}}, 2)
    with pytest.raises(inputfiles.InputError, match="holds 2 samples, inputs.samples asks for 3"):
        _load_file(spec, arch, 3)


def test_shape_and_input_config_errors_at_compose():
    from conftest import composed, config_error

    p = composed()
    mlp = "mlp"

    def set_(**kw):
        return lambda q: q["models"][mlp].update(**kw)

    assert config_error(p, set_(shapes={"b-1": {"input": [1, 768]}})) == \
        "models.mlp.shapes.b-1: a shape label may only use [A-Za-z0-9_] (it names the sample set)"
    assert config_error(p, set_(shapes={"b2": {"x": [2, 768]}})) == "models.mlp.shapes.b2.x: no such input. Valid: input"
    assert "expected 2 positive ints" in config_error(p, set_(shapes={"b2": {"input": [2, 768, 1]}}))
    msg = config_error(p, set_(input=[{"name": "input", "shape": [8, 768], "init": "file", "path": "elsewhere/x.npy"}]))
    assert msg.startswith("models.mlp.input[0].path: 'elsewhere/x.npy' is not under data/inputs/")
    bert = composed("models=[bert_base]")
    msg = config_error(bert, lambda q: q["models"]["bert_base"]["input"][0].update(init="randint", high=40000))
    assert msg.startswith("models.bert_base.input[0].high: 40000 exceeds models.bert_base.arch.kwargs.vocab_size 30522")


def _load_file(spec: dict, arch: dict, n: int):
    """inputfiles.load_file with the bound and id-ness the model's InputPlan gives the spec."""
    from parity.config import inputspec
    from parity.pipeline import inputfiles

    plan = inputspec.plan({"arch": arch, "input": [spec]})
    return inputfiles.load_file(spec, n, plan.bounds[0], plan.ids[0])
