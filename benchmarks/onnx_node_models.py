"""25 of ONNX's backend node tests as models given as ONNX files (`arch: {source: onnx}`), each through
the whole pipeline (export, inputs from the test's own input files, reference with the fp64 golden,
capture on ort_cpu at fp32, diff) in a scratch repository on real DVC, then the capture's model
outputs compared with the test's expected outputs (ONNX's backend-test rule, |a - e| <= 1e-7 +
1e-3 |e|). Prints a table: each test runs as given, or the line that refused it.

    .venv/bin/python benchmarks/onnx_node_models.py [--work /tmp/onnx_node_models] [--json out.json]

The node tests are written from the installed onnx's generators (parity.suites.onnximport.write_tests;
onnx 1.23's `python -m onnx.backend.test.cmd_tools generate-data` writes only its model tests).
Inputs go through `init: file` (.npy under data/inputs/, one sample: inputs.samples=1).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from parity.core import store  # noqa: E402
from parity.suites.onnxcase import data_sets  # noqa: E402
from parity.suites.onnxcase import data_sets, plain  # noqa: E402
from parity.suites.onnximport import write_tests  # noqa: E402
from tests.conftest import env  # noqa: E402
from tests.conftest import make_repo  # noqa: E402

TESTS = ["test_conv_with_strides_padding", "test_conv_with_strides_no_padding", "test_gemm_default_matrix_bias",
         "test_layer_normalization_4d_axis0", "test_softmax_axis_1", "test_gru_defaults", "test_lstm_defaults",
         "test_resize_upsample_scales_linear", "test_einsum_batch_matmul", "test_batchnorm_example",
         "test_instancenorm_example", "test_reduce_mean_negative_axes_keepdims_example", "test_matmul_3d",
         "test_gelu_tanh_1", "test_attention_4d_with_past_and_present", "test_convtranspose",
         "test_averagepool_2d_pads", "test_maxpool_with_argmax_2d_precomputed_pads", "test_cumsum_1d",
         "test_gather_0", "test_where_example", "test_range_float_type_positive_delta", "test_expand_dim_changed",
         "test_tile", "test_split_equal_parts_1d_opset18"]
BIN = Path(sys.executable).parent


def model_conf(name: str, test: Path, repo: Path) -> str:
    """conf/models/<name>.yaml for the test's model, its inputs as .npy files under data/inputs/."""
    m = onnx.load(str(test / "model.onnx"))
    ins, _ = data_sets(test)[0]
    shutil.copy(test / "model.onnx", repo / "models" / f"{name}.onnx")
    lines = [f"{name}:", f"  arch: {{source: onnx, path: models/{name}.onnx}}", "  input:"]
    for vi, a in zip(m.graph.input, ins):
        f = f"data/inputs/{name}_{vi.name}.npy"
        np.save(repo / f, a)
        lines.append(f"    - {{name: {vi.name}, shape: {list(a.shape)}, dtype: {a.dtype.name}, init: file, path: {f}}}")
    return "\n".join(lines + ["  tolerances: []", ""])


def run(cmd, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env())


def first_error(text: str) -> str:
    """The stage's own one-line refusal (not DVC's 'failed to reproduce' wrapper)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    own = [ln for ln in lines if not ln.startswith(("ERROR: failed", "Running stage", ">", "Updating lock", "env:"))
           and ("@" in ln.split(":")[0] or "error" in ln.lower()) and " -> artifacts/" not in ln]
    return (own or lines or ["?"])[0][:240]


def outputs_vs_expected(repo: Path, name: str, test: Path) -> str:
    """max |capture - expected| over the model outputs, and whether ONNX's rule holds."""
    _, want = data_sets(test)[0]
    cap = repo / f"artifacts/capture/{name}-fp32-ort_cpu"
    got = {}
    for f in cap.glob("*.parquet"):
        got.update({t.name: t.array for t in store.read(f) if t.sample == 0 and store.is_output(t.name)
                    and not t.name.startswith(store.PLAIN)})
    names = ["output"] if len(want) == 1 else [f"output:{i}" for i in range(len(want))]
    worst, ok = 0.0, True
    for n, w in zip(names, want):
        g, w = np.asarray(got[n], np.float64), plain(w).astype(np.float64)
        if g.shape != w.shape:
            return f"shape {list(g.shape)} vs expected {list(w.shape)}"
        d = np.abs(g - w)
        worst = max(worst, float(d.max()) if d.size else 0.0)
        ok &= bool(np.all(d <= 1e-7 + 1e-3 * np.abs(w)))
    return f"{'yes' if ok else 'NO'} (max abs {worst:.1e})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=None, help="scratch folder (default: a temp dir, removed)")
    ap.add_argument("--json", default=None, help="also write the table as JSON here")
    a = ap.parse_args(argv)

    work = Path(a.work or tempfile.mkdtemp(prefix="onnx-node-models-"))
    shutil.rmtree(work, ignore_errors=True)
    tests = work / "node"
    write_tests(tests, TESTS)
    repo = make_repo(work / "repo", dtypes=("fp32",), providers=("ort_cpu",), compose=False)
    (repo.path / "models").mkdir()
    (repo.path / "data/inputs").mkdir(parents=True, exist_ok=True)
    names = {t: t.removeprefix("test_") for t in TESTS}
    for t, n in names.items():
        (repo.path / f"conf/models/{n}.yaml").write_text(model_conf(n, tests / t, repo.path))
    repo.set_defaults(models=tuple(names.values()))
    repo.edit("conf/config.yaml", "  samples: 2 ", "  samples: 1 ")
    composed = run([str(BIN / "parity"), "compose"], repo.path)
    if composed.returncode:
        print(composed.stderr, file=sys.stderr)
        return 1
    repo.commit("node tests as models")
    rows = []
    for t, n in names.items():
        p = run([str(BIN / "dvc"), "repro", f"diff@{n}-fp32-ort_cpu"], repo.path)
        row = {"test": t, "ran": p.returncode == 0}
        if p.returncode:
            row["refused"] = first_error(p.stdout + p.stderr)
        else:
            d = json.loads((repo.path / f"artifacts/diff/{n}-fp32-ort_cpu/metrics.json").read_text())
            lj = json.loads((repo.path / f"artifacts/models/{n}/layers.json").read_text())
            row.update(verdict=d.get("verdict"), mode=d.get("verdict_mode"),
                       fp64=(repo.path / f"artifacts/reference/{n}/fp64.parquet").exists(),
                       matches_expected=outputs_vs_expected(repo.path, n, tests / t),
                       loaded_as="; ".join(lj.get("loaded_as", [])))
            if d.get("verdict_mode") != "oracle":
                row["mode_reason"] = d.get("verdict_mode_reason")
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n| test | ran | verdict (mode) | fp64 golden | outputs vs ONNX expected | note |\n|---|---|---|---|---|---|")
    for r in rows:
        if r["ran"]:
            note = r.get("loaded_as") or r.get("mode_reason") or ""
            print(f"| {r['test']} | yes | {r['verdict']} ({r['mode']}) | {'yes' if r['fp64'] else 'no'} | "
                  f"{r['matches_expected']} | {note} |")
        else:
            print(f"| {r['test']} | refused | | | | {r['refused']} |")
    print(f"\n{sum(r['ran'] for r in rows)} of {len(rows)} ran as given")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
