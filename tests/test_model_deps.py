"""Every file a model reads is its dependency, hashed by streaming, and a DVC-tracked model loads
(issue 34: parity.core.modelfiles, parity.core.codedeps.models_code, parity.models.onnx_weights).

- An ONNX file's dependency is the file and every external-data location its tensors name (a
  subfolder's `data/w.bin`, an If branch's initializer), nothing else beside it: a changed byte there
  re-runs exactly that model's stages, an unrelated file (a 1 TiB sparse one too) changes nothing and
  is never opened.
- A checkpoint folder's dependency is what transformers reads; a `weights:` file is one too.
- Files are hashed in fixed-size reads, remembered by stat under .dvc/tmp.
- External data reached through DVC's hard links or its symlinks into the cache loads; `../`,
  absolute locations, a symlink elsewhere and a declared length past a file's end are refused.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import BIN, ROOT, env, make_repo
from tests.test_onnx_source import model_conf, tiny_graph


def _externalize(t, folder: Path, location: str) -> None:
    """Move tensor `t`'s bytes to the end of folder/location (created with its folders) as ONNX
    external data."""
    from onnx import numpy_helper

    from parity.models import onnx_weights

    raw = numpy_helper.to_array(t).tobytes()
    f = folder / location
    f.parent.mkdir(parents=True, exist_ok=True)
    with open(f, "ab") as out:
        off = out.tell()
        out.write(raw)
    onnx_weights.set_external(t, location, off, len(raw))


def _if_model(folder: Path):
    """y = x @ w + (If(c): then x @ wt, else x @ we), each weight external: w in data/w.bin, the
    branches' initializers in data/sub/then.bin and else.bin; an unrelated file beside them."""
    import onnx
    from onnx import TensorProto as T, helper as h, numpy_helper as nh

    rng = np.random.default_rng(1)

    def branch(name):
        w = nh.from_array(rng.standard_normal((8, 8)).astype(np.float32), f"w_{name}")
        _externalize(w, folder, f"data/sub/{name}.bin")
        return h.make_graph([h.make_node("MatMul", ["x", f"w_{name}"], [f"o_{name}"])], name, [],
                            [h.make_tensor_value_info(f"o_{name}", T.FLOAT, [1, 8])], [w])

    w = nh.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    _externalize(w, folder, "data/w.bin")
    nodes = [h.make_node("MatMul", ["x", "w"], ["a"]),
             h.make_node("If", ["c"], ["b"], then_branch=branch("then"), else_branch=branch("else")),
             h.make_node("Add", ["a", "b"], ["y"])]
    g = h.make_graph(nodes, "if", [h.make_tensor_value_info("x", T.FLOAT, [1, 8]),
                                   h.make_tensor_value_info("c", T.BOOL, [])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 8])], [w])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    onnx.save(m, str(folder / "m.onnx"))
    (folder / "unrelated.bin").write_bytes(b"not read by the model")
    return folder / "m.onnx"


def test_onnx_dependency_is_the_file_and_every_location_its_tensors_name(tmp_path):
    import onnx
    from onnx.external_data_helper import _get_all_tensors

    from parity.core import codedeps, modelfiles

    p = _if_model(tmp_path)
    m = onnx.load(str(p), load_external_data=False)
    by_onnx = {e.value for t in _get_all_tensors(m) for e in t.external_data if e.key == "location"}
    assert modelfiles.onnx_locations(p) == sorted(by_onnx) == ["data/sub/else.bin", "data/sub/then.bin", "data/w.bin"]
    code = codedeps.onnx_file_code(p)
    assert sorted(code["files"]) == ["data/sub/else.bin", "data/sub/then.bin", "data/w.bin", "m.onnx"], code
    (tmp_path / "unrelated.bin").write_bytes(b"changed")  # not read: nothing changes
    assert codedeps.onnx_file_code(p) == code
    f = tmp_path / "data/sub/then.bin"
    f.write_bytes(bytes(len(f.read_bytes())))  # the same size, zeros: that entry, and only it, changes
    new = codedeps.onnx_file_code(p)
    assert {k for k in code["files"] if code["files"][k] != new["files"][k]} == {"data/sub/then.bin"}


HWM = ("\nimport sys\nsys.stdout.flush()\nprint('VmHWM', next(ln.split()[1] for ln in open('/proc/self/status') "
       "if ln.startswith('VmHWM')), file=sys.stderr)")


