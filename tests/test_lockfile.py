"""`parity compose` drops the dvc.lock entries of stages the new params no longer have (DVC keeps them,
and rewrites the whole lock on every stage run), keeps every other entry byte for byte, and a stage
that comes back is restored from DVC's run-cache instead of re-run."""

from __future__ import annotations

import yaml

from conftest import BIN, ENV, make_repo


def _lock(repo) -> dict:
    return yaml.safe_load((repo.path / "dvc.lock").read_text())["stages"]


def test_compose_drops_gone_stages_from_the_lock_and_they_come_back_without_running(tmp_path):
    repo = make_repo(tmp_path / "repo", dtypes=("fp32", "fp16"), providers=("ort_cpu",))
    repo.repro()
    before = _lock(repo)
    fp16 = sorted(s for s in before if "fp16" in s)
    assert fp16  # baseline, capture and diff of the fp16 cell

    p = repo.run([f"{BIN}/parity", "compose", "-S", "dtypes=[fp32]"])
    assert f"dvc.lock: dropped {len(fp16)} entries" in p.stdout, p.stdout
    after = _lock(repo)
    assert sorted(after) == sorted(s for s in before if s not in fp16)
    assert all(after[s] == before[s] for s in after)  # the kept entries as they were
    ran = repo.repro()
    assert not [s for s in ran if s.split("@")[0] in ("inputs", "export", "reference", "baseline", "capture", "diff")], ran

    again = repo.run([f"{BIN}/parity", "compose", "-S", "dtypes=[fp32]"])
    assert "dropped" not in again.stdout  # nothing left to drop: the lock is untouched

    repo.run([f"{BIN}/parity", "compose"])  # fp16 back
    out = repo.run(["dvc", "repro"]).stdout
    assert not [s for s in fp16 if f"Running stage '{s}'" in out], out  # restored from the run-cache
    assert sorted(_lock(repo)) == sorted(before)
    assert ENV in repo.repro()


def test_compose_away_from_every_stage_leaves_a_lock_dvc_reads(tmp_path):
    """Every entry dropped (another model composed in): the lock keeps an empty `stages: {}`, which
    DVC reads, and the new model's stages run."""
    repo = make_repo(tmp_path / "repo", dtypes=("fp32",), providers=("ort_cpu",))
    repo.repro("export@tiny_mlp")
    p = repo.run([f"{BIN}/parity", "compose", "-S", "models=[mlp]"])
    assert "dvc.lock: dropped" in p.stdout, p.stdout
    assert _lock(repo) == {}
    assert "export@mlp" in repo.repro("export@mlp")
