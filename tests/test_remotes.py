"""Sharing (flow 4): push artifacts + run-cache to a remote; a teammate's fresh clone runs nothing that
already ran. One source repo (tiny model, 4 cells, two commits so HEAD~1 exists) is pushed to each
remote kind, each started on loopback:

  local   a directory (what `make setup` configures as the per-machine default)
  s3      moto's S3 server (ThreadedMotoServer on 127.0.0.1) through dvc-s3
  ssh     a private `sshd -D` on 127.0.0.1 (own config, host key and authorized key in a temp dir)
          through dvc-ssh; skipped, saying why, where openssh-server is not installed

For each: a `git clone` of the source runs `dvc repro --pull`; only the `env` probe (always_changed)
may execute, every artifact is byte-identical to the source's, `dvc status` is clean, and
`dvc metrics diff HEAD~1` shows both revisions' values (summary.json and each cell's metrics.json are
DVC-cached outs, pushed with the rest: docs/sharing.md).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ENV, make_repo, ran_stages, run, tree_digest

CELLS = [f"tiny_mlp-{d}-{p}" for d in ("fp32", "fp16") for p in ("torch_cpu", "ort_cpu")]
SSHD = shutil.which("sshd") or next((p for p in ("/usr/sbin/sshd", "/sbin/sshd") if os.path.exists(p)), None)
SFTP_SERVER = next((p for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server",
                                "/usr/libexec/sftp-server") if os.path.exists(p)), None)
BUCKET = "parity-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen | None = None, log: Path | None = None,
              timeout: float = 20.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {log.read_text() if log else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


# --- servers -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def s3_server():
    pytest.importorskip("dvc_s3", reason="dvc-s3 not installed (pip install -e '.[dev]')")
    server_mod = pytest.importorskip("moto.server", reason="moto[server] not installed (pip install -e '.[dev]')")
    import boto3

    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket=BUCKET)
    yield endpoint
    server.stop()


@pytest.fixture(scope="module")
def sshd_server(tmp_path_factory):
    """A throwaway sshd on 127.0.0.1: its own host key, one authorized key, sftp, no PAM."""
    if SSHD is None:
        pytest.skip("sshd not installed (Debian: apt-get install openssh-server; .ci/run installs it "
                    "when it runs as root with apt)")
    if SFTP_SERVER is None:
        pytest.skip("openssh sftp-server not found (dvc-ssh needs the sftp subsystem)")
    pytest.importorskip("dvc_ssh", reason="dvc-ssh not installed (pip install -e '.[dev]')")
    d = tmp_path_factory.mktemp("sshd")
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    os.chmod(d / "authorized_keys", 0o600)
    port = free_port()
    (d / "sshd_config").write_text(f"""\
ListenAddress 127.0.0.1
Port {port}
HostKey {d / 'host_key'}
PidFile {d / 'sshd.pid'}
AuthorizedKeysFile {d / 'authorized_keys'}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
Subsystem sftp {SFTP_SERVER}
""")
    if os.geteuid() == 0:  # sshd as root insists on its privilege-separation directory
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    log = d / "sshd.log"
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")],
                            stdout=subprocess.DEVNULL, stderr=log.open("w"))
    try:
        wait_port(port, proc, log)
        import getpass

        yield {"user": getpass.getuser(), "port": port, "keyfile": str(d / "client_key"), "dir": d}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


# --- the source repo: run once, two commits --------------------------------------------------------

@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A repo after a full run, then a tolerance change re-run (HEAD~1 has the first results)."""
    repo = make_repo(tmp_path_factory.mktemp("remotes") / "source", pool=False)  # what it pushes is counted
    repo.run(["dvc", "repro"])
    repo.commit("first run")
    repo.edit("params.yaml", "atol: 1.0e-05", "atol: 2.0e-05")  # dtypes.fp16.tol.atol
    ran = set(repo.repro()) - {ENV}
    assert ran == {"diff@tiny_mlp-fp16-torch_cpu", "diff@tiny_mlp-fp16-ort_cpu", "report"}, ran
    repo.commit("fp16 atol 2e-5")
    return repo


