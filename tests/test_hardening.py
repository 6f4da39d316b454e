"""Nothing silent (issue 36): each test is named by the issue's item number."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from parity.core import io, store


def test_36_1_bytes_changed_in_place_in_a_store_file_are_an_error_never_other_values(tmp_path):
    """14 garbage bytes written into a capture's Parquet file (in place, so DVC's hard-linked cache
    object too) decoded to other values and the diff passed. Page checksums: at every offset the read
    is refused with the file named, or (never, here) gives the written values."""
    rows = [store.Tensor(0, f"layer{i}", i, np.random.default_rng(i).normal(size=(32, 128)).astype(np.float32))
            for i in range(3)]
    good = tmp_path / "good.parquet"
    store.write(good, rows, {"model": "m"})
    bad = tmp_path / "layers.parquet"
    silent, refused = [], 0
    size = good.stat().st_size
    for off in range(0, size - 14, max(1, size // 150)):
        shutil.copy(good, bad)
        with open(bad, "r+b") as f:
            f.seek(off)
            f.write(b"\x00garbage-bytes")
        try:
            got = store.read_dict(bad)
        except io.Corrupt as e:
            assert str(e).startswith(f"corrupt: {bad}: ") and "\n" not in str(e), str(e)
            refused += 1
            continue
        if not all(np.array_equal(got[0, r.name].array, r.array) for r in rows):
            silent.append(off)
    assert not silent, f"corrupt bytes at offsets {silent} decoded to other values without an error"
    assert refused > 100


def test_36_1_page_checksums_keep_files_byte_identical(tmp_path):
    """Determinism holds with checksums on: the same tensors give the same bytes."""
    rows = [store.Tensor(0, "x", 0, np.arange(1000, dtype=np.float32))]
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    store.write(a, rows, {"model": "m"})
    store.write(b, rows, {"model": "m"})
    assert a.read_bytes() == b.read_bytes()


def test_36_4_an_import_that_converts_no_case_replaces_nothing(tmp_path):
    """`parity suite import-opdiff FILE --name critical --force` whose tests all fail to convert exited 1
    and still replaced the shipped suite with an empty one: now it exits 1 and writes nothing."""
    import subprocess
    import sys

    from conftest import env

    (tmp_path / "conf/suites").mkdir(parents=True)
    shipped = tmp_path / "conf/suites/critical.yaml"
    shipped.write_text("critical: {tolerances: [], spec: {cases: [{id: relu, op: aten::relu}]}}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("tests:\n  - {id: a, op: 7}\n  - {id: b, op: aten::relu, nonsense: 1}\n")
    p = subprocess.run([sys.executable, "-m", "parity.commands.suite_cli", "import-opdiff", str(bad),
                        "--name", "critical", "--force"], cwd=tmp_path, env=env(), capture_output=True, text=True)
    assert p.returncode == 1, p.stderr
    assert p.stderr.strip().splitlines()[-1] == ("python -m parity.commands.suite_cli import-opdiff: error: none of the 2 opdiff tests "
                                                 f"in {bad} converted; conf/suites/critical.yaml was not replaced")
    assert shipped.read_text().startswith("critical: {tolerances: [], spec: {cases: [{id: relu")
    p = subprocess.run([sys.executable, "-m", "parity.commands.suite_cli", "import-opdiff", str(bad),
                        "--name", "fresh"], cwd=tmp_path, env=env(), capture_output=True, text=True)
    assert p.returncode == 1 and not (tmp_path / "conf/suites/fresh.yaml").exists(), p.stderr


def _fuzz(tmp_path, *args):
    import subprocess
    import sys

    from conftest import env

    shutil.copytree(Path(__file__).parents[1] / "conf", tmp_path / "conf", dirs_exist_ok=True)
    return subprocess.run([sys.executable, "-m", "parity.commands.fuzz_cli", "critical", "--dtype", "fp16",
                           "--provider", "ort_cpu", *args], cwd=tmp_path, env=env(), capture_output=True, text=True)


def test_36_8_a_negative_fuzz_seed_names_the_option(tmp_path):
    p = _fuzz(tmp_path, "--seed", "-1")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1] == "parity fuzz: error: argument --seed: expected an integer >= 0, got -1"
    assert not (tmp_path / "parity-fuzz").exists()


def test_36_8_an_unknown_case_to_reproduce_lists_the_suites_cases(tmp_path):
    p = _fuzz(tmp_path, "--reproduce", "nosuch~s123")
    assert p.returncode == 2
    line = p.stderr.strip()
    assert line.startswith("parity fuzz: no case 'nosuch' in suite critical. Cases: add, add_bcast, "), line
    assert "\n" not in line and "matmul" in line


def test_36_3_an_override_that_reads_the_environment_is_refused_at_compose(monkeypatch):
    """`-S 'seed=${oc.env:SECRET}'` was resolved and its value persisted into the committed params.yaml."""
    from omegaconf.errors import InterpolationResolutionError

    from conftest import composed

    monkeypatch.setenv("PARITY_TEST_SECRET", "hunter2")
    with pytest.raises(InterpolationResolutionError) as e:
        composed("+models.mlp.secret=${oc.env:PARITY_TEST_SECRET}")
    msg = str(e.value)
    assert msg.startswith("parity: config error: models.mlp.secret: reads the environment (${oc.env:...})"), msg
    assert "hunter2" not in msg and "\n" not in msg
    assert composed("seed=3")["seed"] == 3  # a plain override composes as before


@pytest.mark.parametrize("option", ["../providers/ort_cpu", "../providers/x"])
def test_36_8_an_option_given_as_a_path_is_named_with_the_groups_options(option):
    """`-S 'models=[../providers/x]'` said "bad option name ''" (or listed the providers as models)."""
    from conftest import composed

    with pytest.raises(Exception) as e:
        composed(f"models=[{option}]")
    msg = str(e.value)
    assert msg.startswith(f"parity: config error: models: option '{option}' is a path; an option is the name "
                          "of a file in conf/models/ (without .yaml). Available options in 'models': "), msg
    assert "resnet18" in msg and "ort_cpu," not in msg and "\n" not in msg


def test_36_8_a_full_disk_is_one_line_and_publishes_nothing(tmp_path):
    """Disk full during a stage gave an `OSError: [Errno 28]` traceback. A 64 KiB tmpfs (root only: skipped
    elsewhere) as the stage's output folder: one line naming the stage, exit 1, no file left there."""
    import subprocess
    import sys

    import yaml

    from conftest import ROOT, env

    full = tmp_path / "full"
    full.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root) to fill a disk")
    try:
        params = tmp_path / "params.yaml"
        p = yaml.safe_load((ROOT / "params.yaml").read_text())  # as committed: composed by DVC
        p["models"]["mlp"]["input"][0]["shape"] = [256, 768]  # 768 KiB a sample: more than the disk holds
        params.write_text(yaml.safe_dump(p, sort_keys=False))
        r = subprocess.run([sys.executable, "-m", "stages.inputs", "--params", str(params), "--model", "mlp",
                            "--out", str(full / "inputs.parquet")], cwd=ROOT, env=env(), capture_output=True, text=True)
        assert r.returncode == 1, r.stderr
        assert r.stderr.strip() == (f"python -m stages.inputs: no space left on device: free space on the disk of {ROOT} "
                                    "(`df -h .`; DVC's cache is there too) and re-run; nothing partial was published"), r.stderr
        assert list(full.iterdir()) == []
    finally:
        subprocess.run(["umount", str(full)])


