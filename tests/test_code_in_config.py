"""Code named in config is declared and narrowed: suite targets resolve only in torch namespaces
(and parity.suites.testops) unless `import:` declares the module; a provider's runner must be a
parity backend unless the provider declares `import:`; checking (compose, `parity suite validate`)
never imports the named module, and the run imports only what was declared."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import BIN, ROOT, composed, config_error, env
from parity.config import params as config, imports
from parity.suites import spec

EVIL = """\
evil:
  tolerances: []
  spec:
    presets: {x: {shape: [4]}}
    cases:
      - {id: relu, op: aten::relu, inputs: [x]}
      - {id: sys, op: "os:system", args: ["touch pwned"]}
"""

# A user module that announces every import: checking must never trigger it.
SIDEFX = """\
import pathlib
pathlib.Path(__file__).with_name("IMPORTED").write_text("imported")
print("sidefx imported")


def double(x):
    return x * 2


class MyRunner:
    pass
"""

DECLARED = """\
mine:
  tolerances: []
  spec:
    presets: {x: {shape: [4]}}
    cases:
      - {id: dbl, op: "sidefx:double", import: sidefx, inputs: [x]}
      - {id: dbl_dotted, op: sidefx.double, import: [sidefx], inputs: [x]}
      - {id: gelu, op: torch.nn.functional.gelu, inputs: [x]}
