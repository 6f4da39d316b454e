"""A newcomer's first hour (issue 25, items 23-29): what `make run` installs and leaves behind, a sweep
on a machine with no git identity, the providers' devices, a dtype typo in a sweep, and the per-layer
DVC plot. Fast: in-process, or a few small subprocesses (make, git, dvc) in temporary folders; no
pipeline runs."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from conftest import BIN, ROOT, make_repo, run, tree_digest

MAKE = shutil.which("make")


# -- 25: `parity list providers` shows where each provider runs ------------------------------------

def test_list_providers_reads_the_device_from_each_providers_options():
    from parity.commands import listing

    dev = {r["name"]: r["device"] for r in listing.options("providers", ROOT)}
    assert dev["torch_cuda"] == "cuda" and dev["torch_compile_cuda"] == "cuda"  # options.device
    assert dev["ort_cuda"] == "cuda:0" and dev["ort_trt"] == "cuda:0"  # options.provider_options.device_id
    assert dev["trt"] == "cuda"  # uses: [cuda, tensorrt]
    assert {dev[p] for p in ("torch_cpu", "ort_cpu", "ort_cpu_noopt", "ort_int8", "ort_int4", "torch_compile")} == {"cpu"}


# -- 28 and 24: a sweep's bad dtype, a sweep without a git identity ---------------------------------

@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_repo(tmp_path_factory.mktemp("newcomer") / "repo", dtypes=("fp32",), providers=("ort_cpu",))


def state(repo) -> dict:
    p = repo.path
    return {"artifacts": tree_digest(p / "artifacts"), "conf": tree_digest(p / "conf"),
            "params": hashlib.md5((p / "params.yaml").read_bytes()).hexdigest()}


def one_line_refusal(repo, cmd: list[str]) -> str:
    before = state(repo)
    p = repo.run(cmd, check=False)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert state(repo) == before
    return lines[0]


DTYPES = "amp_bf16, amp_fp16, bf16, fp16, fp32, fp8_e4m3, int4_weight, int8_dynamic, int8_static, tf32"


@pytest.mark.parametrize("cmd, prefix", [
    (["sweep", "dtypes=fp32,fp61"], "parity sweep: dtypes=fp61: "),  # a scalar value: Hydra's own error before
    (["sweep", "dtypes=[fp32],[fp61]"], "parity sweep: dtypes=[fp61]: "),  # a list: the plugin's line already
    (["compose", "-S", "dtypes=fp61"], ""),
])
def test_a_dtype_typo_gives_the_clean_config_line_without_hydras_search_path(repo, cmd, prefix):
    line = one_line_refusal(repo, [f"{BIN}/parity", *cmd])
    clean = (f"parity: config error: unknown dtypes option 'fp61' (no conf/dtypes/fp61.yaml). "
             f"Available options in 'dtypes': {DTYPES}")
    assert line == prefix + clean + (" (nothing queued)" if cmd[0] == "sweep" else ""), line
    assert "search path" not in line and "provider=" not in line


def no_identity(home: Path) -> dict:
    """The environment of a fresh machine: an empty HOME, no system git config, no GIT_* identity."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") and k != "EMAIL"}
    home.mkdir(exist_ok=True)
    e.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), GIT_CONFIG_NOSYSTEM="1",
             DVC_NO_ANALYTICS="1", PATH=BIN + os.pathsep + e.get("PATH", ""))
    e.pop("PYTHONPATH", None)
    return e


