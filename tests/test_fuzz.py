"""Fuzzing (parity fuzz): seeded cases that replay from their id, a user's op checked against the
user's float64 reference, a shape-dependent bug found, replayed bit for bit and minimised to its
exact threshold, written as a suite file that `parity suite validate` accepts. Real worker
processes, real torch and onnxruntime; nothing mocked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from parity.commands import fuzz_cli
from parity.analysis import fuzz
from parity.commands import suite_cli
from parity.suites import pool, spec

# A user's kernel that is wrong for last dim > 64 (forward and so backward), a correct one, one
# that kills its process, and their references: torch (autograd gradients) and numpy (finite
# differences).
KERNELS = '''
import os
import torch

def silu(x):
    y = x * torch.sigmoid(x)
    if x.shape[-1] > 64:
        y = y * 1.01  # the bug: a wrong scale on the wide-row code path
    return y

def silu_ok(x):
    return x * torch.sigmoid(x)

def silu_abort(x):
    os.abort()
'''
REFS = '''
import numpy as np
import torch

def silu(x):
    return x * torch.sigmoid(x)

def silu_np(x):
    x = np.asarray(x)
    return x / (1.0 + np.exp(-x))
'''
SUITE = '''
myops:
  tolerances: []
  spec:
    grad: true
    dims: {M: 4, K: 16}
    presets:
      x: {shape: [M, K]}
    cases:
      - {id: silu, op: "import:myops.kern:silu", reference: "import:myops.ref:silu", inputs: [x]}
      - {id: silu_np, op: "import:myops.kern:silu_ok", reference: "import:myops.ref:silu_np", inputs: [x]}
      - {id: silu_abort, op: "import:myops.kern:silu_abort", reference: "import:myops.ref:silu", inputs: [x]}
'''


@pytest.fixture
def user_ops(tmp_path, monkeypatch) -> Path:
    """A working directory holding the user's package and a suite naming it (workers import from
    the working directory, as in a repository)."""
    (tmp_path / "myops").mkdir()
    (tmp_path / "myops" / "__init__.py").write_text("")
    (tmp_path / "myops" / "kern.py").write_text(KERNELS)
    (tmp_path / "myops" / "ref.py").write_text(REFS)
    (tmp_path / "myops.yaml").write_text(SUITE)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _fuzz(capsys, *args) -> tuple[int, str]:
    rc = fuzz_cli.main(["myops.yaml", "--dtype", "fp32", "--provider", "torch_cpu", *args])
    return rc, capsys.readouterr().out


def test_fuzz_case_is_a_function_of_its_id():
    """The same seed gives the same case; the id names it; a different seed a different one; every
    drawn case is a valid suite case."""
    (t,) = [t for t in fuzz.templates("critical") if t["base"] == "matmul"]
    seeds = [fuzz.case_seed(0, k) for k in range(40)]
    assert len(set(seeds)) == 40 and seeds == [fuzz.case_seed(0, k) for k in range(40)]
    a, b = fuzz.mutate(t, seeds[3], "float16"), fuzz.mutate(t, seeds[3], "float16")
    assert a == b and a["case"]["id"] == f"matmul~s{seeds[3]}"
    assert fuzz.parse_id(a["case"]["id"]) == ("matmul", seeds[3])
    drawn = [fuzz.mutate(t, s, "float16") for s in seeds]
    assert len({json.dumps(m["spec"], sort_keys=True) for m in drawn}) > 30
    for m in drawn:
        c = fuzz.expand(m)
        x, w = (a["tensor"] for a in c["call_args"])
        assert x["shape"][1] == w["shape"][0]  # dims stay consistent across tensors
        assert max(x["shape"][0] * x["shape"][1], w["shape"][0] * w["shape"][1]) <= fuzz.DEFAULTS["max_numel"]
    kinds = {m["fuzz"]["values"] for m in drawn} | {m["fuzz"]["layout"] for m in drawn}
    assert {"large", "tiny", "mixed", "transposed"} <= kinds


def test_user_op_bug_found_replayed_and_minimised_to_the_threshold(user_ops, capsys):
    rc, out = _fuzz(capsys, "--op", "silu", "--cases", "30", "--seed", "1", "--out", "camp")
    assert rc == 0, out
    camp = json.loads((user_ops / "camp" / "campaign.json").read_text())
    fails = [r for r in camp["rows"] if r["status"] == "MISMATCH"]
    assert fails and all(r["dims"]["K"] > 64 for r in fails)
    # below the threshold everything passes, but for one honest finding: at values near fp32's max
    # the op's x * sigmoid(x) has a NaN gradient (inf * 0) where the float64 reference has none
    small = [r for r in camp["rows"] if r["dims"]["K"] <= 64]
    assert small and all(r["status"] == "OK" for r in small if r["values"] != "large")
    assert {r["status"] for r in small} <= {"OK", "NAN_IN_OUTPUT"}
    first = fails[0]
    assert f"{first['id']:<32} seed {first['seed']}" in out

    rc, out = _fuzz(capsys, "--reproduce", str(first["seed"]), "--campaign", "camp")
    runs = [ln for ln in out.splitlines() if ln.startswith("run ")]
    assert rc == 0 and len(runs) == 2 and "bit-identical: yes" in out
    assert runs[0].split()[2:] == runs[1].split()[2:] and "MISMATCH" in runs[0]

    rc, out = _fuzz(capsys, "--minimise", first["id"], "--campaign", "camp", "--yaml", "regress.yaml")
    assert rc == 0, out
    doc = yaml.safe_load((user_ops / "regress.yaml").read_text())
    assert doc["regress"]["spec"]["dims"] == {"M": 1, "K": 65}
    assert doc["regress"]["spec"]["cases"][0]["id"] == first["id"]
    cases = suite_cli.validate("regress.yaml")
    assert [c["id"] for c in cases] == [first["id"]]
    # the written case still fails, and at K=64 it passes
    m = fuzz.templates("regress", doc["regress"])[0]
    m["fuzz"] = {"base": "silu", "seed": first["seed"], "values": "", "layout": ""}
    from parity.analysis import fuzz_campaign as fc

    p = fuzz_cli.params_for("fp32", "torch_cpu")
    assert fc.reproduce(p, "myops", spec.load_section("myops", user_ops)[0], "fp32", "torch_cpu", m, 1)[0][0] == "MISMATCH"
    m["spec"]["dims"]["K"] = 64
    assert fc.reproduce(p, "myops", spec.load_section("myops", user_ops)[0], "fp32", "torch_cpu", m, 1)[0][0] == "OK"


def test_user_op_reference_forward_backward_and_crash(user_ops):
    """numpy reference: gradients by finite differences agree with the op's autograd; a user op that
    kills its worker is CRASH, and the next case still runs."""
    from parity.analysis import fuzz_campaign as fc

    p = fuzz_cli.params_for("fp32", "torch_cpu")
    section = spec.load_section("myops", user_ops)[0]
    p = dict(p, suites={"myops": section})
    cases = {c["id"]: c for c in spec.expand("myops", section)}
    assert cases["silu"]["imports"] == ["myops.kern", "myops.ref"] and cases["silu"]["reference"] == "myops.ref:silu"
    order = [cases["silu_abort"], cases["silu_np"]]
    with pool.Pool(1) as pl:
        res = pl.run(order, fc.cell_for(p, "fp32", "torch_cpu"), 60)
    assert res[0]["status"] == "CRASH" and "SIGABRT" in res[0]["reason"]
    names = [n for n, _ in res[1]["outputs"]]
    assert names == ["out:0", "grad:in.0"] == [n for n, _ in res[1]["reference"]]
    d = fc.judge(p, "myops", "fp32", order[1], res[1])
    assert d["status"] == "OK" and d["grad_tol_ratio"] is not None and d["grad_tol_ratio"] < 1


def test_import_prefix_is_a_declaration(tmp_path):
    """`op: import:pkg.mod:fn` declares pkg.mod; without the prefix or an import: the op is refused."""
    (tmp_path / "s.yaml").write_text(SUITE.replace("myops:", "s:", 1))
    (tmp_path / "myops").mkdir()
    (tmp_path / "myops" / "__init__.py").write_text("")
    (tmp_path / "myops" / "kern.py").write_text(KERNELS)
    (tmp_path / "myops" / "ref.py").write_text(REFS)
    import os

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert len(suite_cli.list_cases("s.yaml")) == 3
        (tmp_path / "t.yaml").write_text(SUITE.replace("myops:", "t:", 1).replace('"import:myops.kern:silu"',
                                                                                  '"myops.kern:silu"'))
        with pytest.raises(spec.SuiteError, match="myops.kern.* is not under the declared import myops.ref"):
            suite_cli.list_cases("t.yaml")
    finally:
        os.chdir(cwd)


def test_fuzz_and_train_step_stages(tmp_path):
    """The stages are cached by their params (seed, cases): a second repro runs nothing, a forced
    re-run writes the same bytes, and the report's sections list the campaign with its seeds and the
    per-parameter gradients. A fuzz dtype that is not selected fails at compose, naming the key."""
    from conftest import BIN, make_repo

    from parity.analysis import fuzz_report

    repo = make_repo(tmp_path / "repo", providers=("torch_cpu",))
    sets = ["fuzz.suites=[critical]", "fuzz.cases=24", "fuzz.providers=[torch_cpu]", "fuzz.ops=[relu,exp,sum]",
            "train_step.models=[tiny_mlp]", "train_step.dtypes=[bfloat16]"]
    repo.run([f"{BIN}/parity", "compose", *[a for s in sets for a in ("-S", s)]])
    stages = ["fuzz@critical-fp16-torch_cpu", "train_step@tiny_mlp-bfloat16"]
    ran = repo.repro(*stages)
    assert set(stages) <= set(ran)
    camp = repo.path / "artifacts/fuzz/critical/fp16-torch_cpu"
    c = json.loads((camp / "campaign.json").read_text())
    assert c["cases"] == 24 and {r["base"] for r in c["rows"]} == {"relu", "exp", "sum"}
    assert c["settings"]["seed"] == 0 and all(r["id"].endswith(f"~s{r['seed']}") for r in c["rows"])
    before = {f.name: f.read_bytes() for f in camp.iterdir()}
    assert not set(stages) & set(repo.repro(*stages))
    repo.run(["dvc", "repro", "-f", "-s", stages[0]])
    assert {f.name: f.read_bytes() for f in camp.iterdir()} == before
    import pyarrow.parquet as pq

    fails = pq.read_table(camp / "failures.parquet").to_pylist()
    for r in fails:
        r["template"] = json.loads(r["template"])
    assert [r["id"] for r in fails] == [r["id"] for r in c["rows"] if r["status"] in fuzz.FAIL_STATUSES]
    assert all(r["template"]["case"]["id"] == r["id"] and r["seed"] for r in fails)
    step = json.loads((repo.path / "artifacts/train_step/tiny_mlp/bfloat16.json").read_text())
    assert {r["name"] for r in step["params"]} >= {"fc1.weight", "fc2.bias"} and step["verdict"] == "PASS"
    p = yaml.safe_load((repo.path / "params.yaml").read_text())
    md = "\n".join(fuzz_report.markdown(*fuzz_report.load(p, repo.path / "artifacts")))
    assert "## Fuzz campaign `critical-fp16-torch_cpu`" in md and "## Training step `tiny_mlp-bfloat16`" in md
    for r in fails[:3]:
        assert f"| {r['id']} | {r['seed']} | {r['status']} |" in md
    bad = repo.run([f"{BIN}/parity", "compose", "-S", "fuzz.suites=[critical]", "-S", "fuzz.dtypes=[bf16]"],
                   check=False)
    assert bad.returncode != 0 and "fuzz.dtypes: 'bf16' is not selected in `dtypes`" in bad.stdout + bad.stderr


def test_train_step_mlp_per_parameter_gradient_errors():
    """conf mlp, one SGD step fp32 vs AMP: every parameter has a gradient error, AMP's is far above
    fp32's own error against fp64, the loss agrees; a limit below the error fails naming the worst."""
    from parity.analysis import train_step

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "conf/models/mlp.yaml").read_text())["mlp"]
    res = train_step.check(cfg, "bfloat16", seed=0)
    names = [r["name"] for r in res["params"]]
    assert names == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    for r in res["params"]:
        assert 0 < r["rel_l2"] < res["limit"] and r["nonfinite"] == 0
        assert r["fp32_vs_fp64"] < r["amp_vs_fp64"] / 100
    assert res["verdict"] == "PASS" and res["loss"]["amp_rel"] < 1e-3 and res["scaler"] is None
    worst = max(res["params"], key=lambda r: r["rel_l2"])
    tight = train_step.check(cfg, "float16", seed=0, limit=1e-5, fp64=False)
    assert tight["verdict"] == "FAIL" and tight["scaler"]["skipped"] is False
    assert tight["worst"]["name"] == max(tight["params"], key=lambda r: r["rel_l2"])["name"]
    assert "fp32_vs_fp64" not in tight["params"][0] and worst["name"].startswith("fc")
    assert "fc1.weight" in train_step.table(res)


