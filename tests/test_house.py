"""The shape of the house (the layers README's Layout names) holds, and extending it is one file each.

- rules: no module of `parity` imports `stages`; no stage imports another; no import cycle in
  `parity`; every module in a layer folder of ARCHITECTURE.md and no import upward (module or
  folder level); no stage module over 65 lines; no function over 60 lines without a `# long:`
  reason; light stages import neither torch nor onnx at start (every stage's deps == its import
  closure: tests/test_deps.py);
- suites run through the runner registry: an ort_cpu and an ort_cpu_noopt suite cell run with their
  providers' session options;
- a provider (a subclass of an existing runner with other options) and a model, one new file each
  plus their conf, run through the model pipeline and a suite.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, composed, env, make_repo

STAGE_MAX_LINES = 65
FUNCTION_MAX_LINES = 60
# ARCHITECTURE.md's layers, bottom up: a module imports from its own layer and those below, never above
# (folders of parity by name; "" is the package's own __init__; stages and hydra_plugins are entries)
LAYERS = {"": 1, "core": 1, "config": 2, "models": 3, "backends": 3, "pipeline": 4, "analysis": 4, "suites": 4,
          "commands": 5, "stages": 5, "hydra_plugins": 5}
# within layer 4, bottom up: a suite is run by analysis (fuzzing) and the pipeline; analysis by the
# pipeline. The helpers they share (the oracle, the ONNX-file source and graph helpers, the report's
# SVG, a suite cell's settings) live below them, in core, models or suites.
LAYER4 = {"suites": 0, "analysis": 1, "pipeline": 2}
LIGHT_STAGES = ("stages.env", "stages.inputs", "stages.diff", "stages.report", "stages.suite_diff",
                "stages.suite_coverage", "stages.suite_run")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Project modules `path` imports anywhere (module level or inside functions), as dotted names."""
    found = set()
    pkg = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m.split(".")[0] in ("parity", "stages")}


def _project_modules(top: str) -> dict[str, Path]:
    return {_module_name(f): f for f in sorted((ROOT / top).rglob("*.py")) if "__pycache__" not in f.parts}


def test_no_parity_module_imports_stages_and_no_stage_imports_another():
    bad = [f"{m} imports {i}" for m, f in _project_modules("parity").items() for i in _imports(f)
           if i.split(".")[0] == "stages"]
    assert not bad, bad
    stages = _project_modules("stages")
    bad = [f"{m} imports {i}" for m, f in stages.items() for i in _imports(f)
           if i.startswith("stages.") and i != m]
    assert not bad, bad


def test_no_import_cycle_in_parity():
    mods = _project_modules("parity")
    graph = {m: {i for i in _imports(f) if i in mods and i != m} for m, f in mods.items()}
    # a package's __init__ runs when a submodule is imported: `from parity.backends.base import X`
    # in parity.backends.base's importers is an edge to parity.backends.base only (the package's
    # __init__ importing its own submodules is not a cycle of the code's layers)
    state: dict[str, int] = {}
    cycles = []

    def visit(m, path):
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append(" -> ".join(path[path.index(n):] + [n]))
            elif n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles in parity:\n" + "\n".join(cycles)


def _folder(module: str) -> str:
    """The layer folder a module lives in: parity's subfolder, or the top folder outside parity."""
    parts = module.split(".")
    return (parts[1] if len(parts) > 1 else "") if parts[0] == "parity" else parts[0]


def _upward_edges() -> list[tuple[str, str]]:
    mods = {**_project_modules("parity"), **_project_modules("stages"), **_project_modules("hydra_plugins")}
    return sorted((m, i) for m, f in mods.items() for i in _imports(f)
                  if i in mods and LAYERS[_folder(i)] > LAYERS[_folder(m)])


def test_every_module_lives_in_a_layer_folder():
    loose = sorted(f.name for f in (ROOT / "parity").glob("*.py") if f.name != "__init__.py")
    folders = sorted(f"parity/{d.name}" for d in (ROOT / "parity").iterdir()
                     if (d / "__init__.py").exists() and d.name not in LAYERS)
    assert not loose and not folders, f"outside the layer folders of ARCHITECTURE.md: {loose + folders}"


def test_no_upward_import_at_module_or_folder_level():
    """core < config < models, backends < pipeline, analysis, suites < commands, stages (plugins)."""
    up = _upward_edges()
    assert not up, "upward imports (module level):\n" + "\n".join(f"{m} -> {i}" for m, i in up)
    folders = sorted({(_folder(m), _folder(i)) for m, i in up})
    assert not folders, f"upward imports (folder level): {folders}"


