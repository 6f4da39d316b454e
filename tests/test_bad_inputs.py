"""Bad inputs a hostile user tries (issue 25, items 1-16): each is refused with one line naming the
problem, a non-zero exit status, and nothing written or changed (the md5 of artifacts/, params.yaml
and conf/ before and after). One composed repository (real DVC, real git) serves every test; none
runs the pipeline."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import BIN, composed, config_error, make_repo, tree_digest

OPDIFF = """\
dims: {B: 2}
presets:
  x: {type: tensor, shape: [B, 4], kind: float, init: normal}
tests:
  - id: relu
    op: aten::relu
    in: [{ref: x}]
"""

FILE_MODEL = """\
{name}:
  arch:
    source: parity
    name: mlp
    kwargs: {{in_features: 16, hidden: 32, out_features: 8}}
  input:
    - {{name: input, shape: [4, 16], dtype: float32, init: file, path: data/inputs/{name}.npy}}
  tolerances: []
"""

NONE_MODEL = """\
import torch


class Nothing(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)

    def forward(self, x):
        self.fc(x)
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_repo(tmp_path_factory.mktemp("bad") / "repo", dtypes=("fp32",))


def state(repo) -> dict:
    """What a refused command must leave as it was."""
    p = repo.path
    return {"artifacts": tree_digest(p / "artifacts"), "conf": tree_digest(p / "conf"),
            "params": hashlib.md5((p / "params.yaml").read_bytes()).hexdigest()}


def refused(repo, cmd: list[str], rc: int = 2) -> str:
    """Run `cmd` in the repo; assert it exits `rc` with one line on stderr and changes nothing; the line."""
    before = state(repo)
    p = repo.run(cmd, check=False)
    lines = [ln for ln in p.stderr.splitlines()  # argparse's usage (and its indented lines) comes first
             if ln.strip() and not ln.startswith(("usage:", " "))]
    assert p.returncode == rc, (p.returncode, p.stdout, p.stderr)
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert state(repo) == before
    return lines[0]


def parity(*args) -> list[str]:
    return [f"{BIN}/parity", *args]


# 1, 2, 10: import-opdiff


def test_import_opdiff_never_overwrites_a_suite_without_force(repo):
    (repo.path / "x").mkdir(exist_ok=True)
    (repo.path / "x/critical.yaml").write_text(OPDIFF)
    for cmd in (["x/critical.yaml"], ["x/critical.yaml", "--name", "critical"]):
        line = refused(repo, parity("suite", "import-opdiff", *cmd))
        assert "conf/suites/critical.yaml exists" in line and "--force" in line, line
    out = repo.path / "conf/suites/mine.yaml"
    assert repo.run(parity("suite", "import-opdiff", "x/critical.yaml", "--name", "mine")).returncode == 0
    first = out.read_bytes()
    out.write_text("# edited\n")
    line = refused(repo, parity("suite", "import-opdiff", "x/critical.yaml", "--name", "mine"))
    assert "conf/suites/mine.yaml exists" in line
    assert repo.run(parity("suite", "import-opdiff", "x/critical.yaml", "--name", "mine", "--force")).returncode == 0
    assert out.read_bytes() == first
    out.unlink()


def test_import_opdiff_refuses_a_name_that_is_a_path(repo, tmp_path):
    (repo.path / "od.yaml").write_text(OPDIFF)
    target = tmp_path / "x" / "pwn"
    rel = os.path.relpath(target, repo.path / "conf" / "suites")
    line = refused(repo, parity("suite", "import-opdiff", "od.yaml", "--name", rel))
    assert f"suite name '{rel}' is not a plain name ([A-Za-z0-9_]" in line, line
    assert not target.parent.exists()


@pytest.mark.parametrize("src, says", [
    ("conf/models/mlp.yaml", "not an opdiff suite (a YAML mapping with tests:"),
    ("/etc/passwd", "not an opdiff suite"),
    ("bad_opdiff.yaml", "bad_opdiff.yaml:2:3: expected the node content"),
])
def test_import_opdiff_refuses_files_that_are_not_opdiff_suites(repo, src, says):
    (repo.path / "bad_opdiff.yaml").write_text("tests: [\n  - {a: 1\n")
    line = refused(repo, parity("suite", "import-opdiff", src, "--name", "notasuite"))
    assert says in line, line
    assert not (repo.path / "conf/suites/notasuite.yaml").exists()


