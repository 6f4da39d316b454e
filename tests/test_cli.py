"""The `parity` command line as a user (and a CI job) meets it: list, --version, completion, suite
list, pipes closed early, --json against the documented schema (docs/cli-json.schema.json), and a
sweep over model lists expanded by DVC's own Hydra sweep parser, on real DVC."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import BIN, ROOT, TINY_MLP, env, make_repo

SCHEMA = json.loads((ROOT / "docs" / "cli-json.schema.json").read_text())


def validate(doc: dict, command: str) -> None:
    import jsonschema

    jsonschema.validate(doc, {**SCHEMA, "$ref": f"#/$defs/{command}"})


def parity(*args, cwd=ROOT, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run([f"{BIN}/parity", *args], cwd=cwd, env=env(), capture_output=True, text=True)
    if check:
        assert p.returncode == 0, p.stdout + p.stderr
    return p


def test_the_schema_is_a_valid_json_schema():
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_list_shows_every_option_of_a_group_and_which_params_selects():
    for group in ("models", "dtypes", "providers", "suites"):
        doc = json.loads(parity("list", group, "--json").stdout)
        validate(doc, "list")
        names = [o["name"] for o in doc["options"]]
        assert names == sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))
    models = {o["name"]: o for o in json.loads(parity("list", "models", "--json").stdout)["options"]}
    assert models["mlp"]["selected"] and not models["vit_b_16"]["selected"]  # params.yaml: mlp, resnet18
    text = parity("list", "providers").stdout
    assert text.splitlines()[0].split()[:3] == ["name", "selected", "runner"]
    assert "\x1b[" not in text  # not a terminal: plain text
    p = parity("list", "gpus", check=False)
    assert p.returncode == 2 and "invalid choice: 'gpus'" in p.stderr and "'providers'" in p.stderr


def test_version_completion_and_suite_verbs():
    assert parity("--version").stdout.startswith("parity ")
    bash = parity("completion", "bash").stdout
    assert "complete" in bash and "parity" in bash and "compare" in bash
    listed = parity("suite", "list").stdout.split()
    assert "critical" in listed and "selftest" in listed  # no argument: the suites there are
    help_ = parity("suite", "--help").stdout
    assert help_.startswith("usage: parity suite") and "python -m parity.commands.suite_cli" not in help_


def test_a_reader_that_stops_early_gets_no_traceback():
    """`parity ... | head -1`: the pipe closes while parity still writes."""
    p = subprocess.Popen([f"{BIN}/parity", "suite", "list", "--long", *["opinfo"] * 4], cwd=ROOT, env=env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read()
    p.wait()
    assert first.strip() and "Traceback" not in err and "BrokenPipeError" not in err, err


def test_sweep_over_two_model_lists_runs_two_experiments(tmp_path):
    """`models=[a],[b]` is DVC's Hydra sweep grammar for two experiments, one model each (a comma
    split of our own would have made `[a]` and `[b]` malformed lists)."""
    r = make_repo(tmp_path / "repo", dtypes=("fp32",), providers=("ort_cpu",))
    (r.path / "conf/models/tiny_mlp2.yaml").write_text(
        TINY_MLP.replace("tiny_mlp:", "tiny_mlp2:").replace("hidden: 32", "hidden: 24"))
    r.commit("a second tiny model")
    p = r.run([f"{BIN}/parity", "sweep", "models=[tiny_mlp],[tiny_mlp2]", "--json"])
    doc = json.loads(p.stdout)
    validate(doc, "sweep")
    assert doc["overrides"] == ["models"]
    exps = doc["experiments"]
    assert [e["overrides"] for e in exps] == [["models=[tiny_mlp]"], ["models=[tiny_mlp2]"]]
    assert [e["cells"] for e in exps] == [{"tiny_mlp-fp32-ort_cpu": "PASS"}, {"tiny_mlp2-fp32-ort_cpu": "PASS"}]
    assert all(e["status"] == "Success" for e in exps)
    # progress on stderr: each experiment as it is queued, its result as it finishes, then the totals
    for e in exps:
        assert f"queued {e['name']} ({e['overrides'][0]})" in p.stderr, p.stderr
        assert f"{e['name']} ({e['overrides'][0]}) done: 1 passed, 0 failed, 0 baseline, 0 not exercised, 0 not run" in p.stderr, p.stderr
    assert "2/2 done: 2 cells passed" in p.stderr
    assert "\x1b[" not in p.stderr
    # the queue holds both, finished
    q = r.run(["dvc", "queue", "status"]).stdout
    assert all(e["name"] in q for e in exps) and "Queued" not in q and "Running" not in q


def test_a_failed_experiment_is_named_with_the_tail_of_its_log(tmp_path):
    """One experiment of a sweep fails in DVC's queue (its model's input does not fit the model): the
    sweep exits 1, the other experiment's result stands, and the failed one is named with the last
    lines of its `dvc queue logs` on stderr, so the user sees why without another command."""
    r = make_repo(tmp_path / "repo", dtypes=("fp32",), providers=("ort_cpu",))
    (r.path / "conf/models/tiny_bad.yaml").write_text(
        TINY_MLP.replace("tiny_mlp:", "tiny_bad:").replace("shape: [4, 16]", "shape: [4, 15]"))
    r.commit("a model whose input does not fit it")
    p = r.run([f"{BIN}/parity", "sweep", "models=[tiny_mlp],[tiny_bad]", "--json"], check=False)
    assert p.returncode == 1, p.stdout + p.stderr
    exps = json.loads(p.stdout)["experiments"]
    assert [e["status"] for e in exps] == ["Success", "Failed"], exps
    assert exps[0]["cells"] == {"tiny_mlp-fp32-ort_cpu": "PASS"}
    bad = exps[1]["name"]
    assert f"{bad} (models=[tiny_bad]) done: FAILED" in p.stderr, p.stderr
    tail = [ln for ln in p.stderr.splitlines() if ln.startswith(f"parity sweep:   {bad} | ")]
    assert tail and "mat1 and mat2 shapes cannot be multiplied" in "\n".join(tail), p.stderr
    assert f"experiments that did not finish: {bad}" in p.stderr


@pytest.mark.parametrize("overrides, n", [(["seed=range(1,4)"], 3), (["dtypes=fp32,fp16", "models=[a],[b,c]"], 4)])
def test_sweep_expansion_is_dvcs(overrides, n):
    from dvc.utils.hydra import get_hydra_sweeps

    from parity.commands.sweep import expand

    combos = expand(overrides)
    assert len(combos) == n
    assert combos == [s["params.yaml"] for s in get_hydra_sweeps({"params.yaml": overrides})]
