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
    env_py.write_text(env_py.read_text().replace("from parity.core import codedeps\n",
                                                 "from parity.core import broken, codedeps  # noqa\n"))
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