# 3, 14: input files


@pytest.mark.parametrize("name, array, says", [
    ("nans", np.where(np.arange(128) % 9 == 0, np.nan, 1.0).astype(np.float32).reshape(2, 4, 16),
     "input 'input' (init: file, path: data/inputs/nans.npy): 15 non-finite values (NaN/Inf) in the 2 samples"),
    ("infs", np.full((2, 4, 16), np.inf, np.float32),
     "input 'input' (init: file, path: data/inputs/infs.npy): 128 non-finite values"),
    ("words", np.array([[["a"] * 16] * 4] * 2),
     "input 'input' (init: file, path: data/inputs/words.npy): array of dtype <U1 (strings)"),
    # issue 36 item 2: finite float64 values beyond float32's range passed the check and were stored as inf
    ("huge", np.where(np.arange(128) % 32 == 0, 1e300, 1.0).reshape(2, 4, 16),
     "input 'input' (init: file, path: data/inputs/huge.npy): 4 values beyond float32's range (largest |x| "
     "1e+300 in the file's float64; float32 holds up to 3.403e+38) become inf in the float32 input"),
])
def test_inputs_stage_refuses_a_file_of_nonfinite_or_nonnumeric_values(repo, name, array, says):
    (repo.path / "data/inputs").mkdir(parents=True, exist_ok=True)
    np.save(repo.path / f"data/inputs/{name}.npy", array)
    (repo.path / f"conf/models/{name}.yaml").write_text(FILE_MODEL.format(name=name))
    try:
        repo.run(parity("compose", "--params", f"{name}.params.yaml", "-S", f"models=[{name}]"))
        line = refused(repo, [sys.executable, "-m", "stages.inputs", "--params", f"{name}.params.yaml", "--model",
                              name, "--out", f"artifacts/inputs/{name}.parquet"], rc=1)
    finally:
        (repo.path / f"conf/models/{name}.yaml").unlink()
    assert line.startswith(f"inputs@{name}: models.{name}.{says}"), line


# 4, 9: numbers at compose


@pytest.mark.parametrize("override, says", [
    ("dtypes.fp32.tol.atol=nan", "dtypes.fp32.tol.atol: expected a finite number, got nan"),
    ("dtypes.fp32.tol.rtol=inf", "dtypes.fp32.tol.rtol: expected a finite number, got inf"),
    ("inputs.samples=100000000", "models.tiny_mlp: its inputs would take 23.8 GiB (100000000 samples of "
                                 "input [4, 16] float32 + 4 calibration), over the 4 GiB cap: lower inputs.samples"),
])
def test_compose_refuses_nonfinite_tolerances_and_inputs_past_memory(repo, override, says):
    line = refused(repo, parity("compose", "-S", override))
    assert line == f"parity: config error: {says}" or line.startswith(f"parity: config error: {says}"), line


def test_nonfinite_oracle_and_huge_shapes_are_config_errors():
    p = composed("models=[mlp]", "dtypes=[fp16]")
    for key in ("k", "slack"):
        msg = config_error(p, lambda q, key=key: q["dtypes"]["fp16"]["oracle"].update({key: float("nan")}))
        assert msg == f"dtypes.fp16.oracle.{key}: expected a finite number, got nan"
    msg = config_error(p, lambda q: q["models"]["mlp"]["input"][0].update(shape=[100000, 100000]))
    assert msg.startswith("models.mlp: its inputs would take ") and "over the 4 GiB cap" in msg, msg
    assert "PARITY_MAX_INPUT_GIB" in msg


# 5: arch.source: import


@pytest.mark.parametrize("name, says", [
    ("os:system", "'os' is the Python standard library, not a model"),
    ("builtins:eval", "'builtins' is the Python standard library"),
    ("subprocess:Popen", "'subprocess' is the Python standard library"),
    ("parity.commands.sweep:sweep", "'parity.commands.sweep' is parity's own code"),
    ("yaml:safe_load", "'yaml' ("),
])
def test_import_models_are_narrowed_to_the_repo_and_declared_packages(name, says):
    p = composed("models=[mlp]")
    msg = config_error(p, lambda q: q["models"]["mlp"]["arch"].update(source="import", name=name,
                                                                      kwargs={"command": "touch /tmp/pwned"}))
    assert msg.startswith(f"models.mlp.arch.name: {says}"), msg
    if name.startswith("yaml"):
        assert "is not in this repository" in msg and "declare it with `import: yaml` in models.mlp.arch" in msg