def test_sweep_commits_experiments_with_a_stand_in_identity_when_git_has_none(tmp_path, monkeypatch):
    """DVC commits every experiment it runs; on a machine where git knows nobody that fails. The sweep's
    dvc processes get a stand-in identity (and only when none is configured). A one-stage DVC project
    stands in for the pipeline: the identity is DVC's and git's business, not the stages'."""
    from parity.commands import sweep

    env = no_identity(tmp_path / "home")
    for k in [k for k in os.environ if k.startswith("GIT_") or k == "EMAIL"]:
        monkeypatch.delenv(k)
    for k in ("HOME", "XDG_CONFIG_HOME", "GIT_CONFIG_NOSYSTEM"):
        monkeypatch.setenv(k, env[k])
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "params.yaml").write_text("n: 1\n")
    (proj / "dvc.yaml").write_text("stages:\n  s:\n    cmd: cp params.yaml out.txt\n    params: [n]\n"
                                   "    outs: [out.txt]\n")
    run("git init -q", proj)
    run("dvc init -q", proj)
    run(["git", "add", "-A"], proj)
    run(["git", "commit", "-qm", "init"], proj)  # conftest's env: an identity for this commit only
    ident = sweep.git_identity(str(proj))
    assert ident == {"GIT_AUTHOR_NAME": "parity sweep", "GIT_AUTHOR_EMAIL": "parity-sweep@localhost",
                     "GIT_COMMITTER_NAME": "parity sweep", "GIT_COMMITTER_EMAIL": "parity-sweep@localhost"}
    # a workspace with uncommitted changes (DVC stashes them, and dulwich's stash wants an identity)
    (proj / "dvc.yaml").write_text((proj / "dvc.yaml").read_text() + "# a local note\n")
    exp = [sys.executable, "-m", "dvc", "exp", "run", "-S", "n=2"]
    bare = subprocess.run([*exp, "-n", "bare"], cwd=proj, env=env, capture_output=True, text=True)
    assert bare.returncode != 0 and "Git user name and email must be configured" in bare.stderr, bare.stderr
    p = subprocess.run([*exp, "-n", "n3"], cwd=proj, env=sweep._env(str(proj)), capture_output=True, text=True)
    assert p.returncode == 0 and "Ran experiment(s)" in p.stdout, (p.stdout, p.stderr)
    refs = run(["git", "for-each-ref", "--format=%(refname)", "refs/exps"], proj).stdout.split()
    swept = [r for r in refs if r.endswith("/n3")]
    assert len(swept) == 1, refs
    assert run(["git", "log", "-1", "--format=%an <%ae>", swept[0]], proj).stdout.strip() == \
        "parity sweep <parity-sweep@localhost>"
    assert (proj / ".git" / "config").read_text().count("[user]") == 0  # nothing written to git's config
    # someone configured: theirs is used, and once both are there nothing is set
    run(["git", "config", "user.name", "Ada"], proj)
    assert sweep.git_identity(str(proj))["GIT_AUTHOR_NAME"] == "Ada"
    run(["git", "config", "user.email", "ada@example.org"], proj)
    assert sweep.git_identity(str(proj)) == {}


# -- 27: the per-layer DVC plot ----------------------------------------------------------------------

def layer(order, name, tol_ratio, excess, passed=True):
    return SimpleNamespace(order=order, name=name, max_abs=1e-4, rel_l2=1e-5, tol_ratio=tol_ratio,
                           passed=passed, oracle=None if excess is None else {"excess": excess, "bits_lost": 1.0})