"""


@pytest.fixture
def proj(tmp_path) -> Path:
    """conf/ + hydra_plugins/ (what `parity compose` reads) plus the user module sidefx.py."""
    for d in ("conf", "hydra_plugins"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "conf/suites/evil.yaml").write_text(EVIL)
    (tmp_path / "conf/suites/mine.yaml").write_text(DECLARED)
    (tmp_path / "sidefx.py").write_text(SIDEFX)
    return tmp_path


def parity(proj: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([f"{BIN}/parity", *args], cwd=proj, env=env(), capture_output=True, text=True)


def test_undeclared_op_is_refused_at_compose_in_one_line(proj):
    p = parity(proj, "compose", "-S", "suites=[evil]")
    assert p.returncode == 2, p.stdout + p.stderr
    err = p.stderr.strip()
    assert len(err.splitlines()) == 1, err
    for part in ("suites.evil", "conf/suites/evil.yaml", "case 'sys'", "key 'op'", "op 'os:system'", "import: os"):
        assert part in err, (part, err)
    assert not (proj / "params.yaml").exists() and not (proj / "pwned").exists()


def test_undeclared_op_is_refused_by_suite_list_and_validate(proj):
    for cmd in ("list", "validate"):
        p = parity(proj, "suite", cmd, "conf/suites/evil.yaml")
        assert p.returncode == 2 and "case 'sys': key 'op': op 'os:system' is not in the torch namespaces" in p.stderr
    assert not (proj / "pwned").exists()


def test_declared_module_is_checked_without_importing_it(proj):
    """Compose (the Hydra plugin's validation) and `parity suite validate` accept the declared
    module, find its function by reading the file, and never run it."""
    p = parity(proj, "compose", "-S", "suites=[mine]")
    assert p.returncode == 0, p.stderr
    cases = yaml.safe_load((proj / "params.yaml").read_text())["suites"]["mine"]["spec"]["cases"]
    assert [c["id"] for c in cases] == ["dbl", "dbl_dotted", "gelu"]
    p = parity(proj, "suite", "validate", "mine")
    assert p.returncode == 0 and "mine: OK, 3 cases" in p.stdout, p.stdout + p.stderr
    assert "sidefx imported" not in p.stdout + p.stderr
    assert not (proj / "IMPORTED").exists()


def test_compose_time_suite_check_imports_neither_torch_nor_user_code(proj):
    code = ("import sys, yaml; from parity.config import params as config; from parity.suites import spec\n"
            "sec, _ = spec.load_section('mine')\n"
            "p = yaml.safe_load(open(sys.argv[1]))\n"
            "p['suites'] = {'mine': sec}\n"
            "config.validate(p)\n"
            "spec.check_selected(p)\n"
            "print(sorted(m for m in ('torch', 'sidefx') if m in sys.modules))\n")
    p = subprocess.run([sys.executable, "-c", code, str(ROOT / "params.yaml")], cwd=proj, env=env(),
                       capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr
    assert not (proj / "IMPORTED").exists()


@pytest.mark.parametrize("case, expected", [
    ({"op": "os.system"}, "op 'os.system' is not in the torch namespaces"),
    ({"op": "parity.commands.sweep:sweep"}, "would import and run 'parity.commands.sweep'; declare it"),
    ({"op": "torch.load"}, "op 'torch.load' reads/writes files or loads code"),
    ({"op": "torch.nn.Linear"}, "torch.nn.<Module> classes are for module cases"),
    ({"module": "collections:OrderedDict"}, "module 'collections:OrderedDict' is not in the torch namespaces"),
    ({"gradcheck": "json:loads"}, "gradcheck 'json:loads' is not in the torch namespaces"),
    ({"pair": {"a": {"op": "aten::gelu"}, "b": {"op": "os:getcwd"}}}, "key 'pair.b.op': op 'os:getcwd'"),
    ({"op": "sidefx:double", "import": "other"}, "its module 'sidefx' is not under the declared import other"),
    ({"op": "nosuchmod:f", "import": "nosuchmod"}, "module 'nosuchmod' not found"),
    ({"op": "sidefx:triple", "import": "sidefx"}, "defines no 'triple'"),
    ({"op": "parity.suites.testops:nope"}, "defines no 'nope'"),
    ({"op": "aten::relu", "import": 3}, "key 'import': import: expected a module name"),
])
def test_each_undeclared_or_missing_target_is_one_named_error(proj, monkeypatch, case, expected):
    monkeypatch.chdir(proj)
    sec = {"spec": {"presets": {"x": {"shape": [4]}}, "cases": [{"id": "c", "inputs": ["x"], **case}]}}
    with pytest.raises(spec.SuiteError) as e:
        spec.expand("t", sec, root=proj / "conf/suites")
    assert expected in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not (proj / "IMPORTED").exists()


def test_suite_wide_import_and_shipped_namespaces(proj, monkeypatch):
    monkeypatch.chdir(proj)
    sec = {"spec": {"import": "sidefx", "presets": {"x": {"shape": [4]}},
                    "cases": [{"id": "a", "op": "sidefx:double", "inputs": ["x"]},
                              {"id": "b", "op": "torch.special.expit", "inputs": ["x"]},
                              {"id": "c", "module": "torch.nn.GELU", "inputs": ["x"]},
                              {"id": "d", "op": "parity.suites.testops:sleep", "inputs": ["x"]}]}}
    cases = spec.expand("t", sec, root=proj / "conf/suites")
    assert [c.get("imports") for c in cases] == [["sidefx"]] * 4
    assert not (proj / "IMPORTED").exists()
    # the shipped suites need no declaration (their cases carry no `imports`)
    for name in ("critical", "top50", "modules", "selftest"):
        assert not any("imports" in c for c in spec.expand(name, root=ROOT / "conf/suites"))


def test_run_imports_only_what_was_declared(proj, monkeypatch):
    """The worker's resolver checks the declaration again: an undeclared module is never imported,
    a declared one is imported and called."""
    pytest.importorskip("torch")
    from parity.suites import execute

    monkeypatch.syspath_prepend(str(proj))
    monkeypatch.chdir(proj)
    with pytest.raises(imports.NotAllowed, match="import: sidefx"):
        execute.resolve("sidefx:double")
    assert "sidefx" not in sys.modules and not (proj / "IMPORTED").exists()
    fn = execute.resolve("sidefx:double", ["sidefx"])
    assert fn(21) == 42 and (proj / "IMPORTED").exists()
    assert execute.resolve("torch.nn.functional.gelu") is sys.modules["torch"].nn.functional.gelu
    sys.modules.pop("sidefx", None)


def test_shipped_suites_validate(proj):
    p = parity(proj, "suite", "validate", "critical", "top50", "modules", "selftest")
    assert p.returncode == 0, p.stderr
    assert p.stdout.count(": OK,") == 4


# ------------------------------------------------------------------------------------------ runners
def test_runner_outside_the_registry_is_refused_listing_valid_runners():
    p = composed()
    msg = config_error(p, lambda q: q["providers"]["torch_cpu"].update(runner="os:system"))
    assert msg.startswith("providers.torch_cpu.runner: 'os:system' is not a parity backend")
    assert "parity.backends.torch_cpu:TorchCpuRunner" in msg and "parity.backends.ort_cpu:OrtCpuRunner" in msg
    assert "import: os" in msg and "\n" not in msg
    msg = config_error(p, lambda q: q["providers"]["torch_cpu"].update(runner="parity.backends.torch_cpu:Nope"))
    assert "defines no 'Nope'" in msg and "Valid runners: parity.backends." in msg
    msg = config_error(p, lambda q: q["providers"]["torch_cpu"].update(runner="parity.backends.nope:X"))
    assert "module 'parity.backends.nope' not found" in msg


def test_declared_runner_is_located_not_imported(proj, monkeypatch):
    monkeypatch.chdir(proj)
    p = composed()
    p["providers"]["torch_cpu"].update(runner="sidefx:MyRunner", **{"import": "sidefx"})
    config.validate(p)
    assert "sidefx" not in sys.modules and not (proj / "IMPORTED").exists()
    msg = config_error(p, lambda q: q["providers"]["torch_cpu"].update(runner="sidefx:Other"))
    assert "defines no 'Other'" in msg
    from parity.backends import load_runner

    with pytest.raises(ValueError, match="declares no `import:`"):
        load_runner("sidefx:MyRunner")  # the stage's loader refuses an undeclared module too
    assert not (proj / "IMPORTED").exists()


def test_declared_op_runs_in_the_suite_worker(proj, monkeypatch):
    """End to end through the real worker pool: the declared module is imported in the worker (its
    side effect appears only now) and its op runs like any other case."""
    pytest.importorskip("torch")
    from parity.pipeline.suite_run import run_cell

    monkeypatch.chdir(proj)
    p = yaml.safe_load((ROOT / "params.yaml").read_text())
    p["suites"] = {"mine": spec.load_section("mine", proj / "conf/suites")[0]}
    config.validate(p)
    assert not (proj / "IMPORTED").exists()
    rows, *_ = run_cell(p, "mine", "fp32", "torch_cpu", workers=1)
    assert {r["id"]: r["status"] for r in rows} == {"dbl": "OK", "dbl_dotted": "OK", "gelu": "OK"}, rows
    assert (proj / "IMPORTED").exists()
