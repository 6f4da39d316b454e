"""Every bad config is refused at compose, before any stage runs: `parity compose` and DVC's own
compose on `dvc exp run` print ONE line naming the bad key or file, exit non-zero, and leave
params.yaml (and artifacts/) as they were. The input shape a model cannot take is only known with
torch: the export stage checks it first and says so in one line, writing nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import ROOT, make_repo, run

MISKEYED = """\
bar:
  arch: {source: parity, name: mlp, kwargs: {in_features: 16, hidden: 32, out_features: 8}}
  input: [{name: input, shape: [4, 16]}]
  tolerances: []
"""
BAD_NAME = MISKEYED.replace("bar:", "my-model:")
NO_TOLERANCES_SUITE = """\
notol:
  spec:
    dims: {D: 8}
    cases: [{id: relu, op: aten::relu, inputs: [{shape: [D]}]}]
"""
BROKEN_YAML = """\
broken:
  arch: {source: parity
  name: mlp
"""


@pytest.fixture
def project(tmp_path) -> Path:
    """conf/, the Hydra plugins and the committed params.yaml: what `parity compose` reads."""
    for name in ("conf", "hydra_plugins"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "conf/models/foo.yaml").write_text(MISKEYED)
    (tmp_path / "conf/models/my-model.yaml").write_text(BAD_NAME)
    (tmp_path / "conf/suites/notol.yaml").write_text(NO_TOLERANCES_SUITE)
    (tmp_path / "conf/models/broken.yaml").write_text(BROKEN_YAML)
    return tmp_path


def one_line_error(p) -> str:
    lines = p.stderr.strip().splitlines()
    assert p.returncode != 0, p.stdout + p.stderr
    assert len(lines) == 1, p.stderr
    assert "Traceback" not in p.stderr
    return lines[0]


@pytest.mark.parametrize("overrides, expected", [
    (["providers.ort_cpu.options.graph_optimization_level=bogus"],
     ["providers.ort_cpu.options.graph_optimization_level", "bogus", "disabled, basic, extended, all"]),
    (["+providers.ort_cpu.options.intra_threads=2"], ["providers.ort_cpu.options", "unknown option 'intra_threads'"]),
    (["providers=[ort_int8]", "dtypes=[int8_dynamic]", "providers.ort_int8.options.reduce_range=sometimes"],
     ["providers.ort_int8.options.reduce_range", "sometimes", "auto, true or false"]),
    (["providers=[torch_compile]", "providers.torch_compile.options.mode=fastest"],
     ["providers.torch_compile.options.mode", "fastest", "reduce-overhead"]),
    (["suites=[notol]"], ["suites.notol", "missing key 'tolerances'", "conf/suites/notol.yaml"]),
    (["models=[]"], ["models", "no option selected", "Available options in 'models': ", "resnet18"]),
    (["providers=[]"], ["providers", "no option selected", "ort_cpu"]),
    (["dtypes=[]"], ["dtypes", "no option selected", "bf16"]),
    (["strict=maybe"], ["strict", "true or false", "maybe"]),
    (["models=[foo]"], ["conf/models/foo.yaml", "keyed by its own name 'foo'", "found 'bar'"]),
    (["models=[my-model]"], ["models.my-model", "[A-Za-z0-9_]"]),
    (["models=[broken]"], ["conf/models/broken.yaml:3:7: YAML syntax error", "line 2, column 9"]),
])
def test_parity_compose_refuses_in_one_line_and_writes_nothing(project, overrides, expected):
    before = (project / "params.yaml").read_bytes()
    p = run(["parity", "compose", *(a for o in overrides for a in ("-S", o))], project, check=False)
    line = one_line_error(p)
    assert line.startswith("parity: config error: "), line
    for s in expected:
        assert s in line, (s, line)
    assert (project / "params.yaml").read_bytes() == before
    assert not (project / "artifacts").exists()


def test_yaml_error_in_the_main_config_is_one_line(project):
    cfg = project / "conf/config.yaml"
    cfg.write_text(cfg.read_text().replace("seed: 0", "seed: [0"))
    line = one_line_error(run(["parity", "compose"], project, check=False))
    assert "conf/config.yaml:" in line and "YAML syntax error" in line, line


@pytest.fixture(scope="module")
def dvc_repo(tmp_path_factory):
    return make_repo(tmp_path_factory.mktemp("badcfg") / "repo", dtypes=("fp32",), providers=("ort_cpu",))


@pytest.mark.parametrize("setup, overrides, expected", [
    (lambda r: (r.path / "conf/models/tiny_mlp.yaml").write_text(BROKEN_YAML.replace("broken", "tiny_mlp")), [],
     "parity: config error: conf/models/tiny_mlp.yaml:3:7: YAML syntax error"),
    (None, ["providers.ort_cpu.options.graph_optimization_level=bogus"],
     "parity: config error: providers.ort_cpu.options.graph_optimization_level: bad value 'bogus'"),
    (None, ["models=[]"], "parity: config error: models: no option selected"),
])
def test_dvc_exp_run_refuses_in_one_readable_line(dvc_repo, setup, overrides, expected):
    r = dvc_repo
    r.run(["git", "checkout", "-q", "--", "."])
    before = (r.path / "params.yaml").read_bytes()
    if setup:
        setup(r)
    try:
        p = r.run(["dvc", "exp", "run", *(a for o in overrides for a in ("-S", o))], check=False)
        params_after = (r.path / "params.yaml").read_bytes()
    finally:
        r.run(["git", "checkout", "-q", "--", "."])
    assert p.returncode != 0
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("ERROR")]
    assert len(errors) == 1 and expected in errors[0], p.stderr
    # the error line is the whole message: nothing of it spills onto further lines
    after = p.stderr[p.stderr.index(errors[0]) + len(errors[0]):].strip()
    assert not after or after.startswith("Having any troubles?"), p.stderr
    assert "Running stage" not in p.stdout
    assert params_after == before
    assert not (r.path / "artifacts").exists()