def rows(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def judged(layers: list, own: list, mode: str, k: float = 4.0) -> SimpleNamespace:
    """A judged cell as layers.csv reads it: its layers' ratios to the limit computed by the judge."""
    from parity.core import oracle

    return SimpleNamespace(layers=layers, own=own, mode=mode, ratios=oracle.ratios(layers, own, mode, k))


def assert_plot_data_finite(data: list[dict]):
    from parity.pipeline.cellfiles import PLOT_FIELDS

    for r in data:
        assert list(r) == list(PLOT_FIELDS)
        for k, v in r.items():
            if k not in ("layer", "note") and v != "":
                assert math.isfinite(float(v)), (k, v)


def test_layers_csv_plots_the_verdicts_ratio_per_named_layer_and_only_finite_numbers():
    from parity.pipeline.cellfiles import PLOT_CAP, plot_csv

    layers = [layer(0, "fc1", 42.0, 0.4), layer(1, "act", 0.0, float("inf"), passed=False),
              layer(2, "fc2", float("nan"), float("nan"), passed=False), layer(3, "output", 2.0, None)]
    own = [{"layer": "fc1", "kind": "leaf", "excess": 0.2}, {"layer": "act", "kind": "leaf", "excess": float("inf")}]
    oracle = rows(plot_csv(judged(layers, own, "oracle", k=4.0)))
    assert [r["layer"] for r in oracle] == ["fc1", "act", "fc2", "output"]
    assert float(oracle[0]["ratio"]) == pytest.approx(0.1) and float(oracle[0]["own_ratio"]) == pytest.approx(0.05)
    assert float(oracle[1]["ratio"]) == PLOT_CAP and "inf" in oracle[1]["note"] and oracle[1]["excess"] == ""
    assert float(oracle[2]["ratio"]) == PLOT_CAP and "nan" in oracle[2]["note"]
    assert oracle[3]["ratio"] == ""  # no oracle value for that layer: not drawn
    assert_plot_data_finite(oracle)
    tol = rows(plot_csv(judged(layers, own, "tolerance", k=4.0)))
    assert [r["ratio"] for r in tol] == ["42.0", "", repr(PLOT_CAP), "2.0"]  # tol_ratio; 0 (exact) off the log axis
    assert {r["own_ratio"] for r in tol} == {""}
    assert_plot_data_finite(tol)


def test_dvc_draws_layers_csv_with_the_projects_template_log_scale_and_limit_line():
    """dvc.yaml's plot names parity/pipeline/plot_layers.json; DVC's renderer fills it with layer names on x."""
    from dvc_render.vega import VegaRenderer

    from parity.pipeline.cellfiles import PLOT_FIELDS, plot_csv

    diff = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["diff"]
    (path, props), = diff["plots"][0].items()
    assert path.endswith("/layers.csv") and props["x"] == "layer" and props["y"] == "ratio"
    assert {props["x"], props["y"]} <= set(PLOT_FIELDS) and (ROOT / props["template"]).is_file()
    text = plot_csv(judged([layer(0, "fc1", 1.0, 0.4), layer(1, "plain:output", 1.0, 8.0)], [], "oracle", k=4.0))
    data = [dict(r, rev="workspace") for r in rows(text)]
    spec = VegaRenderer(data, "layers.csv", **{**props, "template": str(ROOT / props["template"]),
                                                "title": "mlp-fp16-ort_cpu"}).get_filled_template()
    assert "<DVC_METRIC" not in json.dumps(spec)
    line, limit = spec["layer"]
    assert line["encoding"]["x"]["field"] == "layer" and line["encoding"]["y"]["scale"]["type"] == "log"
    assert limit["mark"]["type"] == "rule" and limit["data"]["values"] == [{"limit": 1}]
    assert [d["layer"] for d in spec["data"]["values"]] == ["fc1", "plain:output"]


def test_dvc_plots_output_folder_is_git_ignored():
    assert "/dvc_plots/" in (ROOT / ".gitignore").read_text().splitlines()


# -- 23 and 29: what `make run` installs, and what it leaves changed ---------------------------------

@pytest.mark.skipif(not MAKE, reason="needs make")
def test_make_installs_the_cpu_torch_build_only_when_asked_and_says_what_the_default_pulls(tmp_path):
    for f in ("Makefile", "pyproject.toml"):
        shutil.copy2(ROOT / f, tmp_path / f)

    def dry(*args) -> str:  # what `make` would run (-n), nothing installed
        return subprocess.run([MAKE, "-n", "-B", ".venv/.installed", *args], cwd=tmp_path, capture_output=True,
                              text=True, check=True).stdout

    default = dry()
    assert "--index-url" not in default and "CUDA build" in default and "TORCH_INDEX=" in default
    cpu = dry("TORCH_INDEX=https://download.pytorch.org/whl/cpu")
    assert ("pip install -q --no-deps --index-url https://download.pytorch.org/whl/cpu "
            "torch==2.13.0 torchvision==0.28.0") in cpu  # the pins as pyproject.toml has them
    assert cpu.index("--index-url") < cpu.index("install --progress-bar off --no-compile -e")  # then the rest, torch already satisfied


@pytest.mark.skipif(not MAKE, reason="needs make")
def test_make_run_ends_saying_which_lock_files_changed_and_stages_nothing(tmp_path):
    assert "autostage" not in (ROOT / ".dvc" / "config").read_text()
    shutil.copy2(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "env").mkdir()
    for f in ("dvc.lock", "env/dvc.lock"):
        (tmp_path / f).write_text("schema: '2.0'\n")
    run("git init -q", tmp_path)
    run(["git", "add", "-A"], tmp_path)
    run(["git", "commit", "-qm", "init"], tmp_path)

    def note() -> str:
        return run([MAKE, "-s", "lock-note"], tmp_path).stdout

    assert note() == ""
    (tmp_path / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")  # what `dvc repro` on another CPU does
    line = note()
    assert line.startswith("parity: dvc.lock changed (") and "not staged" in line and line.count("\n") == 1, line
    assert "env/dvc.lock" not in line.partition("changed")[0] and "git checkout -- dvc.lock env/dvc.lock" in line
    assert run(["git", "diff", "--cached", "--name-only"], tmp_path).stdout == ""


# -- 26: `parity show`'s counts agree: "3 of 3 layers fail", then the 3 layers and the 2 outputs -----

def test_show_counts_the_failing_outputs_apart_from_the_layers():
    from parity.commands.show import render

    def row(name):
        return {"layer": name, "n_outside": 1, "numel": 2, "max_abs": 1e-4, "worst_sample": 0, "worst_index": [0, 0],
                "excess": None, "tol_source": "dtypes.fp16.tol", "problem": None}

    v = {"cell": "mlp-fp16-ort_cpu", "verdict": "FAIL", "verdict_mode": "tolerance", "layers": 3, "layers_failed": 3,
         "reason": "", "precision": None, "baseline": None, "drift_origin": "fc1", "drift_origin_where": "fc1",
         "cause": None, "worst_layer": "fc1", "output": {"max_abs": 1e-4, "rel_l2": 1e-4},
         "failing_layers": [row(n) for n in ("fc1", "act", "fc2", "output", "plain:output")],
         "failing_own": [], "outside_tolerance": [], "outside_tolerance_total": 0}
    out = io.StringIO()
    render(v, out)
    text = out.getvalue()
    assert text.startswith("mlp-fp16-ort_cpu: FAIL (by tolerance, 3 of 3 layers fail)\n")
    assert "failing layers (3, and 2 output(s)): " in text


# -- a sweep's live verdicts: only what this experiment wrote, for its own cells ----------------------

def test_sweep_shows_only_verdicts_written_since_it_started_for_the_experiments_cells(tmp_path):
    """An experiment's workspace starts with the base commit's outputs (cells it does not have, stale
    verdicts): the sweep printed those as if they were the experiment's."""
    from parity.commands.sweep import Queue

    ws = make_repo(tmp_path / "ws", dtypes=("fp32",), providers=("ort_cpu",))
    q = Queue(str(tmp_path), since=time.time() - 1.0)

    def write(cell, verdict, age=0.0):
        f = ws.path / "artifacts" / "diff" / cell / "metrics.json"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps({"verdict": verdict}))
        os.utime(f, (time.time() - age,) * 2)

    write("tiny_mlp-fp32-ort_cpu", "FAIL", age=3600)  # the base commit's, restored by the checkout
    write("tiny_mlp-fp16-ort_cpu", "FAIL")  # a cell this experiment does not run
    assert q.live_verdicts(str(ws.path)) == {"tiny_mlp-fp32-ort_cpu": None}
    write("tiny_mlp-fp32-ort_cpu", "PASS")  # its diff stage ran
    assert q.live_verdicts(str(ws.path)) == {"tiny_mlp-fp32-ort_cpu": "PASS"}
    ws.run([f"{BIN}/parity", "compose", "-S", "dtypes=[fp16]"])  # DVC writes the experiment's params
    assert q.live_verdicts(str(ws.path)) == {"tiny_mlp-fp16-ort_cpu": "FAIL"}