def test_compose_refuses_os_system_as_a_model(repo):
    (repo.path / "conf/models/pwn.yaml").write_text(
        'pwn:\n  arch: {source: import, name: "os:system", kwargs: {command: "touch pwned"}}\n'
        "  input:\n    - {name: input, shape: [4, 16], dtype: float32}\n")
    try:
        line = refused(repo, parity("compose", "-S", "models=[pwn]"))
    finally:
        (repo.path / "conf/models/pwn.yaml").unlink()
    assert "models.pwn.arch.name: 'os' is the Python standard library, not a model" in line, line
    assert not (repo.path / "pwned").exists()


# 6: a forward that returns None


def test_export_refuses_a_model_whose_forward_returns_none(repo):
    (repo.path / "nonemodel.py").write_text(NONE_MODEL)
    (repo.path / "conf/models/nothing.yaml").write_text(
        "nothing:\n  arch: {source: import, name: 'nonemodel:Nothing'}\n"
        "  input:\n    - {name: input, shape: [4, 16], dtype: float32}\n")
    try:
        repo.run(parity("compose", "--params", "none.params.yaml", "-S", "models=[nothing]"))
        line = refused(repo, [sys.executable, "-m", "stages.export", "--params", "none.params.yaml", "--model",
                              "nothing", "--out", "artifacts/models/nothing"], rc=1)
    finally:
        (repo.path / "conf/models/nothing.yaml").unlink()
    assert line.startswith("export@nothing: models.nothing: forward returned None"), line


# 7, 13: suite files and params.yaml


def test_suite_case_id_with_a_slash_is_refused(repo):
    (repo.path / "conf/suites/slashed.yaml").write_text(
        "slashed:\n  spec:\n    cases:\n      - {id: a/b, op: aten::relu, inputs: [{shape: [2]}]}\n")
    try:
        line = refused(repo, parity("suite", "validate", "slashed"))
    finally:
        (repo.path / "conf/suites/slashed.yaml").unlink()
    assert "case 'a/b': key 'id': a case id may not contain '/'" in line, line


def test_tagged_suite_and_params_say_file_line_col(repo):
    (repo.path / "conf/suites/tagged.yaml").write_text("tagged:\n  spec: !!python/object/apply:os.system [id]\n")
    try:
        line = refused(repo, parity("suite", "validate", "tagged"))
    finally:
        (repo.path / "conf/suites/tagged.yaml").unlink()
    assert "conf/suites/tagged.yaml:2:9: YAML error: could not determine a constructor for the tag" in line, line
    (repo.path / "tag.params.yaml").write_text("models: !!python/name:os.system\n")
    (repo.path / "broken.params.yaml").write_text("models: [\n")
    line = refused(repo, parity("check", "--params", "tag.params.yaml"))
    assert line.startswith("parity: config error: tag.params.yaml:1:9: YAML error: could not determine"), line
    line = refused(repo, parity("check", "--params", "broken.params.yaml"))
    assert line.startswith("parity: config error: broken.params.yaml:2:1: YAML error: expected the node"), line
    p = repo.run(parity("check", "--params", "tag.params.yaml", "--json"), check=False)
    doc = json.loads(p.stdout)
    assert p.returncode == 2 and doc["ok"] is False and doc["error"].startswith("tag.params.yaml:1:9: YAML error")


# 8: a cluster address nobody answers


def test_worker_and_repro_give_up_on_a_closed_port(repo):
    pytest.importorskip("ray")
    line = refused(repo, parity("worker", "--address", "127.0.0.1:1", "--connect-timeout", "2"))
    assert line.startswith("parity worker: no Ray head answers at '127.0.0.1:1'") and "refused" in line, line
    line = refused(repo, parity("repro", "--cluster", "127.0.0.1:1", "--connect-timeout", "2"))
    assert line.startswith("parity: repro --cluster: cannot reach Ray at '127.0.0.1:1': no Ray head answers"), line