def test_no_upward_import_at_folder_level_within_layer_4():
    """suites < analysis < pipeline: none of layer 4's folders imports one above it (issue 37: analysis
    imported the pipeline from 5 files, suites imported analysis and the pipeline)."""
    mods = {**_project_modules("parity")}
    up = sorted((m, i) for m, f in mods.items() for i in _imports(f)
                if i in mods and _folder(m) in LAYER4 and _folder(i) in LAYER4
                and LAYER4[_folder(i)] > LAYER4[_folder(m)])
    assert not up, ("upward imports within layer 4 (suites < analysis < pipeline; move what they share "
                    "below them):\n" + "\n".join(f"{m} -> {i}" for m, i in up))


def _long_functions(path: Path) -> list[str]:
    """Functions over FUNCTION_MAX_LINES lines with no `# long: <reason>` on the def line or the line
    after the signature (the first body line)."""
    lines = path.read_text().splitlines()
    out = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            first = node.body[0].lineno
            near = lines[node.lineno - 1: first]
            if n > FUNCTION_MAX_LINES and not any("# long:" in t for t in near):
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_no_function_over_a_screen_without_a_reason():
    files = [f for top in ("parity", "stages", "hydra_plugins") for f in _project_modules(top).values()]
    long = [x for f in files for x in _long_functions(f)]
    assert not long, (f"functions over {FUNCTION_MAX_LINES} lines (split them, or say why with "
                      "`# long: <reason>` on the def line or the first body line):\n" + "\n".join(long))


def test_builtin_fingerprint_components_are_the_ones_config_accepts():
    from parity.config import params as config
    from parity.backends import fingerprint

    assert sorted(fingerprint.PROBES) == sorted(config.COMPONENTS)


def test_stage_modules_are_thin():
    long = {f.name: n for f in sorted((ROOT / "stages").glob("*.py"))
            if (n := len(f.read_text().splitlines())) > STAGE_MAX_LINES}
    assert not long, f"stage modules over {STAGE_MAX_LINES} lines (move the work to parity/pipeline): {long}"


@pytest.mark.parametrize("module", LIGHT_STAGES)
def test_light_stages_import_no_torch_or_onnx_at_start(module):
    code = (f"import sys, importlib; importlib.import_module({module!r}); "
            "heavy = sorted(m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules); "
            "print(heavy); sys.exit(1 if heavy else 0)")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env(), capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


# ------------------------------------------------------------------- suites through the runners
def test_ort_cpu_vs_ort_cpu_noopt_suite_cells_differ_in_the_session_options_they_ran_with():
    """The same case in the ort_cpu and ort_cpu_noopt cells: each ran in an onnxruntime session with
    its provider's graph_optimization_level (all / disabled), through the provider's runner."""
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort

    from parity.pipeline.suite_run import cell_of
    from parity.suites import execute, spec

    p = composed("providers=[ort_cpu,ort_cpu_noopt]", "dtypes=[fp32]")
    case = next(c for c in spec.expand("critical") if c["label"] == "aten::gelu")
    levels = {}
    for prov in ("ort_cpu", "ort_cpu_noopt"):
        cell = cell_of(p, "fp32", prov)
        runner = execute.runner_for(cell)
        sides, args, kwargs = execute.build(case, cell["seed"])
        out, ms, onnx_ops = runner.run_op(sides["main"], args, kwargs)
        assert out and onnx_ops, prov
        levels[prov] = runner.op_session.get_session_options().graph_optimization_level
        assert execute.run_case(case, cell)["status"] == "OK"
    assert levels == {"ort_cpu": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                      "ort_cpu_noopt": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}


# ------------------------------------------------------------- extending: one file each (+ conf)
PROVIDER_FILE = '''\
"""ONNX Runtime CPU at graph optimisation level `basic` without the memory-pattern planner."""

from parity.backends.ort_cpu import OrtCpuRunner


class OrtCpuBasicRunner(OrtCpuRunner):
    # a fingerprint component of its own: its cells re-run when this package's version changes
    fingerprint_components = {"packaging": ("packaging",)}

    def _session_options(self):
        so = super()._session_options()
        so.enable_mem_pattern = False
        return so
'''
PROVIDER_CONF = """\
ort_cpu_basic:
  runner: parity.backends.ort_cpu_basic:OrtCpuBasicRunner
  dtypes: [fp32, fp16]
  uses: [onnxruntime, onnx, cpu, packaging]
  options:
    graph_optimization_level: basic
"""
MODEL_FILE = '''\
from torch import nn


class TinyConv(nn.Module):
    def __init__(self, c: int = 3):
        super().__init__()
        self.conv, self.act = nn.Conv2d(c, 8, 3, padding=1), nn.ReLU()
        self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(self.pool(self.act(self.conv(x))).flatten(1))
'''
MODEL_CONF = """\
tinyconv:
  arch:
    source: import
    name: tinyconv:TinyConv
    kwargs: {c: 3}
  input:
    - {name: input, shape: [2, 3, 8, 8], dtype: float32, init: normal, mean: 0.0, std: 1.0}
  tolerances: []
"""
SUITE_CONF = """\
mine:
  tolerances: []
  spec:
    presets: {img: {shape: [2, 3, 8, 8]}}
    cases:
      - {id: tinyconv, module: "tinyconv:TinyConv", import: tinyconv, inputs: [img]}
      - {id: gelu, op: aten::gelu, inputs: [img]}
"""


