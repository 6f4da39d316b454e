"""`parity suite import-opdiff`: an opdiff-format suite (written here, in opdiff's documented format)
converts to a parity suite that validates, with opdiff's template ids, and one line per test saying
what was converted, what was dropped and what could not be converted."""

from __future__ import annotations

import subprocess
import sys

import yaml

from conftest import env

OPDIFF = """\
dims: {B: 2, N: 4}
presets:
  x: {type: tensor, shape: [B, N], kind: float, init: normal}
  u: {type: tensor, shape: [B, N], dtype: float32, init: uniform, low: -1, high: 1}
  idx: {type: tensor, shape: [B, N], dtype: int64, init: randint, low: 0, high: 3}
  c6: {type: const_tensor, dtype: float32, shape: [6], value: [-7.0, -3.0, -0.5, 0.25, 2.0, 11.0]}
  alpha: {type: scalar, kind: float, low: 0.5, high: 2.0}
tests:
  - id: add_alpha
    op: aten::add
    in: [{ref: x}, {ref: u}]
    kwargs: {alpha: {ref: alpha}}
  - id: clamp_opt
    op: aten::clamp
    in: [{ref: x}]
    kwargs:
      min: {type: scalar_tensor, dtype: float32, init: uniform, low: -0.5, high: 0.5}
      max: {type: optional, p_none: 0.5, elem: {type: const, value: 0.25}}
  - id: gather
    op: aten::gather
    in: [{ref: x}, {type: const, value: 1}, {ref: idx}]
  - id: cat3
    op: aten::cat
    in:
      - {type: list, len: 3, elem: {type: tensor, shape: [B, N], dtype: float32, init: normal}}
      - {type: const, value: 1}
  - id: where
    op: aten::where
    in: [{type: tensor, shape: [B, N], dtype: bool, init: bernoulli, p: 0.3}, {ref: x}, {ref: u}]
  - id: fft
    op: aten::fft_irfft
    in: [{type: tensor, dtype: complex64, shape: [2, 4], init: normal}, {type: const, value: null},
         {type: scalar, kind: int, low: -2, high: 1}, {type: const, value: null}]
    cast_input0_to_complex: true
  - id: seq
    impl: eager
    op:
      type: module
      path: torch.nn.Sequential
      args: [{type: construct, path: torch.nn.Linear, args: [4, 4], kwargs: {}},
             {type: construct, path: torch.nn.Sigmoid, args: [], kwargs: {}}]
    in: [{ref: x}]
  - id: lin
    op:
      type: template_module
      path: torch.nn.Linear
      vars: {in_features: [N], out_features: [3, 5], bias: [true, false]}
      args: [{var: in_features}, {var: out_features}]
      kwargs: {bias: {var: bias}}
    in: [{ref: x}]
  - id: lin_cases
    op:
      type: template_module
      path: torch.nn.Linear
      vars: {in_features: [4, 8], inp: [x, x8], out_features: [2]}
      cases: [{in_features: 4, inp: x}]
      args: [{var: in_features}, {var: out_features}]
    in: [{ref: {var: inp}}]
  - id: pair
    op:
      type: template_compare_pair
      vars: {}
      common: {args: [4, 3]}
      a: {impl: one, type: module, path: torch.nn.Linear}
      b: {impl: two, type: module, path: torch.nn.Linear}
    in: [{ref: x}]
  - id: unary
    op: {type: module, path: torch.nn.ReLU}
    in: [{ref: c6}]
  - id: fwd_kwargs
    op: {type: module, path: torch.nn.Linear, args: [4, 2]}
    in: [{ref: x}]
    kwargs: {scale: {type: const, value: 2}}
"""


def test_import_opdiff_converts_validates_and_says_per_case(tmp_path):
    src = tmp_path / "od.yaml"
    src.write_text(OPDIFF)
    p = subprocess.run([sys.executable, "-m", "parity.commands.suite_cli", "import-opdiff", str(src)], cwd=tmp_path,
                       env=env(), capture_output=True, text=True)
    lines = dict(line.split("\t", 1) for line in p.stdout.splitlines() if "\t" in line)
    assert p.returncode == 1, p.stdout + p.stderr  # one test could not be converted
    assert lines["fwd_kwargs"].startswith("NOT CONVERTED\tforward kwargs of a module test")
    assert lines["fft"].startswith("note\tcast_input0_to_complex") and lines["seq"].startswith("note\timpl")
    assert lines["add_alpha"] == "converted" and lines["lin"] == "converted"
    assert "12 opdiff tests -> 11 cases in conf/suites/od.yaml; 3 with notes, 1 not converted" in p.stdout
    suite = yaml.safe_load((tmp_path / "conf/suites/od.yaml").read_text())["od"]
    assert suite["spec"]["export"] == {"exporter": "dynamo", "opset": 18}  # as opdiff's ONNX backend
    cases = {c["id"]: c for c in suite["spec"]["cases"]}
    assert cases["add_alpha"]["kwargs"] == {"alpha": {"uniform": [0.5, 2.0]}}
    assert cases["fft"]["args"][2] == {"randint": [-2, 2]}  # opdiff's int scalar range is inclusive
    assert cases["clamp_opt"]["kwargs"]["max"] == {"optional": 0.25, "p_none": 0.5}
    assert suite["spec"]["presets"]["c6"]["init"] == {"fixed": [-7.0, -3.0, -0.5, 0.25, 2.0, 11.0]}
    v = subprocess.run([sys.executable, "-m", "parity.commands.suite_cli", "validate", "od"], cwd=tmp_path, env=env(),
                       capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    # opdiff's expanded ids: <id>__k=v__k=v with the keys sorted; `cases` restricts the product
    ids = subprocess.run([sys.executable, "-m", "parity.commands.suite_cli", "list", "od"], cwd=tmp_path, env=env(),
                         capture_output=True, text=True).stdout.split()
    assert "lin__bias=True__in_features=N__out_features=3" in ids and len([i for i in ids if i.startswith("lin__")]) == 4
    assert [i for i in ids if i.startswith("lin_cases")] == ["lin_cases__in_features=4__inp=x__out_features=2"]
    assert len(ids) == 4 + 1 + 9