def test_repro_gives_up_on_a_port_where_something_else_listens(repo):
    """Issue 36 item 6: a listener that accepts and never answers (not Ray) kept `repro --cluster` waiting
    for ever (Ray retries every ~40 s); --connect-timeout bounds it, one line."""
    import socket
    import threading

    pytest.importorskip("ray")
    srv = socket.create_server(("127.0.0.1", 0))
    port, held = srv.getsockname()[1], []
    threading.Thread(target=lambda: [held.append(srv.accept()) for _ in range(4)], daemon=True).start()
    try:
        for cmd, says in ((("worker", "--address"), "parity worker: no Ray head answers at"),
                          (("repro", "--cluster"), "parity: repro --cluster: cannot reach Ray at")):
            line = refused(repo, parity(*cmd, f"127.0.0.1:{port}", "--connect-timeout", "2"))
            assert line.startswith(says) and "a program listens there but does not answer as a Ray head" in line, line
    finally:
        srv.close()


# 11: two repro at once


def test_a_second_repro_says_the_repository_is_locked(repo):
    from parity.commands.parallel import repo_lock

    with repo_lock(repo.path):
        before = state(repo)
        p = repo.run(parity("repro", "-j", "2"), check=False)
        assert state(repo) == before
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip() == ("parity: repro: the repository is locked by another run "
                                f"(parity repro pid {os.getpid()}, .dvc/tmp/parity-repro.lock): wait for it to "
                                "finish, or stop it; no cell was run"), p.stderr
    assert "PASS" not in p.stderr + p.stdout and "FAIL" not in p.stderr + p.stdout


# 12, 16: corrupt artifacts


def test_corrupt_metrics_are_named_with_how_to_restore_them(repo):
    summary = repo.path / "artifacts/report/summary.json"
    metrics = repo.path / "artifacts/diff/tiny_mlp-fp32-torch_cpu/metrics.json"
    for f in (summary, metrics):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text('{"cells": {')
    try:
        line = refused(repo, parity("compare", "HEAD"))
        assert line.startswith("parity compare: corrupt: artifacts/report/summary.json: Expecting property name"), line
        assert "`dvc checkout artifacts/report/summary.json`" in line and line.endswith("`dvc repro -f -s report`")
        for extra in ([], ["--json"]):
            line = refused(repo, parity("show", "tiny_mlp-fp32-torch_cpu", *extra))
            assert line.startswith("parity show: corrupt: artifacts/diff/tiny_mlp-fp32-torch_cpu/metrics.json: "
                                   "Expecting property name"), line
    finally:
        summary.unlink()
        metrics.unlink()


def test_a_corrupt_parquet_names_the_artifact_and_its_stage(tmp_path, monkeypatch):
    from parity.core import io, store

    monkeypatch.chdir(tmp_path)
    f = Path("artifacts/capture/m-fp32-ort_cpu/layers.parquet")
    f.parent.mkdir(parents=True)
    f.write_bytes(b"PAR1" + bytes(range(200)) + b"garbage")
    Path("dvc.lock").write_text("schema: '2.0'\nstages:\n  capture@m-fp32-ort_cpu:\n    cmd: x\n    outs:\n"
                                "    - path: artifacts/capture/m-fp32-ort_cpu\n")
    with pytest.raises(io.Corrupt) as e:
        list(store.read(f))
    msg = str(e.value)
    assert msg.startswith(f"corrupt: {f}: ") and "\n" not in msg, msg
    assert msg.endswith("remove it and re-run its stage: `dvc repro -f -s capture@m-fp32-ort_cpu`"), msg
    with pytest.raises(FileNotFoundError):
        list(store.read("artifacts/none.parquet"))


# 15: counts


@pytest.mark.parametrize("cmd, says", [
    (["repro", "-j", "0"], "parity repro: error: argument -j/--jobs: expected an integer >= 1, got 0"),
    (["repro", "-j", "-3"], "parity repro: error: argument -j/--jobs: expected an integer >= 1, got -3"),
    (["exp", "-n", "-5"], "parity exp: error: argument -n/--num: expected an integer >= 1, got -5"),
    (["fuzz", "critical", "--dtype", "fp32", "--provider", "ort_cpu", "--cases", "-5"],
     "parity fuzz: error: argument --cases: expected an integer >= 1, got -5"),
])
def test_counts_below_one_are_refused(repo, cmd, says):
    assert refused(repo, parity(*cmd)) == says
    assert not (repo.path / "parity-fuzz").exists()
