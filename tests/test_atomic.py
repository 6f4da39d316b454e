"""Atomic writes: a stage that fails or is killed never publishes a partial or empty file.

- a failed export (the exporter raises) leaves no layers.onnx (it used to rename the empty temp
  file into place: a 0-byte layers.onnx that then went into dvc.lock);
- an input shape the model cannot take is refused by the export stage before it exports, in one
  line naming models.<m>.input, and nothing is written;
- stage processes killed with SIGKILL at random points leave, under their outputs, only complete
  files (Parquet readable, JSON parseable, ONNX loadable): atomic_path's hidden temp files aside.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import env, is_temp, make_repo
from parity.core.io import atomic_path

NO_EXPORT_MODEL = '''\
"""Runs eagerly, cannot be exported: a custom op with no ONNX translation."""
import torch


@torch.library.custom_op("paritytest::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x):
    return torch.empty_like(x)


class NoExport(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)

    def forward(self, x):
        return twice(self.fc(x))
'''
NO_EXPORT_CONF = """\
noexport:
  arch: {source: import, name: "paritytest_models:NoExport"}
  input:
    - {name: input, shape: [4, 16], dtype: float32, init: normal, mean: 0.0, std: 1.0}
  tolerances: []
"""


def test_atomic_path_publishes_nothing_when_the_block_returns_early_or_raises(tmp_path):
    def early(path):
        with atomic_path(path):
            return 1  # a block that returns before writing (stages/export.py did)

    assert early(tmp_path / "a.onnx") == 1
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "b.onnx") as tmp:
        tmp.write_bytes(b"partial")
        raise RuntimeError("exporter failed half way")
    with atomic_path(tmp_path / "c.json") as tmp:
        tmp.write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json"]  # no temp file left either


def test_failed_export_leaves_no_layers_onnx(tmp_path):
    r = make_repo(tmp_path / "repo", models=("noexport",), dtypes=("fp32",), providers=("ort_cpu",),
                  compose=False)
    (r.path / "paritytest_models.py").write_text(NO_EXPORT_MODEL)
    (r.path / "conf/models/noexport.yaml").write_text(NO_EXPORT_CONF)
    r.run(["parity", "compose"])
    p = r.run(["dvc", "repro", "export@noexport"], check=False)
    assert p.returncode != 0
    assert "export@noexport: EXPORT_FAIL with exporter=dynamo opset=18" in p.stderr, p.stderr
    out = r.path / "artifacts/models/noexport"
    assert not (out / "layers.onnx").exists() and not (out / "model.onnx").exists()
    assert not out.exists() or not [f for f in out.rglob("*") if f.is_file()]


def test_an_input_shape_the_model_cannot_take_is_named_in_one_line(tmp_path):
    r = make_repo(tmp_path / "repo", dtypes=("fp32",), providers=("ort_cpu",), compose=False)
    r.edit("conf/models/tiny_mlp.yaml", "shape: [4, 16]", "shape: [4, 15]")
    r.run(["parity", "compose"])
    p = r.run(["dvc", "repro", "export@tiny_mlp"], check=False)
    assert p.returncode != 0
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("export@tiny_mlp")]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("export@tiny_mlp: models.tiny_mlp.input: the model does not accept inputs "
                               "of shape [4, 15]: RuntimeError: "), lines[0]
    assert "export.opset" not in p.stderr and "Traceback" not in p.stderr
    out = r.path / "artifacts/models/tiny_mlp"
    assert not out.exists() or not [f for f in out.rglob("*") if f.is_file()]


def complete(f: Path) -> None:
    """Raise unless `f` is a whole artifact of its kind."""
    if f.suffix == ".parquet":
        import pyarrow.parquet as pq

        pq.read_table(f)
    elif f.suffix == ".json":
        json.loads(f.read_text())
    elif f.suffix == ".onnx":
        import onnx

        from parity.models.onnx_weights import load_with_data

        onnx.checker.check_model(load_with_data(f))  # weights.bin: DVC hard-links it (onnx's loader refuses that)
    else:
        assert f.stat().st_size > 0, f


def published(root: Path) -> list[Path]:
    return [f for f in sorted(root.rglob("*")) if f.is_file() and not is_temp(f)]


def kill_at(cmd: list[str], cwd: Path, delay: float) -> None:
    proc = subprocess.Popen(cmd, cwd=cwd, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


WRITER = """\
import sys
import numpy as np
from parity.core import io, store
out = sys.argv[1]
rng = np.random.default_rng(0)
for i in range(10_000):
    io.write_json(f"{out}/j{i % 7}.json", {"i": i, "v": rng.standard_normal(50_000).tolist()})
    store.write(f"{out}/t{i % 5}.parquet", store.rows_from(0, [("x", rng.standard_normal((256, 1024)))]))
"""


def test_a_writer_killed_at_random_points_never_publishes_a_partial_file(tmp_path):
    """Dense: a process that does nothing but write JSON and Parquet through parity.core.io/store,
    killed at random delays, so kills land inside writes."""
    rnd = random.Random(8)
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    out = tmp_path / "out"
    out.mkdir()
    for _ in range(6):
        kill_at([sys.executable, str(script), str(out)], Path(__file__).resolve().parents[1], rnd.uniform(1.0, 4.0))
        files = published(out)
        for f in files:
            complete(f)
    assert files, "the writer never published anything: kills came too early to test anything"


def test_stages_killed_at_random_points_publish_only_complete_files(tmp_path):
    """reference and torch capture of a small model, each killed 4 times late in its run (where
    it writes); their complete runs and the export print no warning either."""
    r = make_repo(tmp_path / "repo", dtypes=("fp32",), providers=("torch_cpu",))
    p = r.run(["dvc", "repro", "inputs@tiny_mlp", "export@tiny_mlp"])
    assert "Warning" not in p.stdout + p.stderr, p.stderr  # quiet runs: no LeafSpec FutureWarning
    art = r.path / "artifacts"
    ref = [sys.executable, "-m", "stages.reference", "--model", "tiny_mlp", "--inputs",
           "artifacts/inputs/tiny_mlp.parquet", "--out", "artifacts/killed/reference"]
    cap = [sys.executable, "-m", "stages.capture", "--model", "tiny_mlp", "--dtype", "fp32", "--provider", "torch_cpu",
           "--model-dir", "artifacts/models/tiny_mlp", "--inputs", "artifacts/inputs/tiny_mlp.parquet",
           "--calibration", "artifacts/inputs/tiny_mlp.calibration.parquet",
           "--out", "artifacts/killed/capture", "--timing", "artifacts/killed/timing.json"]
    rnd = random.Random(8)
    for cmd in (ref, cap):
        t0 = time.monotonic()
        done = subprocess.run(cmd, cwd=r.path, env=env(), check=True, capture_output=True, text=True)
        whole = time.monotonic() - t0  # how long a whole run takes
        assert "Warning" not in done.stdout + done.stderr, done.stderr  # no "NumPy array is not writable"
        for _ in range(4):
            shutil.rmtree(art / "killed", ignore_errors=True)  # only what the killed run published is checked
            kill_at(cmd, r.path, rnd.uniform(0.6, 1.0) * whole)  # late: where the writes happen
            for f in published(art / "killed"):
                complete(f)
    for f in published(art):
        complete(f)
