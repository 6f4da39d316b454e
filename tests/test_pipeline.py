"""The user flows on real DVC: a first run, a no-op re-run, and what re-runs after each kind of
change (tolerance, added dtype, opset), in a temporary git repo with a tiny model.

Tests in this module share one repo and run in order, each building on the last, as a user would.
"""

from __future__ import annotations

import json
import re

import pytest

from conftest import ENV, make_repo, tree_digest

CELLS = [f"tiny_mlp-{d}-{p}" for d in ("fp32", "fp16") for p in ("torch_cpu", "ort_cpu")]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_repo(tmp_path_factory.mktemp("pipeline") / "repo")


def test_first_repro_runs_every_stage_and_writes_results(repo):
    ran = repo.repro()
    expected = {ENV, "inputs@tiny_mlp", "export@tiny_mlp", "reference@tiny_mlp", "report"}
    expected |= {f"capture@{c}" for c in CELLS} | {f"diff@{c}" for c in CELLS}
    expected |= {"baseline@tiny_mlp-fp32", "baseline@tiny_mlp-fp16"}  # the oracle's trusted backend
    assert set(ran) == expected
    art = repo.path / "artifacts"
    for c in CELLS:
        m = json.loads((art / "diff" / c / "metrics.json").read_text())
        assert m["status"] == "OK" and m["layers"] == 3  # fc1, act, fc2
        assert m["plain_output"]["max_abs"] is not None  # the shipped graph is compared, not only timed
    # fp32: ort_cpu agrees with the reference; torch_cpu *is* the oracle's baseline computation, judged
    # against itself: BASELINE, not a PASS that cannot fail
    verdicts = {c: json.loads((art / "diff" / c / "metrics.json").read_text())["verdict"] for c in CELLS}
    assert verdicts["tiny_mlp-fp32-ort_cpu"] == "PASS" and verdicts["tiny_mlp-fp16-ort_cpu"] == "PASS"
    assert verdicts["tiny_mlp-fp32-torch_cpu"] == verdicts["tiny_mlp-fp16-torch_cpu"] == "BASELINE"
    summary = json.loads((art / "report" / "summary.json").read_text())
    assert summary["cells"] == 4 and set(k for k in summary if "-" in k) == set(CELLS)
    # the DVC metric is compact: the totals, then per cell its verdict, worst ratio and drift origin only
    assert list(summary)[:5] == ["cells", "passed", "failed", "not_run", "baseline"] and summary["baseline"] == 2
    for c in CELLS:
        assert set(summary[c]) <= {"verdict", "worst", "origin"} and summary[c]["verdict"] == verdicts[c]
    html = (art / "report" / "report.html").read_text()
    assert "<svg" in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    ops = json.loads((art / "models" / "tiny_mlp" / "ops.json").read_text())
    assert ops["opset"]["ai.onnx"] == 18 and ops["nodes"] > 0


def test_latency_is_opt_in(repo):
    """capture.latency: false (the default): nothing is timed; the timing file and the report say so."""
    art = repo.path / "artifacts"
    latency = json.loads((art / "report" / "latency.json").read_text())
    for c in CELLS:
        t = json.loads((art / "timing" / f"{c}.json").read_text())
        assert t["status"] == "OK" and t["latency"] is False and t["warmup"] == 0 and "median_ms" not in t
        assert latency["per_cell"][c]["median_ms"] is None and latency["per_cell"][c]["latency_ratio"] is None


def test_second_repro_runs_only_the_env_probe_and_leaves_the_lock_alone(repo):
    lock = repo.path / "dvc.lock"
    before = (lock.read_bytes(), lock.stat().st_mtime_ns)
    assert repo.repro() == [ENV]
    # the env probe's own small lock takes its run; the pipeline's dvc.lock is not even rewritten
    assert (lock.read_bytes(), lock.stat().st_mtime_ns) == before
    assert "env:" in (repo.path / "env" / "dvc.lock").read_text()
    # DVC lists an always_changed stage in `dvc status`; nothing else is stale
    assert repo.run("dvc status").stdout.split() == [f"{ENV}:", "always", "changed"]


def test_forced_rerun_is_byte_identical(repo):
    """Same inputs, same bytes: re-running the heavy stages changes nothing downstream."""
    art = repo.path / "artifacts"
    before = tree_digest(art)
    for stage in ["inputs@tiny_mlp", "export@tiny_mlp", "reference@tiny_mlp",
                  *(f"capture@{c}" for c in CELLS), *(f"diff@{c}" for c in CELLS)]:
        repo.run(["dvc", "repro", "-f", "-s", stage])
    after = tree_digest(art)
    changed = {k for k in before if before[k] != after.get(k)}
    # latency is the one measured (non-deterministic) value; it lives apart from the values
    assert {k for k in changed if not k.startswith(("timing/", "report/"))} == set()
    assert set(repo.repro()) <= {ENV, "report"}  # report re-renders the new latency only