def test_a_provider_and_a_model_are_one_file_each(tmp_path):
    repo = make_repo(tmp_path / "repo", models=("tinyconv",), dtypes=("fp32",),
                     providers=("torch_cpu", "ort_cpu_basic"), compose=False)
    new = {"parity/backends/ort_cpu_basic.py": PROVIDER_FILE, "conf/providers/ort_cpu_basic.yaml": PROVIDER_CONF,
           "tinyconv.py": MODEL_FILE, "conf/models/tinyconv.yaml": MODEL_CONF, "conf/suites/mine.yaml": SUITE_CONF}
    for rel, text in new.items():
        (repo.path / rel).write_text(text)
    status = repo.run(["git", "status", "--porcelain"]).stdout.split("\n")
    assert sorted(line[3:] for line in status if line) == sorted(
        ["parity/backends/ort_cpu_basic.py", "conf/providers/ort_cpu_basic.yaml", "tinyconv.py",
         "conf/models/tinyconv.yaml", "conf/suites/mine.yaml"])  # nothing else edited
    repo.commit("a provider and a model")
    ran = repo.exp_run("suites=[mine]")
    assert {"capture@tinyconv-fp32-ort_cpu_basic", "diff@tinyconv-fp32-ort_cpu_basic",
            "suite_run@mine-fp32-ort_cpu_basic", "suite_coverage@mine"} <= set(ran), ran
    art = repo.path / "artifacts"
    fp = json.loads((art / "env/provider-ort_cpu_basic.json").read_text())
    assert set(fp) == {"onnxruntime", "onnx", "cpu", "packaging"} and fp["packaging"].get("packaging"), fp
    st = json.loads((art / "capture/tinyconv-fp32-ort_cpu_basic/status.json").read_text())
    assert st["status"] == "OK", st
    m = json.loads((art / "diff/tinyconv-fp32-ort_cpu_basic/metrics.json").read_text())
    assert m["verdict"] == "PASS", m
    res = json.loads((art / "suites/run/mine/fp32-ort_cpu_basic/results.json").read_text())
    by_id = {r["id"]: r for r in res["cases"]}
    assert by_id["tinyconv"]["status"] == "OK" and "Conv" in by_id["tinyconv"]["onnx_ops"], by_id
    cov = json.loads((art / "suites/coverage/mine.json").read_text())
    row = next(r for r in cov["rows"] if r["op"] == "tinyconv:TinyConv")
    assert row["cells"]["ort_cpu_basic/fp32"]["status"] == "OK", row


def test_one_table_printer_and_one_progress_helper():
    """Terminal tables are drawn by parity.core.ui (plain_table / table) and progress by ui.Progress
    (issue 26): no hand-padded columns (ljust/rjust) and no other Progress class under parity/.
    The report's Markdown/HTML writers build file formats, not terminal output, and pad nothing."""
    bad = []
    for f in sorted((ROOT / "parity").rglob("*.py")):
        if f.relative_to(ROOT).as_posix() == "parity/core/ui.py":
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if ".ljust(" in line or ".rjust(" in line or (line.lstrip().startswith("class ") and "Progress" in line):
                bad.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not bad, "use parity.core.ui's plain_table / table / Progress:\n" + "\n".join(bad)


# files whose imports the diff-path restructuring (issue 26) moves; drop each from here once it is done
LAZY_REASON_PENDING: set[str] = set()


def _unexplained_lazy_imports(path: Path) -> list[str]:
    """Imports inside a function with no `# lazy: <why>` or `# optional: <why>` comment on the import's
    (last) line or the line above it."""
    lines = path.read_text().splitlines()
    out = []

    def walk(node, in_function):
        for ch in ast.iter_child_nodes(node):
            if in_function and isinstance(ch, (ast.Import, ast.ImportFrom)):
                after = lines[ch.end_lineno - 1].partition("#")[2].strip()
                above = lines[ch.lineno - 2].strip()
                if not (after.startswith(("lazy:", "optional:")) or above.startswith(("# lazy:", "# optional:"))):
                    out.append(f"{path.relative_to(ROOT)}:{ch.lineno}: {lines[ch.lineno - 1].strip()}")
            walk(ch, in_function or isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)))

    walk(ast.parse("\n".join(lines)), False)
    return out