def _max_rss_mb(code: str, cwd: Path) -> tuple[float, float, str]:
    """(peak RSS in MiB, seconds, stdout) of `python -c code` in `cwd`: the process's own high-water mark
    (VmHWM, per address space). Not wait4's ru_maxrss: on Linux it keeps the RSS the forked child had
    before exec, the pytest worker's (419 MiB under xdist, for a 16 MiB hash)."""
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code + HWM], cwd=cwd, env={**env(), "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    kb = int(next(ln.split()[1] for ln in p.stderr.splitlines() if ln.startswith("VmHWM")))
    return kb / 1024, time.monotonic() - t0, p.stdout


def test_files_are_hashed_by_streaming_and_a_sparse_tib_beside_a_model_is_never_opened(tmp_path):
    from parity.core import modelfiles

    small = tmp_path / "small.bin"
    small.write_bytes(os.urandom(3 << 20))
    import hashlib

    assert modelfiles.Digests().sha256(small) == hashlib.sha256(small.read_bytes()).hexdigest()
    # a file the model reads is streamed: 256 MiB (sparse zeros) hashed in bounded memory
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(256 << 20)
    rss, secs, out = _max_rss_mb(f"from parity.core import modelfiles; print(modelfiles.Digests().sha256({str(big)!r}))",
                                 tmp_path)
    assert out.strip() == "a6d72ac7690f53be6ae46ba88506bd97302a093f7108472bd9efc3cefda06484"  # sha256sum's
    assert rss < 128, f"peak RSS {rss:.0f} MiB hashing a 256 MiB file"
    # a 1 TiB sparse file beside an ONNX model: not a file it reads, so never opened (atime kept)
    p = _if_model(tmp_path / "model")
    tib = tmp_path / "model" / "disk.img"
    with open(tib, "wb") as f:
        f.truncate(1 << 40)
    os.utime(tib, (1_000_000, tib.stat().st_mtime))
    rss, secs, out = _max_rss_mb(f"import json; from parity.core import codedeps; "
                                 f"print(json.dumps(codedeps.onnx_file_code(__import__('pathlib').Path({str(p)!r}))))",
                                 tmp_path)
    assert "disk.img" not in json.loads(out)["files"] and rss < 128 and secs < 60, (rss, secs)
    assert tib.stat().st_atime == 1_000_000  # not read (relatime would move an atime older than mtime)


def test_digests_are_remembered_by_stat_and_recomputed_when_the_file_changes(tmp_path, monkeypatch):
    from parity.core import modelfiles

    monkeypatch.setattr(modelfiles, "RACY_S", 0.0)
    (tmp_path / ".dvc").mkdir()
    f = tmp_path / "w.bin"
    f.write_bytes(b"a" * 4096)
    d = modelfiles.Digests.for_repo(tmp_path)
    first = d.sha256(f)
    d.save()
    store = tmp_path / modelfiles.DIGESTS
    saved = json.loads(store.read_text())
    key = os.path.abspath(f)
    assert saved[key][-1] == first
    saved[key][-1] = "remembered"  # a remembered digest is used as long as the stat is the same
    store.write_text(json.dumps(saved))
    assert modelfiles.Digests.for_repo(tmp_path).sha256(f) == "remembered"
    f.write_bytes(b"b" * 4096)  # same size: ctime/mtime move, so it is hashed again
    assert modelfiles.Digests.for_repo(tmp_path).sha256(f) not in ("remembered", first)


def test_checkpoint_folder_and_weights_file_dependencies_are_what_the_loaders_read(tmp_path):
    from parity.core import codedeps, modelfiles

    ck = tmp_path / "ck"
    ck.mkdir()
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": shards[0], "b": shards[1]}}))
    read = [*shards, "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model"]
    for n in read + ["pytorch_model.bin", "README.md", ".gitattributes", "old.safetensors"]:
        (ck / n).write_bytes(n.encode())
    (ck / "sub").mkdir()
    (ck / "sub" / "config.json").write_text("{}")
    assert modelfiles.hf_files(ck) == sorted([*read, "model.safetensors.index.json"])
    (tmp_path / "w.safetensors").write_bytes(b"weights")
    models = {"c": {"arch": {"source": "hf", "path": str(ck)}},
              "t": {"arch": {"source": "torchvision", "name": "resnet18", "weights": str(tmp_path / "w.safetensors")}},
              "p": {"arch": {"source": "parity", "name": "mlp"}}}
    code = codedeps.models_code(models, digests=modelfiles.Digests())
    assert code["p"] == {"source": "parity"} and sorted(code["c"]["files"]) == modelfiles.hf_files(ck)
    assert list(code["t"]["weights"]) == [str(tmp_path / "w.safetensors")]
    (ck / "README.md").write_text("edited")
    (ck / "pytorch_model.bin").write_bytes(b"not read: safetensors are")
    assert codedeps.models_code(models, digests=modelfiles.Digests()) == code
    (ck / shards[1]).write_bytes(b"changed")
    new = codedeps.models_code(models, digests=modelfiles.Digests())
    assert {k for k in code["c"]["files"] if code["c"]["files"][k] != new["c"]["files"][k]} == {shards[1]}
    assert new["t"] == code["t"]
    # transformers' order: model.safetensors before an index and pytorch_model.bin; an index's shard
    # naming a path out of the folder is not followed
    (ck / "model.safetensors").write_bytes(b"single")
    assert modelfiles.hf_files(ck) == sorted([*read[2:], "model.safetensors"])
    (ck / "model.safetensors").unlink()
    (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": shards[0], "b": "../../x"}}))
    assert shards[0] in modelfiles.hf_files(ck) and not any(".." in n for n in modelfiles.hf_files(ck))


def _simple(folder: Path, location="data/w.bin"):
    """tiny_graph() saved at folder/m.onnx with every initializer in folder/`location`."""
    import onnx

    (folder / location).parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(tiny_graph(), str(folder / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location, size_threshold=0)
    return folder / "m.onnx"


def _relocate(p: Path, **kv):
    """Rewrite every external tensor's `location`/`length` entries of the graph at `p`."""
    import onnx

    m = onnx.load(str(p), load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key in kv:
                e.value = str(kv[e.key])
    p.write_bytes(m.SerializeToString())


def _outside(tmp_path):
    (tmp_path / "secret.bin").write_bytes((tmp_path / "model/data/w.bin").read_bytes())


def _spoil_symlink(tmp_path):
    p = tmp_path / "model" / "data" / "w.bin"
    shutil.move(p, tmp_path / "elsewhere.bin")
    p.symlink_to(tmp_path / "elsewhere.bin")


SPOILED = {
    "dotdot": (lambda t: (_outside(t), _relocate(t / "model/m.onnx", location="../secret.bin")), "outside the model's folder"),
    "absolute": (lambda t: (_outside(t), _relocate(t / "model/m.onnx", location=str(t / "secret.bin"))), "absolute path"),
    "symlink_out": (_spoil_symlink, "outside the model's folder and the DVC cache"),
    "huge_length": (lambda t: _relocate(t / "model/m.onnx", length=1 << 40), "truncated, or a bad range"),
}


@pytest.mark.parametrize("kind", sorted(SPOILED))
def test_external_data_outside_the_folder_or_past_its_file_is_refused(tmp_path, kind):
    from parity.core import codedeps
    from parity.models import onnx_weights
    from parity.models.onnx_source import OnnxSourceError, load_checked

    (tmp_path / "model").mkdir()
    p = _simple(tmp_path / "model")
    spoil, words = SPOILED[kind]
    spoil(tmp_path)
    with pytest.raises(OnnxSourceError, match="external data") as e:
        load_checked(p)
    assert words in str(e.value) and str(p) in str(e.value), e.value
    with pytest.raises(Exception, match="outside|absolute|past the end"):
        onnx_weights.pack(onnx_weights.load_graph(p), p.parent, tmp_path / "packed.bin")
    if kind != "huge_length":  # recorded, not read
        assert any(v.startswith("refused") for v in codedeps.onnx_file_code(p)["files"].values())


@pytest.mark.parametrize("cache_dir", [None, "../../shared-cache"])
def test_external_data_linked_into_the_dvc_cache_loads(tmp_path, cache_dir):
    """A hard link (DVC's hardlink cache type) and a symlink into the DVC cache (its symlink type, the
    cache where .dvc/config's cache.dir puts it) load, checked and read through the link; onnx's own
    loader refuses both."""
    import onnx

    from parity.models import onnx_weights
    from parity.models.onnx_source import load_checked

    repo = tmp_path / "repo"
    (repo / ".dvc").mkdir(parents=True)
    cache = repo / ".dvc" / "cache"
    if cache_dir:
        (repo / ".dvc" / "config").write_text(f"[core]\n    autostage = true\n[cache]\n    dir = {cache_dir}\n")
        cache = (repo / ".dvc" / cache_dir).resolve()
    (repo / "models").mkdir()
    p = _simple(repo / "models")
    want = onnx_weights.load_with_data(p)
    onnx_weights.pack(onnx_weights.load_graph(p), p.parent, tmp_path / "plain.bin")
    w = repo / "models" / "data" / "w.bin"
    obj = cache / "files" / "md5" / "ab" / "cdef"
    obj.parent.mkdir(parents=True)
    os.link(w, obj)  # hard link: two links
    for link in ("hard", "sym"):
        if link == "sym":
            w.unlink()
            w.symlink_to(obj)
        with pytest.raises(onnx.checker.ValidationError, match="hard links|symbolic link"):
            onnx.checker.check_model(str(p))
        m = load_checked(p)
        assert onnx_weights.with_data(m, p.parent) == want
        onnx_weights.pack(onnx_weights.load_graph(p), p.parent, tmp_path / f"{link}.bin")
        assert (tmp_path / f"{link}.bin").read_bytes() == (tmp_path / "plain.bin").read_bytes()


def _onnx_two_model_repo(path: Path):
    r = make_repo(path, dtypes=("fp32",), providers=("ort_cpu",), compose=False)
    (r.path / "models" / "tiny").mkdir(parents=True)
    _simple(r.path / "models" / "tiny")
    (r.path / "conf" / "models" / "tiny_onnx.yaml").write_text(model_conf("tiny_onnx", "models/tiny/m.onnx"))
    r.set_defaults(models=("tiny_mlp", "tiny_onnx"))
    r.run([f"{BIN}/parity", "compose"])
    return r


def test_dvc_tracked_onnx_model_runs_and_reruns_exactly_when_the_bytes_it_reads_change(tmp_path):
    """`dvc add models/tiny` (the project's cache.type: hard links) and the pipeline runs it; an
    unrelated file and a 1 TiB sparse file beside it re-run nothing (env only) and are not read; new
    bytes in its subfolder's external data re-run exactly that model's stages; DVC's symlink cache
    type loads too (the same bytes: nothing re-runs)."""
    r = _onnx_two_model_repo(tmp_path / "repo")
    r.run(["dvc", "add", "models/tiny"])
    w = r.path / "models/tiny/data/w.bin"
    assert w.stat().st_nlink >= 2  # linked to its cache object
    r.commit("tracked model")
    ran = r.repro()
    assert {"export@tiny_onnx", "reference_onnx@tiny_onnx", "export@tiny_mlp"} <= set(ran), ran
    m = json.loads((r.path / "artifacts/diff/tiny_onnx-fp32-ort_cpu/metrics.json").read_text())
    assert m["verdict"] == "PASS", m
    (r.path / "models/tiny/notes.bin").write_bytes(b"beside the model, not read by it")
    tib = r.path / "models/tiny/disk.img"
    with open(tib, "wb") as f:
        f.truncate(1 << 40)
    os.utime(tib, (1_000_000, tib.stat().st_mtime))
    t0 = time.monotonic()
    assert r.repro() == ["env/dvc.yaml:env"]
    assert time.monotonic() - t0 < 120 and tib.stat().st_atime == 1_000_000
    tib.unlink()
    data = np.frombuffer(w.read_bytes(), np.float32) * np.float32(0.5)  # new bytes, as a re-export writes them
    tmp = w.with_name("w.new")
    tmp.write_bytes(data.tobytes())
    os.replace(tmp, w)
    ran = r.repro()
    assert {"export@tiny_onnx", "reference_onnx@tiny_onnx"} <= set(ran), ran
    per_item = [s for s in ran if "@" in s]  # the report, over every cell, re-runs too
    assert all("tiny_onnx" in s for s in per_item) and not any("tiny_mlp" in s for s in ran), ran
    r.run(["dvc", "add", "models/tiny"])
    r.run(["dvc", "config", "cache.type", "symlink"])
    r.run(["dvc", "checkout", "--relink", "models/tiny.dvc"])
    assert w.is_symlink()
    assert r.repro() == ["env/dvc.yaml:env"]  # the same bytes through the symlinks
    ran = r.repro("-f", "-s", "export@tiny_onnx")
    assert ran == ["export@tiny_onnx"], ran


def test_the_inputs_stage_depends_on_the_tokenizer_files_not_the_shards(tmp_path):
    """inputs@<model> tokenises `init: text` prompts with the checkpoint's tokenizer.json and bounds token
    ids by its config.json: those files (and only those) are in artifacts/code/<model>.inputs.json, which
    dvc.yaml's inputs stage depends on."""
    import yaml

    from parity.core import codedeps, modelfiles

    ck = tmp_path / "ck"
    ck.mkdir()
    for f, text in (("config.json", '{"model_type": "bert", "vocab_size": 10}'), ("tokenizer.json", "{}"),
                    ("model.safetensors", "weights"), ("README.md", "docs")):
        (ck / f).write_text(text)
    models = {"m": {"arch": {"source": "hf", "path": str(ck)}}, "z": {"arch": {"source": "parity", "name": "mlp"}}}
    code = lambda: codedeps.inputs_code(models, modelfiles.Digests(None))  # noqa: E731
    first = code()
    assert sorted(first["m.inputs"]["files"]) == ["config.json", "tokenizer.json"]
    assert first["z.inputs"] == {"source": "parity", "files": {}}
    (ck / "model.safetensors").write_text("other weights")
    assert code() == first
    (ck / "tokenizer.json").write_text('{"version": "1.0"}')
    assert code()["m.inputs"]["files"]["tokenizer.json"] != first["m.inputs"]["files"]["tokenizer.json"]
    st = yaml.safe_load((Path(__file__).parents[1] / "dvc.yaml").read_text())["stages"]["inputs"]
    assert "artifacts/code/${item.model}.inputs.json" in st["deps"]