def test_tolerance_change_in_conf_reruns_only_diff_and_report(repo):
    repo.edit("conf/dtypes/fp16.yaml", "atol: 1.0e-5", "atol: 2.0e-5")
    ran = repo.exp_run()
    assert set(ran) - {ENV} == {"diff@tiny_mlp-fp16-torch_cpu", "diff@tiny_mlp-fp16-ort_cpu", "report"}
    m = json.loads((repo.path / "artifacts/diff/tiny_mlp-fp16-ort_cpu/layers.json").read_text())
    assert all(layer["atol"] == 2e-5 and layer["tol_source"] == "dtypes.fp16.tol" for layer in m["layers"])


def test_per_model_layer_pattern_override_reruns_only_that_models_diffs(repo):
    repo.edit("conf/models/tiny_mlp.yaml", "tolerances: []",
              "tolerances:\n    - {dtype: fp16, layer: 'fc*', atol: 1.0, rtol: 1.0}")
    ran = repo.exp_run()
    assert set(ran) - {ENV} == {f"diff@{c}" for c in CELLS} | {"report"}
    layers = json.loads((repo.path / "artifacts/diff/tiny_mlp-fp16-ort_cpu/layers.json").read_text())["layers"]
    src = {d["name"]: d["tol_source"] for d in layers}
    assert src["fc1"] == src["fc2"] == "models.tiny_mlp.tolerances[0]"
    assert src["act"] == "dtypes.fp16.tol"


def test_adding_a_dtype_runs_only_the_new_cells(repo):
    repo.set_defaults(dtypes=["fp32", "fp16", "bf16"])
    ran = repo.exp_run()
    new = {"tiny_mlp-bf16-torch_cpu", "tiny_mlp-bf16-ort_cpu"}
    assert set(ran) - {ENV} == ({f"capture@{c}" for c in new} | {f"diff@{c}" for c in new} | {"report"}
                                  | {"baseline@tiny_mlp-bf16"})
    art = repo.path / "artifacts"
    # ort_cpu declares no bf16: the cell is a reported result, not a crash and not silently skipped
    m = json.loads((art / "diff/tiny_mlp-bf16-ort_cpu/metrics.json").read_text())
    assert m["verdict"] == "UNSUPPORTED" and "fp32" in m["reason"]
    assert json.loads((art / "diff/tiny_mlp-bf16-torch_cpu/metrics.json").read_text())["status"] == "OK"
    assert "tiny_mlp-bf16-ort_cpu" in (art / "report/report.md").read_text()


def test_opset_change_reruns_export_and_everything_downstream(repo):
    repo.edit("conf/config.yaml", "opset: 18", "opset: 20")
    ran = set(repo.exp_run()) - {ENV}
    cells = [f"tiny_mlp-{d}-{p}" for d in ("fp32", "fp16", "bf16") for p in ("torch_cpu", "ort_cpu")]
    assert "export@tiny_mlp" in ran
    assert "inputs@tiny_mlp" not in ran  # upstream of export
    # the reference is made in the export's process (parity.pipeline.fold): its stage publishes the same
    # bytes again, so no baseline re-runs
    assert "reference@tiny_mlp" in ran and not {r for r in ran if r.startswith("baseline@")}
    # every capture depends on the export; diffs re-run where the captured bytes changed
    assert {f"capture@{c}" for c in cells} <= ran
    assert "report" in ran
    ops = json.loads((repo.path / "artifacts/models/tiny_mlp/ops.json").read_text())
    assert ops["opset"]["ai.onnx"] == 20


def test_oracle_verdict_by_default_and_tolerance_without_the_fp64_run(repo):
    art = repo.path / "artifacts"
    assert (art / "reference/tiny_mlp/fp64.parquet").exists()
    m = json.loads((art / "diff/tiny_mlp-fp16-torch_cpu/metrics.json").read_text())
    # torch_cpu fp16 IS the trusted backend at fp16: exactly as far from fp64 as itself
    assert m["verdict_mode"] == "oracle" and m["verdict"] == "BASELINE" and 0 < m["output"]["excess"] <= 1.0
    assert "cannot fail" in m["baseline"] and m["precision"]["exercised"]
    assert m["output"]["bits_lost"] is not None and m["worst_layer"] is None  # no layer worse than itself
    repo.edit("conf/config.yaml", "fp64: true", "fp64: false")
    ran = set(repo.exp_run()) - {ENV}
    # the export makes the reference (parity.pipeline.fold), so it re-runs with it; the inputs do not
    assert {"reference@tiny_mlp", "export@tiny_mlp"} <= ran and "inputs@tiny_mlp" not in ran
    assert not (art / "reference/tiny_mlp/fp64.parquet").exists()
    # captures and baselines re-run too: without the fp64 run they measure no own error
    m = json.loads((art / "diff/tiny_mlp-fp16-torch_cpu/metrics.json").read_text())
    assert m["verdict_mode"] == "tolerance" and "fp64" in m["verdict_mode_reason"]