def _copy_tree(tmp_path):
    from conftest import ROOT

    for name in ("parity", "stages", "conf", "env"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def test_36_8_a_corrupt_closures_file_and_a_module_that_does_not_parse_are_one_line(tmp_path):
    """A corrupt stages/closures.json gave the env stage a JSONDecodeError traceback not naming the file;
    `parity deps --write` over a module with a syntax error, a traceback."""
    import subprocess
    import sys

    from conftest import BIN, env

    root = _copy_tree(tmp_path)
    e = dict(env(), PYTHONPATH=str(root))
    (root / "stages/closures.json").write_text('{"a": [')
    p = subprocess.run([sys.executable, "-m", "stages.env", "--out", "artifacts/env", "--code", "artifacts/code"],
                       cwd=root, env=e, capture_output=True, text=True)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip() == ("python -m stages.env: stages/closures.json: corrupt (Expecting value: line 1 column 8 "
                                "(char 7)): run `parity deps --write` to make it again"), p.stderr
    (root / "parity/core/broken.py").write_text("import os\ndef f(:\n")
    env_py = root / "stages/env.py"
    env_py.write_text(env_py.read_text().replace("from parity.core import codedeps, importmemo\n",
                                                 "from parity.core import broken, codedeps, importmemo  # noqa\n"))
    p = subprocess.run([f"{BIN}/parity", "deps", "--write"], cwd=root, env=e, capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().startswith("parity deps: ") and p.stderr.strip().endswith(
        "parity/core/broken.py:2: syntax error (invalid syntax): its imports cannot be read; fix the module and run again")
    assert (root / "stages/closures.json").read_text() == '{"a": ['  # nothing written


@pytest.mark.parametrize("override, says", [
    ("models.tiny_llama.input.0.shape=[1,100000]",
     "models.tiny_llama.input input_ids: 100000 tokens, more than the model's 256 positions "
     "(models.tiny_llama.arch.kwargs max_position_embeddings): use at most 256"),
    ("+models.tiny_llama.shapes={long: {input_ids: [1, 300]}}",
     "models.tiny_llama.shapes.long.input_ids: 300 tokens, more than the model's 256 positions"),
])
def test_36_7_a_sequence_longer_than_the_models_positions_is_refused_at_compose(override, says):
    """tiny_llama at [1, 100000] (256 positions) was accepted and its export ran > 6 min with no word."""
    from conftest import composed

    with pytest.raises(Exception) as e:
        composed("models=[tiny_llama]", override)
    assert str(e.value).startswith(f"parity: config error: {says}"), str(e.value)
    assert composed("models=[tiny_llama]", "models.tiny_llama.input.0.shape=[1,256]")["models"]["tiny_llama"]


def _other_machines_commit(path: Path) -> Path:
    """A repository whose HEAD records a summary.json (the DVC metric) made by a run elsewhere, and a fresh
    clone of it: the clone's DVC cache is empty and it has no remote, as a new user's clone of this project."""
    from conftest import run

    path.mkdir()
    run(["git", "init", "-q"], path)
    run(["dvc", "init", "-q"], path)
    (path / "dvc.yaml").write_text("stages:\n  report:\n    cmd: >-\n      mkdir -p artifacts/report && echo "
                                   "'{\"cells\": 1}' > artifacts/report/summary.json\n"
                                   "    metrics:\n    - artifacts/report/summary.json:\n        cache: true\n")
    run(["dvc", "repro", "-q"], path)
    run(["git", "add", "dvc.yaml", "dvc.lock", "artifacts/report/.gitignore"], path)
    run(["git", "commit", "-qm", "a run on another machine"], path)
    clone = path.parent / "clone"
    run(["git", "clone", "-q", str(path), str(clone)], path)
    return clone


def test_36_9_compare_on_a_fresh_clone_says_to_commit_your_own_run_never_to_fetch_all_commits(tmp_path):
    """`parity compare HEAD` on a fresh clone said to run `dvc fetch -r local --all-commits` (527 commits,
    > 10 min, and no remote holds HEAD's outputs). It says what is true: no remote, commit your own run;
    and why `dvc metrics diff HEAD` shows a column of '-'."""
    from conftest import run

    clone = _other_machines_commit(tmp_path / "origin")
    p = run(["parity", "compare", "HEAD"], clone, check=False)
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1, p.stderr
    line = p.stderr.strip()
    assert line == ("parity compare: metrics of HEAD are not in the local cache (artifacts/report/summary.json) and no "
                    "DVC remote is configured to fetch them from: its dvc.lock records outputs made on another machine. "
                    "To compare, run the pipeline here and commit its results (`make run`, then `git commit dvc.lock "
                    "env/dvc.lock`), then compare against that commit (`dvc metrics diff HEAD` shows '-' for every "
                    "value of HEAD for the same reason)"), line
    # a cloud remote this clone cannot look into: fetch that one commit's outputs, never every commit's
    run(["dvc", "remote", "add", "--local", "-d", "team", "s3://bucket/parity"], clone)
    line = run(["parity", "compare", "HEAD"], clone, check=False).stderr.strip()
    assert "`git checkout HEAD` then `dvc fetch -r team`" in line and "--all-commits" not in line, line
    assert "otherwise run the pipeline here and commit its results" in line


def test_36_10_an_experiment_is_done_only_when_dvcs_queue_status_is_final():
    """A sweep printed "<exp> done: FAILED" 9 s in while `dvc queue status` showed it Running, and it ended
    Success: DVC's queue status is read from celery's lists, and a task between them (or whose result is
    not written yet) is in none of them or reads Failed for a moment. The sweep reports an experiment
    done only when DVC's status is final: committed, or Failed (or gone) on consecutive polls."""
    from parity.commands.sweep import Settle

    s = Settle()
    # a transient read while it runs: gone from every list for a poll, then Failed for a poll, then Running
    assert s.update({"exp-a": None, "exp-b": "Queued"}, set()) == {}
    assert s.update({"exp-a": "Failed", "exp-b": "Queued"}, set()) == {}
    assert s.update({"exp-a": "Running", "exp-b": "Running"}, set()) == {}
    assert s.update({"exp-a": "Failed", "exp-b": "Running"}, set()) == {}  # the count started again
    # it ended Success: committed, whether the queue still lists it or DVC already collected it
    assert s.update({"exp-a": "Success", "exp-b": "Running"}, {"exp-a"}) == {"exp-a": "Success"}
    assert s.update({"exp-b": None}, {"exp-b"}) == {"exp-b": "Success"}
    # a real failure: Failed on two polls in a row, nothing committed
    s = Settle()
    assert s.update({"exp-c": "Failed"}, set()) == {}
    assert s.update({"exp-c": "Failed"}, set()) == {"exp-c": "Failed"}
    # gone from the queue with nothing committed (removed with `dvc queue remove`): failed, after a while
    s = Settle()
    assert [s.update({"exp-d": None}, set()) for _ in range(Settle.GONE)][-2:] == [{}, {"exp-d": "Failed"}]


def _report_cell(verdict="PASS", mode="oracle", n=3, excess=2.0, max_abs=1e-6, latency=None, bits_lost=2.7,
                 provider="ort_cpu"):
    names = [f"layer{i}.0.conv{i}" for i in range(n)]
    layers = [{"name": nm, "order": i, "atol": 1e-4, "rtol": 1.3e-6, "tol_source": "dtypes.fp32.tol", "passed": True,
               "numel": 8, "n_outside": 0, "max_abs": max_abs, "max_rel": 1e-6, "rel_l2": 1e-7, "cosine": 1.0,
               "tol_ratio": 43.2, "problem": "", "oracle": {"excess": excess, "bits_lost": bits_lost}}
              for i, nm in enumerate(names)]
    m = {"verdict": verdict, "verdict_mode": mode, "layers": n, "layers_failed": 0, "drift_origin": None,
         "worst_layer": None, "worst_ratio": excess / 4.0, "output": {"excess": excess, "bits_lost": bits_lost,
                                                                      "tol_ratio": 43.2}}
    return {"key": f"resnet18-fp32-{provider}", "model": "resnet18", "dtype": "fp32", "provider": provider,
            "metrics": m, "layers": layers, "k": 4.0, "latency_ratio": latency, "timing": {}}


def test_36_11_no_latency_caption_when_no_cell_measured_latency():
    """A latency caption stood under the matrix when latency was off (every cell '-')."""
    from parity.pipeline import report_render as r

    assert "Latency" not in r.matrix_html([_report_cell(), _report_cell(provider="torch_cpu")])
    assert "latency from the plain graph" not in r.cell_html(_report_cell())
    assert "Latency: median of the plain graph" in r.matrix_html([_report_cell(latency=1.3)])


def test_36_11_a_passing_cells_prose_names_no_missing_drift_origin_or_worst_layer():
    """Every passing cell read "drift origin -; worst -.": a passing cell has neither, so neither is named."""
    from parity.pipeline import report_render as r

    text = r.verdict_prose(_report_cell())
    assert text == ("Verdict by <b>oracle</b>: 3 layers compared, 0 failing; worst excess/limit 0.5 "
                    "(1 is the limit)."), text
    failing = _report_cell(verdict="FAIL", excess=8.0)
    failing["metrics"].update(drift_origin="layer1.0.conv1", worst_layer="layer2.0.conv2")
    assert ("drift origin <code>layer1.0.conv1</code>; worst layer <code>layer2.0.conv2</code>"
            in r.verdict_prose(failing))


@pytest.mark.parametrize("n", [62, 300])
def test_36_11_layer_names_on_the_axis_never_overlap_and_the_rule_is_stated(n):
    """resnet18's axis (62 layers with the outputs) named one layer in five, its labels overlapping: now
    every name while they fit 11 px apart, else every n-th with the rule written under the chart."""
    import re

    from parity.core import svg

    names = [f"layer{i // 4}.{i % 4}.downsample.0" for i in range(n)]
    cv = svg.Curve(names=names, series=[svg.Series("excess/limit", "#000", [0.1] * n)], limit=1.0, limit_label="l",
                   origin=n // 3)
    out = svg.curve_svg(cv)
    xs = sorted(float(x) for x in re.findall(r'class="xl" x="([0-9.]+)"', out))
    assert all(b - a >= svg.LABEL_PITCH - 0.05 for a, b in zip(xs, xs[1:])), "labels closer than a line of text"
    rule = re.search(r'class="xrule"[^>]*>([^<]*)<', out).group(1)
    if n == 62:  # resnet18: every name
        assert len(xs) == n and rule == "every layer named"
    else:
        assert rule.startswith("every ") and f"of {n} layers named (and the last, the drift origin)" in rule
        assert f">{names[n // 3]}<" in out and f">{names[-1]}<" in out


def test_36_11_one_verdict_number_on_one_scale_in_report_log_and_summary():
    """One quantity on three scales: the report's excess with limit k = 4, summary.json's worst = excess / k,
    the diff log's tol_ratio 43.2 on a PASS cell. Everywhere now: excess/limit, 1 the limit."""
    from types import SimpleNamespace

    from parity.pipeline.cellfiles import summary_line
    from parity.pipeline import report_render as r

    c = _report_cell(excess=2.0)  # excess 2 with k = 4: excess/limit 0.5
    series, limit, label = r.curve_series(c)
    assert limit == 1.0 and series[0][0] == "excess/limit (accumulated)" and series[0][2] == [0.5, 0.5, 0.5]
    assert label == "limit: excess/limit = 1 (excess = k = 4)"
    row = dict(zip(r.HEADER, r.cell_rows([c])[0]))
    assert row["worst excess/limit"] == "0.5" and row["output excess/limit"] == "0.5"
    head, rows = r.layer_rows(c)
    assert dict(zip(head, rows[0]))["excess/limit"] == "0.5" and "tol_ratio" not in head
    m = {"status": "OK", "verdict": "PASS", "layers": 3, "layers_failed": 0, "drift_origin": None,
         "worst_layer": None, "worst_ratio": 0.5, "worst_excess": None, "worst_tol_ratio": 43.2,
         "output": {"max_abs": 1e-6, "bits_lost": 2.7}}
    line = summary_line(m, SimpleNamespace(mode="oracle"))
    assert "worst excess/limit=0.5" in line and "tol_ratio" not in line and "43.2" not in line, line
    assert "drift_origin" not in line, line  # a passing cell has none: not "drift_origin=None"


def test_36_11_a_bit_identical_baseline_says_its_bits_lost_are_against_fp64():
    """An fp32 BASELINE cell said "Bit-identical" beside "output bits lost 2.7": identical to the
    reference (itself), while the bits lost are against fp64. Both are true; the text says which is which."""
    from parity.pipeline import report_render as r

    c = _report_cell(verdict="BASELINE", max_abs=0.0, provider="torch_cpu")
    html = r.cell_html(c)
    assert ("Bit-identical to the reference: every layer&#x27;s max_abs against it is 0. The output bits lost "
            "(2.7) are against fp64") in html
    assert "every layer matches the reference exactly" not in html


def test_36_11_exact_zeros_in_dvc_plots_are_drawn_at_a_floor_with_a_note():
    """`dvc plots diff`: a layer at 0 vanished from the log axis with no note. layers.csv says "0 (exact)"
    and the template draws it as a square a decade below the smallest value, its subtitle saying so."""
    import csv
    import io as _io
    import json

    import vl_convert
    from dvc_render.vega import VegaRenderer

    root = Path(__file__).parents[1]
    text = ("order,layer,ratio,own_ratio,passed,max_abs,rel_l2,tol_ratio,excess,bits_lost,own_excess,note\n"
            "0,fc1,0.25,,1,1e-06,1e-06,0.3,1.0,2.0,,\n1,act,,,1,0.0,0.0,0.0,0.0,0.0,,0 (exact)\n")
    data = [dict(row, rev=rev) for rev in ("HEAD", "workspace") for row in csv.DictReader(_io.StringIO(text))]
    spec = VegaRenderer(data, "layers.csv", template=str(root / "parity/pipeline/plot_layers.json"), x="layer",
                        y="ratio", title="mlp-fp32-ort_cpu").get_filled_template()
    assert "drawn as a square a decade below the smallest value" in spec["title"]["subtitle"]
    view = json.dumps(vl_convert.vegalite_to_vega(spec))  # a valid spec, drawn offline
    assert '"square"' in view and "y_min" in view and vl_convert.vegalite_to_svg(spec).count("<path") > 3
    from parity.pipeline.cellfiles import _ratio

    assert _ratio(0.0) == ("", "0 (exact)") and _ratio(0.5) == ("0.5", "")


def test_36_11_the_report_is_byte_identical_for_the_same_cells():
    from parity.pipeline import report_render as r

    cells = [_report_cell(n=62), _report_cell(verdict="BASELINE", max_abs=0.0, provider="torch_cpu")]
    summary = {"cells": 2, "passed": 1, "failed": 0, "not_run": 0, "baseline": 1}
    assert r.html_page("t", summary, cells, {}) == r.html_page("t", summary, [dict(c) for c in cells], {})


def _peaks_and_estimates(repo) -> list[tuple[str, int, int]]:
    """(timing file, peak bytes, estimate bytes) of every stage that estimated its peak before it ran."""
    import json

    out = []
    for f in sorted((repo.path / "artifacts" / "timing").rglob("*.json")):
        t = json.loads(f.read_text())
        if t.get("estimate_bytes"):
            out.append((str(f.relative_to(repo.path)), t["peak_rss_kib"] * 1024, t["estimate_bytes"]))
    return out


@pytest.mark.parametrize("model", ["tiny_mlp", pytest.param("mlp", marks=pytest.mark.slow)])
def test_36_7_memory_the_estimate_is_at_least_the_measured_peak(tmp_path, model):
    """The estimate under-predicted (peak / estimate 1.20 export@resnet18, 1.23 capture@resnet18-fp32-torch_cpu):
    refitted on this code, each heavy stage's estimate (what it checks before it allocates) is at least the peak
    it then measured (VmHWM, not ru_maxrss: that keeps the RSS of the dvc process it was forked from)."""
    from conftest import make_repo

    repo = make_repo(tmp_path / "repo", models=(model,), dtypes=("fp32",), providers=("torch_cpu", "ort_cpu"))
    repo.run(["dvc", "repro"])
    rows = _peaks_and_estimates(repo)
    assert {r[0].split("/")[-1] for r in rows} >= {f"{model}.json", f"{model}-fp32-torch_cpu.json",
                                                   f"{model}-fp32-ort_cpu.json"}, rows
    over = [(f, round(p / 2**20), round(e / 2**20)) for f, p, e in rows if p > e]
    assert not over, f"peak above the estimate (MiB): {over}"


def test_36_7_memory_a_stage_measures_its_own_peak_not_the_process_it_was_forked_from(tmp_path):
    """ru_maxrss of a process keeps the RSS of the one it was forked from (exec does not reset it): a stage
    started by a 400 MiB parent would record 400 MiB. The recorded peak is the program's own (VmHWM)."""
    import json
    import subprocess
    import sys

    from conftest import env

    ballast = bytearray(300 << 20)  # this (parent) process: +300 MiB resident
    ballast[::4096] = b"\1" * len(ballast[::4096])
    out = tmp_path / "t.json"
    code = ("import time; from parity.core import memory; "
            f"memory.record({str(out)!r}, 'capture', 'c', time.perf_counter())")
    subprocess.run([sys.executable, "-c", code], env=env(), check=True)
    del ballast
    peak = json.loads(out.read_text())["peak_rss_kib"]
    assert peak < 200 << 10, f"recorded {peak >> 10} MiB: the parent's RSS, not the stage's"


def test_36_10_the_no_worker_warning_needs_two_silent_checks_with_no_progress_between(tmp_path):
    """Mid-sweep under load, "no DVC queue worker is alive" was printed and the sweep then finished normally:
    a busy worker missed celery's broadcast. One empty answer, or empty answers while verdicts come or files
    are written in a running experiment's workspace, are no warning; two silent checks with nothing moving are."""
    import os
    import time

    from parity.commands.sweep import Liveness, Queue

    a = Liveness()
    assert not a.dead(0, (0, 0, 1, 5.0)) and not a.dead(1, (0, 0, 1, 5.0))  # a worker answered
    assert not a.dead(0, (0, 0, 1, 5.0)) and not a.dead(0, (1, 0, 1, 5.0))  # a verdict came in between
    assert not a.dead(0, (1, 0, 1, 5.0)) and not a.dead(0, (1, 0, 1, 9.0))  # a stage wrote a file
    assert not a.dead(0, (1, 0, 1, 9.0)) and a.dead(0, (1, 0, 1, 9.0))  # two silent checks, nothing moved
    ws = tmp_path / "exp-ws"
    (ws / "artifacts" / "models" / "mlp").mkdir(parents=True)
    assert Queue.activity({"exp-a": str(ws)}) == 0.0
    f = ws / "artifacts" / "models" / "mlp" / "model.onnx"
    f.write_bytes(b"x")
    os.utime(f, (time.time(), 1234567.0))
    assert Queue.activity({"exp-a": str(ws)}) == 1234567.0