@pytest.mark.slow
def test_minimise_the_unfold_crash(tmp_path, capsys):
    """OpInfo's nn.functional.unfold sample kills the ORT worker at fp16 (SIGFPE): minimising keeps
    the CRASH and shrinks the input; the YAML validates."""
    out = tmp_path / "unfold.yaml"
    rc = fuzz_cli.main(["opinfo", "--dtype", "fp16", "--provider", "ort_cpu", "--minimise", "nn.functional.unfold#0",
                        "--yaml", str(out), "--out", str(tmp_path)])
    text = capsys.readouterr().out
    assert rc == 0 and "still CRASH" in text, text
    dims = yaml.safe_load(out.read_text())["unfold"]["spec"]["dims"]
    assert sum(dims.values()) < 0 + 1 + 5 + 5
    assert suite_cli.validate(str(out))[0]["target"] == "torch.nn.functional.unfold"


def test_nonfinite_and_layouts_reach_the_tensors():
    """--nonfinite draws NaN and +-Inf into one input of some cases; transposed / channels_last
    layouts give tensors with those strides (and the same values)."""
    import numpy as np
    import torch

    from parity.suites import execute

    (t,) = [t for t in fuzz.templates("critical") if t["base"] == "conv2d"]
    drawn = [fuzz.mutate(t, s, "float16", {"nonfinite": True}) for s in range(60)]
    nf = [m for m in drawn if any("nonfinite" in p for p in m["spec"]["presets"].values())]
    assert 5 <= len(nf) <= 30
    c = fuzz.expand(nf[0])
    x = [execute.make_tensor(a["tensor"], np.random.default_rng(0)) for a in c["call_args"]
         if isinstance(a, dict) and "nonfinite" in a.get("tensor", {})][0]
    assert int(torch.isnan(x).sum()) == 1 and int(torch.isinf(x).sum()) == 2
    for lay, check in (("transposed", lambda x: not x.is_contiguous()),
                       ("channels_last", lambda x: x.is_contiguous(memory_format=torch.channels_last))):
        m = next(m for m in drawn if m["fuzz"]["layout"] == lay and all(v > 1 for v in m["spec"]["dims"].values()))
        spec_x = fuzz.expand(m)["call_args"][0]["tensor"]
        a, b = (execute.make_tensor(dict(spec_x, layout=lo), np.random.default_rng(1)) for lo in (lay, "contiguous"))
        assert check(a) and torch.equal(a, b)
