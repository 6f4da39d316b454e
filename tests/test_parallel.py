"""Parallel cells (parity.commands.parallel, behind `parity repro -j N`): the same dvc.lock and metrics as a
sequential `dvc repro`, filters that run only some cells, and a failing cell that does not stop the
others. Real DVC, tiny model, 4 cells (fp32/fp16 x torch_cpu/ort_cpu); two repos: one sequential, one
parallel (the later tests build on the parallel one, in order).
"""

from __future__ import annotations

import io
import json

import pytest
import yaml

from conftest import ENV, make_repo, tree_digest

CELLS = [f"tiny_mlp-{d}-{p}" for d in ("fp32", "fp16") for p in ("torch_cpu", "ort_cpu")]
MEASURED = ("artifacts/timing", "artifacts/report")  # latency: measured, differs run to run


def lock_without_latency(path) -> dict:
    """dvc.lock with the hashes of measured files (latency and the report that shows it) removed."""
    lock = yaml.safe_load(path.read_text())
    for stage in lock["stages"].values():
        for kind in ("deps", "outs"):
            for entry in stage.get(kind, []):
                if entry["path"].startswith(MEASURED):
                    for k in ("md5", "size", "nfiles", "hash"):
                        entry.pop(k, None)
    return lock


def metrics(root) -> dict:
    out = {}
    for f in sorted((root / "artifacts" / "diff").glob("*/metrics.json")):
        out[f.parent.name] = json.loads(f.read_text())
    summary = json.loads((root / "artifacts/report/summary.json").read_text())
    out["summary"] = summary
    return out


def prepro(repo, *args, **kw):
    from parity.commands import parallel

    buf = io.StringIO()
    res = parallel.repro(*args, root=repo.path, progress=buf, **kw)
    return res, buf.getvalue()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("parallel")
    # par really runs every stage; seq is what a sequential `dvc repro` gives: its stages run, or restored
    # from the run-cache pool (filled only by sequential `dvc repro` / `dvc exp run` of other tests' repos
    # with the same commands, deps and params: the same bytes, and ~35 s of CPU less: issue 38)
    seq, par = make_repo(base / "seq"), make_repo(base / "par", pool=False)
    seq.repro()
    return seq, par


def test_parallel_equals_sequential(pair):
    seq, par = pair
    res, log = prepro(par, 2)
    assert res.returncode == 0 and not res.failed, log
    ran = res.ran
    assert sorted(ran) == sorted([ENV, "inputs@tiny_mlp", "export@tiny_mlp", "reference@tiny_mlp", "report",
                                  *(f"baseline@tiny_mlp-{d}" for d in sorted({c.split("-")[1] for c in CELLS})),
                                  *(f"{s}@{c}" for c in CELLS for s in ("capture", "diff"))]), ran
    assert len(ran) == len(set(ran))  # no stage ran twice
    assert ran.index("report") == len(ran) - 1 and ran[0] == ENV
    assert "4/4" in log and "report" in log
    # every cell with its verdict, and the counts at the end
    # torch_cpu cells are the oracle's own baseline backend: BASELINE, not a PASS that cannot fail
    assert all(f"{c}: {'BASELINE' if c.endswith('torch_cpu') else 'PASS'} in " in log for c in CELLS), log
    assert log.rstrip().splitlines()[-1].endswith("verdicts: 2 PASS, 2 BASELINE"), log
    # same lock (modulo measured latency) and the same metrics, bit for bit
    assert lock_without_latency(par.path / "dvc.lock") == lock_without_latency(seq.path / "dvc.lock")
    assert metrics(par.path) == metrics(seq.path)
    s, p = tree_digest(seq.path / "artifacts"), tree_digest(par.path / "artifacts")
    assert {k for k in s if s[k] != p.get(k) and not k.startswith(("timing/", "report/"))} == set()
    assert par.run("dvc status").stdout.split() == [f"{ENV}:", "always", "changed"]


def test_nothing_to_do_runs_no_cell(pair):
    _, par = pair
    res, log = prepro(par, 2)
    assert res.returncode == 0 and res.cells_run == [] and set(res.ran) == {ENV}, log


def test_filter_runs_only_selected_cells_and_leaves_the_report(pair):
    _, par = pair
    par.edit("params.yaml", "atol: 1.0e-05", "atol: 2.0e-05")  # dtypes.fp16.tol.atol: fp16 diffs stale
    res, log = prepro(par, 2, providers=["ort_cpu"])
    assert res.returncode == 0, log
    assert set(res.ran) == {ENV, "diff@tiny_mlp-fp16-ort_cpu"}, log
    assert res.report_skipped and "report not run" in log
    # the other provider's stale cell and the report are still pending
    stale = set(json.loads(par.run(["dvc", "status", "--json"]).stdout))
    assert stale == {ENV, "diff@tiny_mlp-fp16-torch_cpu", "report"}
    res, log = prepro(par, 2, dtypes=["fp16"], models=["tiny_mlp"])  # the rest (2 of 4 cells: no report)
    assert set(res.ran) == {ENV, "diff@tiny_mlp-fp16-torch_cpu"} and res.report_skipped, log
    res, log = prepro(par, 2)  # every cell is in: only the report is left
    assert res.returncode == 0 and res.cells_run == [] and set(res.ran) == {ENV, "report"}, log
    assert par.run("dvc status").stdout.split() == [f"{ENV}:", "always", "changed"]


def test_unknown_filter_value_is_rejected(pair):
    _, par = pair
    res, log = prepro(par, 2, providers=["tpu"])
    assert res.returncode == 2 and "tpu" in log and "ort_cpu" in log and res.ran == []


def test_failing_cell_is_reported_and_others_complete(pair):
    _, par = pair
    bad = "tiny_mlp-fp16-ort_cpu"
    # every diff command changes (so every diff re-runs); one cell's command fails
    par.edit("dvc.yaml", "      python -m stages.diff --model",
             f"      test ${{key}} != {bad} && python -m stages.diff --model")
    res, log = prepro(par, 2)
    assert res.returncode == 1, log
    assert list(res.failed) == [bad] and f"diff@{bad}" in res.failed[bad], res.failed
    assert f"{bad}: FAILED" in log and "1 failed" in log
    assert log.rstrip().splitlines()[-1].endswith(f"verdicts: 1 PASS, 2 BASELINE, 1 FAILED ({bad})"), log
    assert {f"diff@{c}" for c in CELLS} <= set(res.ran)
    assert "report" not in res.ran and "report not run" in log  # as `dvc repro -k`: not over a failed cell
    stale = set(json.loads(par.run(["dvc", "status", "--json"]).stdout))
    assert f"diff@{bad}" in stale and not {f"diff@{c}" for c in CELLS if c != bad} & stale
