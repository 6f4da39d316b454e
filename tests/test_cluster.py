"""`parity repro --cluster` on a real local Ray cluster (issue 12; docs/cluster.md).

Several Ray nodes on this machine (ray.cluster_utils.Cluster: each its own raylet, its own custom
resources and its own work dir through PARITY_WORKDIR), a real DVC directory remote, the real
`parity` CLI as the driver. Nodes are small (one CPU each, 80 MiB object store, no dashboard) and every
Ray process is stopped in teardown.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.conftest import BIN, ENV, env, make_repo, ran_stages

ray = pytest.importorskip("ray")

NODE = dict(num_cpus=1, object_store_memory=80 * 2**20)
STARTS = 3  # cluster start attempts (see LocalCluster._start)


class LocalCluster:
    """A head plus worker nodes; node i advertises `provider:<p>` for its providers and runs cells in
    workdirs[i]."""

    def __init__(self, tmp: Path, providers_per_node: list[list[str]]):
        self.workdirs = [tmp / f"node{i}" for i in range(len(providers_per_node))]
        args = [dict(NODE, resources={f"provider:{p}": 1.0 for p in provs},
                     env_vars={"PARITY_WORKDIR": str(w)})
                for provs, w in zip(providers_per_node, self.workdirs)]
        for attempt in range(1, STARTS + 1):
            try:
                self._start(args)
                break
            except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for a slow raylet
                if "timed out during startup" not in str(e) or attempt == STARTS:
                    raise
                self._kill_started()
        self.address = self.cluster.address

    def _start(self, args) -> None:
        """Ray's Node waits a fixed 30 s for each raylet to register with the GCS (ray/_private/node.py,
        not configurable); on two cores loaded by other jobs a raylet can take longer (issue 25 item
        30). The processes a failed start left are killed and the whole cluster started again."""
        from ray.cluster_utils import Cluster

        self._before = {c.pid for c in psutil.Process().children(recursive=True)}
        self.cluster = None
        self.cluster = Cluster(initialize_head=True, head_node_args=dict(args[0], include_dashboard=False))
        self.nodes = [self.cluster.head_node]
        for a in args[1:]:
            self.nodes.append(self.cluster.add_node(**a))

    def _kill_started(self) -> None:
        with contextlib.suppress(Exception):
            if self.cluster is not None:
                self.cluster.shutdown()
        new = [c for c in psutil.Process().children(recursive=True) if c.pid not in self._before]
        for c in new:
            with contextlib.suppress(psutil.Error):
                c.kill()
        psutil.wait_procs(new, timeout=30)

    def node_id(self, i: int) -> str:
        return self.nodes[i].node_id

    def shutdown(self) -> None:
        self.cluster.shutdown()


@pytest.fixture
def local_cluster(tmp_path):
    made: list[LocalCluster] = []

    def start(providers_per_node):
        c = LocalCluster(tmp_path, providers_per_node)
        made.append(c)
        return c

    yield start
    for c in made:
        c.shutdown()


def procs_under(path: Path) -> list[int]:
    """Live processes whose working directory is under `path` (Linux /proc)."""
    pids = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if Path(os.readlink(d / "cwd")).is_relative_to(path):
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


def gone_within(path: Path, seconds: float = 20.0) -> list[int]:
    end = time.monotonic() + seconds
    while procs_under(path) and time.monotonic() < end:
        time.sleep(0.2)
    return procs_under(path)


def wait_phase(cl: LocalCluster, nodes, phase: str, proc: subprocess.Popen, seconds: float = 600) -> int | None:
    """The first of `nodes` whose task reaches `phase` (its running.json), or None if the driver ended."""
    end = time.monotonic() + seconds
    while proc.poll() is None and time.monotonic() < end:
        for i in nodes:
            m = cl.workdirs[i] / "running.json"
            with contextlib.suppress(OSError, ValueError):
                if json.loads(m.read_text()).get("phase") == phase:
                    return i
        time.sleep(0.05)
    return None


def stopped_in_run(workdir: Path) -> list[str]:
    """The phases a node's task entered, if it stopped in its dvc repro and never went on to push
    (after its dvc is killed the task may still note "done" before the worker itself dies); else []."""
    phases = json.loads((workdir / "running.json").read_text())["phases"]
    return phases if "run" in phases and "push" not in phases else []


def with_remote(repo, tmp: Path) -> None:
    remote = tmp / "remote"
    remote.mkdir()
    repo.run(["dvc", "remote", "add", "-d", "--local", "store", str(remote)])


def parity_repro(repo, *args, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run([f"{BIN}/parity", "repro", *args], cwd=repo.path, env=env(), capture_output=True,
                       text=True, timeout=900)
    if check and p.returncode:
        raise AssertionError(f"parity repro {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


def status(repo, cell: str) -> dict:
    return json.loads((repo.path / "artifacts" / "capture" / cell / "status.json").read_text())


def cells_of(repo) -> list[str]:
    p = yaml.safe_load((repo.path / "params.yaml").read_text())
    return [f"{m}-{d}-{q}" for m in p["models"] for d in p["dtypes"] for q in p["providers"]]


def lock_without_captures(path: Path) -> dict:
    """dvc.lock with the capture folders' hashes left out (they hold status.json, whose `node` names the
    machine: the one way a cluster run's bytes differ from a local run's); everything else compared."""
    lock = yaml.safe_load(path.read_text())["stages"]
    for name, st in lock.items():
        for kind in ("deps", "outs"):
            # and the timing files (each stage's wall time and peak RSS: measured, never the same twice)
            st[kind] = [e for e in st.get(kind, []) if not e["path"].startswith(("artifacts/capture/", "artifacts/timing", "artifacts/report/report."))]
    return lock


def assert_same_as_sequential(repo, seq, cells: list[str]) -> None:
    assert lock_without_captures(repo.path / "dvc.lock") == lock_without_captures(seq.path / "dvc.lock")
    for c in cells:
        for f in ("layers.parquet", "own.parquet"):
            a, b = repo.path / "artifacts/capture" / c / f, seq.path / "artifacts/capture" / c / f
            assert a.exists() == b.exists() and (not a.exists() or a.read_bytes() == b.read_bytes()), (c, f)
        st = status(repo, c)
        assert st.pop("node")["hostname"]
        assert st == status(seq, c), c
        m = f"artifacts/diff/{c}/metrics.json"
        assert (repo.path / m).read_bytes() == (seq.path / m).read_bytes(), m
    s = "artifacts/report/summary.json"
    assert (repo.path / s).read_bytes() == (seq.path / s).read_bytes()


def sequential_twin(repo, tmp: Path):
    """A clone of the same commit, reproduced by a plain sequential `dvc repro` (no remote)."""
    from tests.conftest import Repo, run

    run(["git", "clone", "-q", str(repo.path), str(tmp / "seq")], tmp)
    seq = Repo(tmp / "seq")
    seq.run(["dvc", "repro"])
    return seq


def test_cells_land_on_nodes_advertising_their_provider(tmp_path, local_cluster):
    """Two nodes, one provider each: every cell runs on the node that advertises its provider, the
    driver restores them all from the run-cache (no cell stage runs on the driver), the lock and
    metrics equal a sequential `dvc repro` of the same commit, and a following `dvc repro` runs only env."""
    repo = make_repo(tmp_path / "repo", dtypes=("fp32",), providers=("torch_cpu", "ort_cpu"), pool=False)  # run-cache entries counted
    with_remote(repo, tmp_path)
    cl = local_cluster([["torch_cpu"], ["ort_cpu"]])
    p = parity_repro(repo, "--cluster", cl.address)
    log = p.stdout + p.stderr
    cells = cells_of(repo)
    where = {"torch_cpu": cl.node_id(0), "ort_cpu": cl.node_id(1)}
    for c in cells:
        node = status(repo, c)["node"]
        assert node["ray_node_id"] == where[c.split("-")[-1]], (c, node, log)
        assert "cpu" in node["fingerprint"]
        assert f"{c}: {'BASELINE' if c.endswith('torch_cpu') else 'PASS'} on " in log
    assert "ran here" not in log and "warning" not in log, log
    # each node's own work dir holds its checkout
    for i in (0, 1):
        assert (cl.workdirs[i] / "slot-0" / ".git").exists()
    seq = sequential_twin(repo, tmp_path)
    assert_same_as_sequential(repo, seq, cells)
    assert repo.repro() == [ENV]


def test_killed_node_mid_cell_completes_elsewhere(tmp_path, local_cluster):
    """Two nodes advertise ort_cpu; the node that starts the cell is killed while its dvc repro runs:
    Ray re-runs the task on the other node, the cell completes there once, and nothing is lost."""
    repo = make_repo(tmp_path / "repo", dtypes=("fp32",), providers=("ort_cpu",), pool=False)  # run-cache entries counted
    with_remote(repo, tmp_path)
    cl = local_cluster([[], ["ort_cpu"], ["ort_cpu"]])
    drv = subprocess.Popen([f"{BIN}/parity", "repro", "--cluster", cl.address], cwd=repo.path, env=env(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed = wait_phase(cl, (1, 2), "run", drv)
    if killed is not None:
        cl.cluster.remove_node(cl.nodes[killed], allow_graceful=False)
    out, _ = drv.communicate(timeout=900)
    assert killed is not None, out
    assert drv.returncode == 0, out
    (cell,) = cells_of(repo)
    survivor = 3 - killed
    assert status(repo, cell)["node"]["ray_node_id"] == cl.node_id(survivor), out
    assert out.count(f"{cell}: {'BASELINE' if cell.endswith('torch_cpu') else 'PASS'} on ") == 1, out
    # the killed attempt pushed nothing: one run-cache entry per cell stage on the remote
    runs = [d for d in (tmp_path / "remote" / "runs").rglob("*") if d.is_file()]
    keys = {f.parent.name for f in runs}  # runs/<2-hex prefix>/<stage key>/<entry>: prefixes can collide
    assert len(runs) == len(keys), runs
    # the killed attempt stopped in its dvc repro and left no process behind
    assert stopped_in_run(cl.workdirs[killed])
    assert gone_within(cl.workdirs[killed]) == []
    assert repo.repro() == [ENV]


def test_ctrl_c_cancels_remote_tasks(tmp_path, local_cluster):
    """SIGINT to the driver while a node runs a cell: the driver cancels the task, exits 130, and no
    dvc or stage process of the cell is left on the node. The cell's capture command first sleeps, so
    the task is surely still in its run phase when the signal lands (a tiny cell could otherwise finish
    while a loaded machine delivers the cancel), and the sleep is one more process that must be gone."""
    repo = make_repo(tmp_path / "repo", dtypes=("fp32",), providers=("ort_cpu",), pool=False)  # run-cache entries counted
    repo.edit("dvc.yaml", "python -m stages.capture", "sleep 600 && python -m stages.capture")
    repo.commit("a capture that takes its time")
    with_remote(repo, tmp_path)
    cl = local_cluster([[], ["ort_cpu"]])
    drv = subprocess.Popen([f"{BIN}/parity", "repro", "--cluster", cl.address], cwd=repo.path, env=env(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert wait_phase(cl, (1,), "run", drv) == 1
    drv.send_signal(signal.SIGINT)
    out, _ = drv.communicate(timeout=300)
    assert drv.returncode == 130, out
    assert "cancelled 1 remote task(s)" in out, out
    assert gone_within(cl.workdirs[1]) == []
    assert stopped_in_run(cl.workdirs[1])


def test_provider_no_node_offers_is_unavailable_and_strict_fails(tmp_path, local_cluster):
    """ort_cpu_noopt is advertised by no node: its cells end UNAVAILABLE with the reason (the other
    provider's run on the cluster); with strict: true the run fails naming the cell."""
    repo = make_repo(tmp_path / "repo", dtypes=("fp32",), providers=("ort_cpu", "ort_cpu_noopt"), pool=False)  # run-cache entries counted
    with_remote(repo, tmp_path)
    cl = local_cluster([["ort_cpu"]])
    p = parity_repro(repo, "--cluster", cl.address)
    cell = "tiny_mlp-fp32-ort_cpu_noopt"
    st = status(repo, cell)
    assert (st["status"], st["reason"]) == ("UNAVAILABLE", "no node advertises provider:ort_cpu_noopt")
    assert "node" not in st  # it ran nowhere
    assert "no node advertises provider:ort_cpu_noopt" in p.stderr
    summary = (repo.path / "artifacts/report/summary.json").read_text()
    assert "UNAVAILABLE" in summary
    assert status(repo, "tiny_mlp-fp32-ort_cpu")["node"]["ray_node_id"] == cl.node_id(0)

    repo.edit("conf/config.yaml", "strict: false", "strict: true")
    repo.run([f"{BIN}/parity", "compose"])
    repo.commit("strict")
    p = parity_repro(repo, "--cluster", cl.address, check=False)
    assert p.returncode == 1, p.stderr
    assert f"these cells did not run: {cell}" in p.stderr, p.stderr


@pytest.mark.slow
def test_matrix_placement_across_three_nodes(tmp_path, local_cluster):
    """The acceptance matrix: 2 models x 2 dtypes x 4 providers. One node advertises only
    torch_compile, one only ort_int8, the head the rest: every cell is placed on a node that advertises
    its provider (status.json), the lock and metrics equal a sequential `dvc repro`, and a following
    `dvc repro` runs only env."""
    repo = make_repo(tmp_path / "repo", models=("tiny_mlp", "mlp"), dtypes=("fp32", "fp16"),
                     providers=("torch_cpu", "ort_cpu", "torch_compile", "ort_int8"), pool=False)
    with_remote(repo, tmp_path)
    cl = local_cluster([["torch_cpu", "ort_cpu"], ["torch_compile"], ["ort_int8"]])
    p = parity_repro(repo, "--cluster", cl.address)
    log = p.stdout + p.stderr
    cells = cells_of(repo)
    assert len(cells) == 16
    where = {"torch_cpu": 0, "ort_cpu": 0, "torch_compile": 1, "ort_int8": 2}
    for c in cells:
        assert status(repo, c)["node"]["ray_node_id"] == cl.node_id(where[c.split("-", 2)[2]]), (c, log)
    assert "ran here" not in log and "warning" not in log, log
    seq = sequential_twin(repo, tmp_path)
    assert_same_as_sequential(repo, seq, cells)
    assert repo.repro() == [ENV]


def test_worker_resources_come_from_the_env_probe():
    """`parity worker --resources`: one `provider:<name>` per provider whose runner is available here,
    none for TensorRT (not installed), and the reason on `parity worker` for each one left out."""
    p = subprocess.run([f"{BIN}/parity", "worker", "--resources"], env=env(), capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[1])
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert {"provider:torch_cpu", "provider:ort_cpu", "provider:ort_int8", "provider:torch_compile"} <= set(res)
    assert "provider:trt" not in res
    from parity.commands.cluster import node_resources

    _, missing = node_resources(Path(__file__).resolve().parents[1])
    assert "TensorRT" in missing["trt"]