def test_every_import_inside_a_function_says_why():
    """Imports sit at module top (issue 26: an import inside a function hides what a module touches),
    unless a measured start-up cost, an import cycle or an optional dependency says otherwise: then the
    import carries `# lazy: <why, with the figure>` or `# optional: <why>` (benchmarks/import_cost.py,
    BENCHMARKS.md 22)."""
    files = [f for top in ("parity", "stages") for f in _project_modules(top).values()
             if f.relative_to(ROOT).as_posix() not in LAZY_REASON_PENDING]
    bad = [x for f in files for x in _unexplained_lazy_imports(f)]
    assert not bad, ("imports inside functions without a reason (move them to the module's top, or say why "
                     "with `# lazy: ...` / `# optional: ...`):\n" + "\n".join(bad))


def test_conf_and_schema_defaults_agree():
    """A setting conf/config.yaml gives has the same default in the typed config (parity.config.schema
    takes it from there): a params dict made by hand for a test or a command gets what a composed
    params.yaml holds (inputs.samples was 2 in conf and 1 in the schema). Compose-time values (`${...}`)
    are not defaults."""
    import yaml

    from parity.config import schema

    def literal(v):
        return not (isinstance(v, str) and "${" in v)

    conf = yaml.safe_load((ROOT / "conf" / "config.yaml").read_text())
    bare, bad = schema.of({}), []
    for sec, v in conf.items():
        if sec == "defaults" or not literal(v):
            continue
        for key, val in (v.items() if isinstance(v, dict) and v else [(None, v)]):
            if not literal(val):
                continue
            given = schema.of({sec: {key: val} if key else val})
            want, got = ((getattr(getattr(x, sec), key) if key else getattr(x, sec)) for x in (given, bare))
            if got != want:
                bad.append(f"{sec}.{key}" if key else sec)
    assert not bad, f"conf/config.yaml and parity.config.schema give different defaults for: {bad}"


def _verdicts_returned(fn: ast.AST) -> set[str]:
    """The model-cell verdicts (PASS, FAIL, NOT_EXERCISED, BASELINE) a function returns by name: as a
    string literal or a `Status` member, as the returned value itself or a branch of a conditional
    expression, an element of a returned tuple, an argument of a returned call (not a value compared
    with one, nor a dict's entry)."""
    from parity.core import status
    names = set(status.VERDICTS)
    found = set()

    def returned(v: ast.AST) -> None:
        if isinstance(v, ast.Constant) and v.value in names:
            found.add(v.value)
        elif isinstance(v, ast.Attribute) and v.attr in names:
            found.add(v.attr)
        elif isinstance(v, ast.IfExp):
            returned(v.body), returned(v.orelse)
        elif isinstance(v, (ast.Tuple, ast.List)):
            for e in v.elts:
                returned(e)
        elif isinstance(v, ast.Call):
            for e in v.args:
                returned(e)

    for node in ast.walk(fn):
        if isinstance(node, ast.Return) and node.value is not None:
            returned(node.value)
    return found


def test_one_function_decides_a_cells_verdict():
    """Issue 37 item 1: one function (parity.core.verdict.decide) returns a cell's verdict, a `Status`
    member with its evidence; no other function of parity returns PASS, FAIL, NOT_EXERCISED or BASELINE,
    and the diff stage's metrics.json takes its verdict from it."""
    deciders = {}
    for path in sorted((ROOT / "parity").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (v := _verdicts_returned(node)):
                deciders[f"{_module_name(path)}.{node.name}"] = v
    assert deciders == {"parity.core.verdict.decide": {"PASS", "FAIL", "NOT_EXERCISED", "BASELINE"}}, deciders
    from parity.core.status import Status
    from parity.core.verdict import decide
    ok = {"status": "OK"}
    cases = [(ok, {"passed": False, "drift_origin": "fc1"}, Status.FAIL),
             (ok, {"passed": True, "baseline": "judged against itself"}, Status.BASELINE),
             (ok, {"passed": True, "precision": {"exercised": False, "evidence": "ran fp32 kernels"}}, Status.NOT_EXERCISED),
             (ok, {"passed": True}, Status.PASS),
             ({"status": "INFER_FAIL", "reason": "session refused"}, None, Status.INFER_FAIL)]
    for capture, summary, want in cases:
        v = decide(capture, summary)
        assert v.status is want and isinstance(v.reason, str) and v.reason, (capture, summary, v)
    assert decide(*cases[0][:2]).reason == "drift origin fc1"
    uses = [p for p in (ROOT / "parity").rglob("*.py") if "import decide" in p.read_text()]
    assert ROOT / "parity" / "pipeline" / "cellfiles.py" in uses  # metrics.json's verdict
