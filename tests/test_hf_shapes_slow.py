"""Heavy tests of issue 10 part B (`pytest -m slow`): BERT-base- and GPT-2-small-shaped Hugging Face
models from their configs at fp32 and fp16 on torch_cpu and ort_cpu, and the shipped two-shape
models (resnet18 at batch 1 and 4, the transformer block at sequence 16 and 128), each through the
real pipeline. Each test prints its cells' verdicts and the stages' own timings (`-s`)."""

from __future__ import annotations

import json
import re
import time

import pytest

from conftest import make_repo

pytestmark = pytest.mark.slow


def _run(tmp_path, model, dtypes, providers):
    r = make_repo(tmp_path / "repo", models=(model,), dtypes=dtypes, providers=providers)
    t0 = time.perf_counter()
    out = r.run(["dvc", "repro"]).stdout
    wall = time.perf_counter() - t0
    timings = re.findall(r"^((?:export|reference|baseline|capture|inputs)@\S+?):.*?([\d.]+)s(?: ->.*)?$", out, re.M)
    print(f"\n{model}: dvc repro {wall:.0f} s; " + ", ".join(f"{s} {t} s" for s, t in timings))
    cells = {}
    for d in dtypes:
        for p in providers:
            m = json.loads((r.path / f"artifacts/diff/{model}-{d}-{p}/metrics.json").read_text())
            cells[f"{d}-{p}"] = m
            print(f"  {model}-{d}-{p}: {m['verdict']} [{m.get('verdict_mode')}] layers={m.get('layers')} "
                  f"failed={m.get('layers_failed')} origin={m.get('drift_origin_where') or m.get('drift_origin')} "
                  f"worst_ratio={m.get('worst_ratio')} output max_abs={m.get('output', {}).get('max_abs')}"
                  + (f" shapes={ {k: v['verdict'] for k, v in m['shapes'].items()} }" if m.get("shapes") else ""))
    return r, cells


@pytest.mark.parametrize("model", ["bert_base", "gpt2_small"])
def test_hf_base_sized_models_run_at_fp32_and_fp16_on_torch_and_ort(tmp_path, model):
    r, cells = _run(tmp_path, model, ("fp32", "fp16"), ("torch_cpu", "ort_cpu"))
    assert all(m["status"] == "OK" and m["layers"] > 100 for m in cells.values()), cells
    assert cells["fp32-torch_cpu"]["verdict"] == "BASELINE" and cells["fp32-ort_cpu"]["verdict"] == "PASS"


@pytest.mark.parametrize("model,labels", [("resnet18_batches", ["b1", "b4"]), ("transformer_seq", ["s16", "s128"])])
def test_two_shape_models_report_each_shape(tmp_path, model, labels):
    r, cells = _run(tmp_path, model, ("fp32",), ("torch_cpu", "ort_cpu"))
    for m in cells.values():
        assert sorted(m["shapes"]) == sorted(labels) and m["verdict"] in ("PASS", "BASELINE"), m  # metrics.json sorts keys
    report = (r.path / "artifacts/report/report.md").read_text()
    assert all(lab in report for lab in labels)
