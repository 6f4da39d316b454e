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
    # a package's __init__ runs when a submodule is imported: `from parity.backends.runner import X`
    # in parity.backends.runner's importers is an edge to parity.backends.runner only (the package's
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


# the verdicts a judgement makes: a model cell's (PASS, FAIL, NOT_EXERCISED, BASELINE) and a suite case's
# (MISMATCH, NAN_IN_OUTPUT, NAN_IN_REFERENCE); OK, the statuses of a run and NOT_RUN/MISSING are not
JUDGED = {"PASS", "FAIL", "NOT_EXERCISED", "BASELINE", "MISMATCH", "NAN_IN_OUTPUT", "NAN_IN_REFERENCE"}
# the one verdict function's module and the vocabulary's
VERDICT_HOME = {"parity/core/verdict.py", "parity/core/status.py"}
# files that still make a verdict of their own, each to be routed through parity.core.verdict.decide
# (owner and issue named); the test fails when one no longer does (take it off) or a new one appears
VERDICT_PENDING: dict[str, str] = {}


def _verdict_mentions(tree: ast.Module) -> list[ast.AST]:
    """The places a module names a judged verdict (a string literal equal to one of JUDGED, or a member
    `Status.X` / `S.X` / `status.Status.X`) other than where it reads or shows a decided one: an operand
    of a comparison (==, !=, in, not in; also an element of a tuple/list/set compared with), a key of a
    dict display, anything in a module-level assignment (a constant: colours, orders, the words a table
    shows) and anything inside an f-string (text shown to a reader). What is left makes a verdict: a
    value returned, assigned, passed to a call, stored under a key, a conditional's branch."""
    def named(n):
        if isinstance(n, ast.Constant):
            return isinstance(n.value, str) and n.value in JUDGED
        owner = n.value if isinstance(n, ast.Attribute) else None
        return n.attr in JUDGED and ((isinstance(owner, ast.Name) and owner.id in ("Status", "S")) or
                                     (isinstance(owner, ast.Attribute) and owner.attr in ("Status", "S")))

    reading = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for x in (node.left, *node.comparators):
                reading.add(id(x))
                reading |= {id(e) for e in getattr(x, "elts", ())}
        elif isinstance(node, ast.Dict):
            reading |= {id(k) for k in node.keys if k is not None}
        elif isinstance(node, ast.JoinedStr):
            reading |= {id(n) for n in ast.walk(node)}
    for stmt in tree.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            reading |= {id(n) for n in ast.walk(stmt)}
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Constant, ast.Attribute)) and named(n)
            and id(n) not in reading]


def test_one_function_decides_a_cells_verdict():
    """Issue 37 item 1: one function, parity.core.verdict.decide, makes every verdict: a model cell's
    (PASS, FAIL, NOT_EXERCISED, BASELINE) and a suite case's (MISMATCH, NAN_IN_OUTPUT, NAN_IN_REFERENCE),
    a `Status` member with its evidence. The rule, over every module of parity and stages: outside
    parity/core/verdict.py (and parity/core/status.py, the vocabulary) a judged verdict is named only
    where a decided one is read or shown (_verdict_mentions: compared with, a dict key, a module-level
    constant, inside an f-string); a verdict returned, assigned, passed to a call or chosen by a
    conditional (`"PASS" if ok else "FAIL"`, `problems.append(("MISMATCH", ...))`) is a second decider
    and fails this test. The diff stage's metrics.json and a suite case's result take it from decide."""
    makers = {}
    for path in sorted([*(ROOT / "parity").rglob("*.py"), *(ROOT / "stages").rglob("*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if rel in VERDICT_HOME or "__pycache__" in path.parts:
            continue
        found = _verdict_mentions(ast.parse(path.read_text()))
        if found:
            makers[rel] = [f"line {n.lineno}: {ast.unparse(n)}" for n in found]
    assert set(makers) == set(VERDICT_PENDING), (
        "a verdict made outside parity.core.verdict.decide (route it through decide, or read the decided "
        f"one with a comparison): {makers}; pending (take off those that no longer make one): {VERDICT_PENDING}")
    from parity.core.status import Status
    from parity.core.verdict import decide
    ok = {"status": "OK"}
    cases = [(ok, {"passed": False, "drift_origin": "fc1"}, Status.FAIL),
             (ok, {"passed": True, "baseline": "judged against itself"}, Status.BASELINE),
             (ok, {"passed": True, "precision": {"exercised": False, "evidence": "ran fp32 kernels"}}, Status.NOT_EXERCISED),
             (ok, {"passed": True}, Status.PASS),
             ({"status": "INFER_FAIL", "reason": "session refused"}, None, Status.INFER_FAIL),
             # a suite case: the worst problem, NaN in the reference before NaN in the output before a mismatch
             (ok, {"case": True, "problems": [("mismatch", "out:0: 3/8 outside"), ("nan_output", "out:1: 1 NaN")]},
              Status.NAN_IN_OUTPUT),
             (ok, {"case": True, "problems": [("mismatch", "grad:x: excess 9 > k 4")]}, Status.MISMATCH),
             ({"status": "CRASH", "reason": "worker died"}, {"case": True, "problems": []}, Status.CRASH)]
    for capture, summary, want in cases:
        v = decide(capture, summary)
        assert v.status is want and isinstance(v.reason, str) and v.reason, (capture, summary, v)
    assert decide(*cases[0][:2]).reason == "drift origin fc1"
    assert decide(ok, {"case": True, "problems": []}) == (Status.OK, "")
    assert decide(ok, {"case": True, "problems": [("mismatch", f"t{i}") for i in range(5)]}).reason == \
        "t0; t1; t2 (+2 more)"
    uses = {p.relative_to(ROOT).as_posix() for p in (ROOT / "parity").rglob("*.py") if "import decide" in p.read_text()}
    assert {"parity/pipeline/cellfiles.py", "parity/suites/diff.py"} <= uses  # metrics.json's, a suite case's
    # models and suites are judged by the same Rule (parity.core.tolerance.Rule, from the typed config):
    # a suite cell's says what a model cell's at that dtype says, bar the per-layer tolerances
    import dataclasses

    import yaml

    from parity.config import schema
    p = yaml.safe_load((ROOT / "params.yaml").read_text())
    model = next(iter(p["models"]))
    for dtype in p["dtypes"]:
        m, s = schema.rule(p, model, dtype, []), schema.suite_rule(p, "any", dtype)
        assert type(s) is type(m) and dataclasses.replace(m, sample_sets=()) == s, (dtype, m, s)
