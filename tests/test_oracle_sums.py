"""The oracle's error sums written by the capture and baseline stages (parity.analysis.sums): the
diff stage judges from them without reading the fp64 reference or any own.parquet, and its
verdicts, metrics and drift-origin cause are the same bytes as when it computes them from the
arrays (a producer without sums, e.g. artifacts from before this file existed)."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import yaml

from conftest import make_repo
from parity.config import schema
from parity.core import store
from parity.analysis import sums
from parity.pipeline import diff


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    r = make_repo(tmp_path_factory.mktemp("sums") / "repo")
    r.repro()
    return r


def _diff(p, cell, root, without_sums, tmp):
    model, dtype, _ = cell.split("-", 2)
    cap, base = root / "artifacts/capture" / cell, root / "artifacts/baseline" / model / dtype
    if without_sums:  # the same artifacts with no oracle_sums.json: the diff computes from the arrays
        for src in (cap, base, root / "artifacts/reference" / model):  # own.parquet: values cast from fp64 (`base`)
            dst = tmp / src.relative_to(root)
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns(sums.FILE))
        cap, base = tmp / cap.relative_to(root), tmp / base.relative_to(root)
    cell = diff.load(cap, root / "artifacts/reference" / model, base)
    cd = diff.diff_cell(schema.rule(p, model, dtype, cell.names), cell)
    return json.dumps({"layers": [d.as_dict() for d in cd.layers], "own": cd.own, "summary": cd.summary,
                       "mode": cd.mode}, sort_keys=True)


@pytest.mark.parametrize("strict", [False, True], ids=["default", "failing"])
def test_verdicts_from_sums_equal_verdicts_from_arrays(built, tmp_path, strict, monkeypatch):
    """Every cell of the 4-cell pipeline, at its own oracle settings and at k = 1e-6 (every layer
    fails, so the drift origin's cause is computed from the values too): identical JSON both ways;
    with sums, a passing cell reads no fp64 reference and no own.parquet."""
    root = built.path
    p = yaml.safe_load((root / "params.yaml").read_text())
    if strict:
        p = copy.deepcopy(p)
        for d in p["dtypes"].values():
            d["oracle"] = {"k": 1e-6, "slack": 0.0}
    cells = [f"tiny_mlp-{d}-{q}" for d in ("fp32", "fp16") for q in ("torch_cpu", "ort_cpu")]
    for cell in cells:
        assert (root / "artifacts/capture" / cell / sums.FILE).exists(), cell
        read = []
        real = store.read_dict
        monkeypatch.setattr(store, "read_dict", lambda path: read.append(str(path)) or real(path))
        with_sums = _diff(p, cell, root, False, tmp_path / cell / "a")
        monkeypatch.setattr(store, "read_dict", real)
        assert with_sums == _diff(p, cell, root, True, tmp_path / cell / "b"), cell
        summary = json.loads(with_sums)["summary"]
        assert summary["verdict_mode"] == "oracle"
        assert summary["passed"] is (not strict), (cell, summary)
        if not strict:
            assert not [f for f in read if f.endswith(("fp64.parquet", "own.parquet"))], read


@pytest.mark.slow
def test_each_shape_of_a_two_shape_model_judges_the_same_from_sums(tmp_path):
    """models.<m>.shapes: the diff judges each shape's sample set (a slice of the sums) exactly as from
    that shape's arrays, own-error records included."""
    from parity.config import inputspec

    r = make_repo(tmp_path / "repo", models=("transformer_seq",), dtypes=("fp32",), providers=("ort_cpu",))
    r.repro()
    p = yaml.safe_load((r.path / "params.yaml").read_text())
    sets = inputspec.sample_sets(p["models"]["transformer_seq"], p.get("inputs", {}).get("samples", 1))
    assert len(sets) == 2
    cell = "transformer_seq-fp32-ort_cpu"
    status = json.loads((r.path / "artifacts/capture" / cell / "status.json").read_text())
    for _, rng in sets:
        got = []
        for without in (False, True):
            d = tmp_path / ("arrays" if without else "sums")
            cap, base = r.path / "artifacts/capture" / cell, r.path / "artifacts/baseline/transformer_seq/fp32"
            if without:  # the artifacts' layout kept: own.parquet reads values cast from fp64 (`base`)
                for src in (cap, base, r.path / "artifacts/reference/transformer_seq"):
                    shutil.copytree(src, d / src.relative_to(r.path), ignore=shutil.ignore_patterns(sums.FILE),
                                    dirs_exist_ok=True)
                cap, base = d / cap.relative_to(r.path), d / base.relative_to(r.path)
            values = diff.load(cap, r.path / "artifacts/reference/transformer_seq", base)
            rule = schema.rule(p, "transformer_seq", "fp32", values.names)
            assert [idx for _, idx in rule.sample_sets] == [idx for _, idx in sets]  # as the inputs stage numbers them
            cd = diff.diff_cell(rule, values, samples=rng, status=status)
            assert cd.mode == "oracle" and cd.own
            got.append(json.dumps({"layers": [x.as_dict() for x in cd.layers], "own": cd.own,
                                   "summary": cd.summary}, sort_keys=True))
        assert got[0] == got[1], rng


def test_own_values_streamed_one_by_one_give_the_same_sums_and_file(tmp_path):
    """StoreSink.own writes and sums each own value, then drops it (the list is emptied), reading
    the fp64 reference row group by row group (store.Rows): oracle_sums.json is the bytes the
    whole-list computation gives, own.parquet its values; a repeated name keeps dict()'s place and value."""
    import numpy as np

    from parity.backends.runner import CaptureResult
    from parity.pipeline.sink import StoreSink

    rng = np.random.default_rng(3)
    names = ["a", "b", "c"]
    gold = [{n: rng.standard_normal((4, 5)) for n in names + ["pre:b", "pre:c", "output"]} for _ in range(2)]
    with store.writer(tmp_path / "fp64.parquet", budget=300) as w:  # a row group per tensor or two
        w.extend(store.Tensor(k, n, i, v) for k, g in enumerate(gold) for i, (n, v) in enumerate(g.items()))
    own = [[("between:b", g["pre:b"].astype(np.float32)), ("b", g["b"].astype(np.float32) + 1),
            ("a", g["a"].astype(np.float32)), ("b", g["b"].astype(np.float32)),
            ("between:output", g["output"][:2].astype(np.float32))] for g in gold]
    layers = [[(n, g[n].astype(np.float32)) for n in names] for g in gold]
    sink = StoreSink(tmp_path / "out", {"cell": "x"}, {"cell": "x", "kind": "own"}, True)
    rows = store.Rows(tmp_path / "fp64.parquet")
    for (k, g), named, mine in zip(rows.by_sample(), layers, own):
        sink.sample(k, named, g)
        handed = list(mine)
        sink.own(k, handed, g)
        assert handed == []
    sink.finish(CaptureResult("OK"))
    want = sums.compute(layers, own, gold)
    assert json.loads((tmp_path / "out" / sums.FILE).read_text()) == json.loads(json.dumps(want))
    assert list(want["own"]) == ["between:b", "b", "a", "between:output"]
    store.write(tmp_path / "own.parquet", [store.Tensor(k, n, i, v) for k, named in enumerate(own)
                                           for i, (n, v) in enumerate(named)], {"cell": "x", "kind": "own"})
    # the same values; the streamed file stores those that are their fp64 reference value cast as
    # references to it (store.BASE: `a`, `between:b`, the second `b`), the others of its shape as their
    # bits XOR it (store.XOR: the first `b`), read back through the reference
    streamed, whole = list(store.read(tmp_path / "out/own.parquet")), list(store.read(tmp_path / "own.parquet"))
    assert [(t.sample, t.name, t.order) for t in streamed] == [(t.sample, t.name, t.order) for t in whole]
    for a, b in zip(streamed, whole):
        assert store.same_bytes(a.array, b.array), a.name
    assert store.Rows(tmp_path / "out/own.parquet").same_as[:5] == ["base:pre:b", "xor:b", "base:a", "base:b", None]