def configure(repo_path: Path, kind: str, where, name: str) -> None:
    """Add remote `name` (made default) of the given kind; credentials go to .dvc/config.local."""
    def dvc(*args):
        run(["dvc", "remote", *args], repo_path)

    if kind == "local":
        dvc("add", "--local", "-f", "-d", name, str(where))
    elif kind == "s3":
        dvc("add", "--local", "-f", "-d", name, f"s3://{BUCKET}/{name}")
        dvc("modify", "--local", name, "endpointurl", where)
        dvc("modify", "--local", name, "region", "us-east-1")
        dvc("modify", "--local", name, "access_key_id", "testing")
        dvc("modify", "--local", name, "secret_access_key", "testing")
    elif kind == "ssh":
        dvc("add", "--local", "-f", "-d", name,
            f"ssh://{where['user']}@127.0.0.1:{where['port']}{where['dir'] / 'store' / name}")
        dvc("modify", "--local", name, "keyfile", where["keyfile"])
    else:
        raise ValueError(kind)


def share_and_restore(source, tmp_path: Path, kind: str, where) -> None:
    configure(source.path, kind, where, kind)
    # -A: every commit's outputs (HEAD~1's metrics too: `dvc metrics diff` reads old revisions from
    # the remote); --run-cache: the run entries, so `dvc repro --pull` restores instead of re-running
    out = source.run(["dvc", "push", "-A", "--run-cache", "-r", kind]).stdout
    assert "pushed" in out or "Everything is up to date" in out, out

    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(source.path), str(clone)], tmp_path)
    configure(clone, kind, where, kind)
    p = run(["dvc", "repro", "--pull"], clone)
    ran = ran_stages(p.stdout)
    # nothing that ran on the source runs again: only the always_changed env probe
    assert set(ran) <= {ENV}, (ran, p.stdout)
    assert not {s for s in ran if s.split("@")[0] in ("export", "capture", "engine", "reference", "diff")}
    # the very same bytes: ONNX, Parquet captures, metrics, report, latency files
    src, dst = tree_digest(source.path / "artifacts"), tree_digest(clone / "artifacts")
    assert len(src) > 20 and src == dst, {k for k in src.keys() | dst.keys() if src.get(k) != dst.get(k)}
    assert run(["dvc", "status"], clone).stdout.split() == [f"{ENV}:", "always", "changed"]
    # history works in the clone: both revisions' metrics are read (HEAD~1's straight from the remote):
    # the summary (the DVC metric: one entry per cell) and each cell's details (metrics.json, a plain
    # output, read as a target), where the fp16 tolerance change moved the tolerance metrics
    diff = json.loads(run(["dvc", "metrics", "diff", "HEAD~1", "--all", "--json"], clone).stdout)
    summary = diff["artifacts/report/summary.json"]
    assert summary["tiny_mlp-fp16-ort_cpu.verdict"]["old"] == summary["tiny_mlp-fp16-ort_cpu.verdict"]["new"]
    for cell in ("tiny_mlp-fp16-torch_cpu", "tiny_mlp-fp16-ort_cpu"):
        path = f"artifacts/diff/{cell}/metrics.json"
        some = json.loads(run(["dvc", "metrics", "diff", "HEAD~1", "--json", "--targets", path], clone).stdout)[path]
        assert any(v.get("old") is not None and v.get("new") is not None and v["old"] != v["new"]
                   for v in some.values()), some


def test_local_directory_remote(source, tmp_path):
    share_and_restore(source, tmp_path, "local", tmp_path / "dvc-remote")


def test_s3_remote_on_moto(source, tmp_path, s3_server):
    share_and_restore(source, tmp_path, "s3", s3_server)


def test_ssh_remote_on_local_sshd(source, tmp_path, sshd_server):
    share_and_restore(source, tmp_path, "ssh", sshd_server)