@pytest.mark.parametrize("override, must_say", [
    ("models=[zzz]", ["zzz", "Available options in 'models'", "tiny_mlp", "resnet18"]),
    ("dtypes=[fp8]", ["fp8", "Available options in 'dtypes'", "bf16"]),
    ("providers=[tpu]", ["tpu", "ort_cpu", "torch_cpu"]),
    ("foo=1", ["foo"]),
    ("dtypes.fp16.tol.atoll=1", ["atoll"]),
    ("export.exporter=onnx2", ["onnx2", "dynamo", "legacy"]),
])
def test_bad_config_fails_clearly_and_writes_nothing(repo, override, must_say):
    art, params = repo.path / "artifacts", (repo.path / "params.yaml").read_text()
    before = tree_digest(art)
    p = repo.run(["dvc", "exp", "run", "-S", override], check=False)
    assert p.returncode != 0
    err = p.stdout + p.stderr
    for s in must_say:
        assert s in err, (s, err)
    assert "Running stage" not in err
    assert tree_digest(art) == before
    assert (repo.path / "params.yaml").read_text() == params


def test_hand_edited_bad_params_fail_parity_check(repo):
    params = repo.path / "params.yaml"
    good = params.read_text()
    try:
        params.write_text(good.replace("max_mismatch:", "max_mismatc:"))
        p = repo.run(["parity", "check"], check=False)
        assert p.returncode == 2
        assert "unknown key 'max_mismatc'" in p.stderr and "max_mismatch" in p.stderr
    finally:
        params.write_text(good)


@pytest.mark.slow  # parity sweep (tests/test_history.py) covers the same path in the fast set
def test_queued_precision_sweep_shares_export_and_reference(tmp_path):
    """`dvc exp run --queue -S 'dtypes=fp32,fp16,bf16'` + `dvc queue start`: one experiment per
    dtype; the shared stages run once and are restored from DVC's run-cache in the others."""
    r = make_repo(tmp_path / "repo", dtypes=("fp32",), providers=("ort_cpu",), pool=False)  # counts runs
    out = r.run(["dvc", "exp", "run", "--queue", "-S", "dtypes=fp32,fp16,bf16"]).stdout
    assert out.count("Queued experiment") == 3
    r.run(["dvc", "queue", "start", "-j", "1"])
    import time

    deadline = time.time() + 600
    while time.time() < deadline:
        status = r.run(["dvc", "queue", "status"]).stdout
        if "Queued" not in status and "Running" not in status:
            break
        time.sleep(2)
    assert status.count("Success") == 3, status
    runs = {}
    for line in status.splitlines()[1:]:
        parts = line.split()
        if len(parts) > 2 and parts[-1] == "Success":
            runs[parts[1]] = r.run(["dvc", "queue", "logs", parts[1]]).stdout
    executed = [set(re.findall(r"Running stage '([^']+)'", log)) for log in runs.values()]
    for shared in ("export@tiny_mlp", "reference@tiny_mlp", "inputs@tiny_mlp"):
        assert sum(shared in e for e in executed) == 1, shared
    exps = json.loads(r.run(["dvc", "exp", "show", "--json"]).stdout)
    names = [e["name"] for rev in exps for e in (rev.get("experiments") or []) for e in e.get("revs", [])
             if e.get("name")]
    assert len(names) == 3


def test_export_is_byte_identical_across_checkouts(tmp_path):
    """A teammate's clone elsewhere on disk exports the same bytes, so DVC caches hit across clones
    (the dynamo exporter's stack traces embed absolute paths: parity strips them)."""
    digests = []
    for where in ("a/repo", "b/some/other/place"):
        r = make_repo(tmp_path / where, dtypes=("fp32",), providers=("ort_cpu",), pool=False)  # each exports
        r.repro("export@tiny_mlp")
        digests.append(tree_digest(r.path / "artifacts/models"))
    # layers.onnx, model.onnx, weights.bin, layers.json, ops.json; the reference staged (parity.pipeline.fold)
    assert digests[0] == digests[1] and len([f for f in digests[0] if "/reference/" not in f]) == 5
