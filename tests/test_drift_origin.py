"""Drift localisation: perturb one layer (its weights in the exported ONNX graph, or its captured
values) and the diff names exactly that layer as drift_origin, with every earlier layer passing."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest import make_repo
from parity.core import store


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    r = make_repo(tmp_path_factory.mktemp("drift") / "repo", models=("transformer_block",),
                  dtypes=("fp32",), providers=("ort_cpu",))
    r.repro()
    return r


def diff(repo, capture_dir, out):
    repo.run(["python", "-m", "stages.diff", "--model", "transformer_block", "--dtype", "fp32",
              "--provider", "ort_cpu", "--capture", str(capture_dir),
              "--reference", "artifacts/reference/transformer_block", "--out", str(out)])
    return json.loads((out / "metrics.json").read_text())


def weight_of(m, output: str):
    """The 2-D initializer behind a layer's graph output (the dynamo exporter stores Linear weights
    transposed under generated names such as val_65, so walk the graph back from the output)."""
    producer = {o: n for n in m.graph.node for o in n.output}
    inits = {t.name: t for t in m.graph.initializer}
    todo, seen = [output], set()
    while todo:
        v = todo.pop(0)
        if v in inits and len(inits[v].dims) == 2:
            return inits[v]
        if v in producer and v not in seen:
            seen.add(v)
            todo += list(producer[v].input)
    raise AssertionError(f"no weight found behind {output}")


def test_unperturbed_cell_passes(repo):
    m = json.loads((repo.path / "artifacts/diff/transformer_block-fp32-ort_cpu/metrics.json").read_text())
    assert m["verdict"] == "PASS" and m["drift_origin"] is None and m["layers"] == 7


def test_perturbed_onnx_weights_are_blamed_on_that_layer(repo, tmp_path):
    import onnx
    from onnx import numpy_helper

    model_dir = tmp_path / "model"
    shutil.copytree(repo.path / "artifacts/models/transformer_block", model_dir)
    for fname in ("layers.onnx", "model.onnx"):
        m = onnx.load(str(model_dir / fname))
        init = weight_of(m, "fc1")
        w = numpy_helper.to_array(init).copy()
        w[0, :] += 0.01  # one output channel of fc1, slightly
        init.CopyFrom(numpy_helper.from_array(w, init.name))
        onnx.save(m, str(model_dir / fname))
    cap = tmp_path / "capture"
    repo.run(["python", "-m", "stages.capture", "--model", "transformer_block", "--dtype", "fp32",
              "--provider", "ort_cpu", "--model-dir", str(model_dir),
              "--inputs", "artifacts/inputs/transformer_block.parquet", "--out", str(cap),
              "--timing", str(tmp_path / "t.json")])
    m = diff(repo, cap, tmp_path / "diff")
    assert m["verdict"] == "FAIL" and m["drift_origin"] == "fc1"
    layers = json.loads((tmp_path / "diff/layers.json").read_text())["layers"]
    order = [d["name"] for d in layers]
    assert all(d["passed"] for d in layers[:order.index("fc1")])  # ln1, qkv, out, ln2 untouched


def test_perturbed_captured_values_are_blamed_on_that_layer(repo, tmp_path):
    src = repo.path / "artifacts/capture/transformer_block-fp32-ort_cpu"
    cap = tmp_path / "capture"
    shutil.copytree(src, cap)
    rows = []
    for t in store.read(src / "layers.parquet"):
        a = np.array(t.array)
        if t.name == "ln2" and t.sample == 0:
            a.flat[7] += 1e-2
        rows.append(store.Tensor(t.sample, t.name, t.order, a))
    store.write(cap / "layers.parquet", rows)
    m = diff(repo, cap, tmp_path / "diff")
    assert m["drift_origin"] == "ln2"
    layers = {d["name"]: d for d in json.loads((tmp_path / "diff/layers.json").read_text())["layers"]}
    assert layers["ln2"]["n_outside"] == 1 and layers["ln2"]["worst_sample"] == 0
    assert layers["ln2"]["worst_index"][-1] == 7
