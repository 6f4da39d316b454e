"""Injected faults, located: the acceptance experiment of the oracle verdict (issue 9).

For each fault, parity.analysis.faults writes a faulty copy of a model's exported graphs; the
pipeline's own capture and diff stages then run one cell on it (command lines as in dvc.yaml, the
fp64 reference and the baseline from the checkout's artifacts), and the table says whether the diff
named the faulty layer (or the ops between leaves) as drift_origin, with its cause label.

Run it in a checkout whose pipeline has run for the models below at the given dtype (export,
reference with reference.fp64, baseline), e.g. after
    parity compose -S 'models=[mlp,transformer_block,resnet18,mobilenet_v3_small]' -S 'dtypes=[fp32]' \
        -S 'providers=[ort_cpu]' && dvc repro
    python benchmarks/fault_table.py [--repo .] [--dtype fp32] [--provider ort_cpu] [--json out.json]
Outputs go to a temp dir; the checkout's artifacts are only read.

`--set issue35` runs the decoder faults of issue 35 on tiny_llama instead (an RMSNorm epsilon, fp16-stored
weights, a causal-mask leak at token 10, a 1.002 and a 1.01 weight scale, SiLU -> Sigmoid, up_proj x1.1,
and a weight fault in model.onnx only), each at every --dtype (comma-separated), with what each dtype
should say: a fault below a format's own rounding (weights stored in fp16, in an fp16 cell) must PASS.
    parity compose -S 'models=[tiny_llama]' -S 'dtypes=[fp32,fp16]' -S 'providers=[ort_cpu]' && \
        dvc repro diff@tiny_llama-fp32-ort_cpu diff@tiny_llama-fp16-ort_cpu
    python benchmarks/fault_table.py --set issue35 --dtype fp32,fp16
A row is exact when the verdict, the drift origin and the cause label are the expected ones, the mask
leak's cause names "token 10", and no FAIL's cause says "within limit" or "<= limit".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# (id, model, fault, target, extra args, expected drift_origin, expected cause label or None)
FAULTS = [
    ("conv weight x1.05", "resnet18", "weight_scale", "layer1.0.conv1", ["--value", "1.05"], "layer1.0.conv1", "scale"),
    ("BatchNorm eps 1e-5 -> 1e-3", "resnet18", "bn_epsilon", "layer2.0.bn1", ["--value", "1e-3"], "layer2.0.bn1", None),
    ("one output channel x1.1", "resnet18", "channel_scale", "layer3.0.conv1", ["--value", "1.1", "--channel", "0"],
     "layer3.0.conv1", "channel"),
    ("GELU -> tanh", "transformer_block", "gelu_tanh", "act", [], "act", "op_substitution"),
    ("bias +1e-3", "resnet18", "bias_shift", "fc", ["--value", "1e-3"], "fc", "offset"),
    ("Hardswish -> Relu", "mobilenet_v3_small", "hardswish_relu", "features.4.block.0.2", [],
     "features.4.block.0.2", "op_substitution"),
    ("softmax axis -1 -> -2", "transformer_block", "softmax_axis", "Softmax", [], "between:out", None),
    ("Transpose [0,1,3,2] after a conv", "resnet18", "transpose", "layer2.0.conv2", ["--perm", "0,1,3,2"],
     "layer2.0.conv2", "layout"),
    ("+5e-5 on one layer's output", "resnet18", "output_offset", "layer4.1.conv2", ["--value", "5e-5"],
     "layer4.1.conv2", None),
    # issue 24's cause labels
    ("conv output rounded to fp16 and back", "resnet18", "fp16_round", "layer1.0.conv1", [], "layer1.0.conv1",
     "narrow_format"),
    ("two output channels swapped", "resnet18", "channel_swap", "layer2.0.conv1", ["--channels", "3,7"],
     "layer2.0.conv1", "channel_permutation"),
    ("two depthwise output channels swapped", "mobilenet_v3_small", "channel_swap", "features.4.block.1.0",
     ["--channels", "3,7"], "features.4.block.1.0", "channel_permutation"),
    ("HardSigmoid -> Sigmoid", "mobilenet_v3_small", "hardsigmoid_sigmoid", "features.1.block.1.scale_activation",
     [], "features.1.block.1.scale_activation", "op_substitution"),
    ("Relu -> LeakyRelu(0.01)", "resnet18", "relu_leaky", "layer1.0.relu", ["--value", "0.01"], "layer1.0.relu",
     "op_substitution"),
]


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)


# issue 35 (tiny_llama): (id, model, fault, target, extra args, {dtype: (expected drift_origin, expected
# cause label, text the cause must hold)}); (None, None, None): the cell must PASS at that dtype.
ATTN0 = "between:model.layers.0.self_attn.o_proj"  # the ops between v_proj and o_proj: RoPE, SDPA
DOWN1 = "model.layers.1.mlp.down_proj"
ISSUE35 = [
    ("RMSNorm eps 1e-5 -> 1e-4", "tiny_llama", "norm_epsilon", "model.layers.0.post_attention_layernorm",
     ["--value", "1e-4"], {d: ("model.layers.0.post_attention_layernorm", "row_scale", None) for d in ("fp32", "fp16")}),
    ("down_proj weight stored in fp16", "tiny_llama", "fp16_weights", DOWN1, [],
     {"fp32": (DOWN1, "narrow_weights", None), "fp16": (None, None, None)}),
    ("causal-mask leak at token 10", "tiny_llama", "mask_leak", "node_Softmax_219", ["--token", "10"],
     {d: (ATTN0, "mask_leak", "token 10") for d in ("fp32", "fp16")}),
    ("down_proj weight x1.002", "tiny_llama", "weight_scale", DOWN1, ["--value", "1.002"],
     {d: (DOWN1, "scale", None) for d in ("fp32", "fp16")}),
    ("down_proj weight x1.01", "tiny_llama", "weight_scale", DOWN1, ["--value", "1.01"],
     {d: (DOWN1, "scale", None) for d in ("fp32", "fp16")}),
    ("up_proj weight x1.1", "tiny_llama", "weight_scale", "model.layers.0.mlp.up_proj", ["--value", "1.1"],
     {d: ("model.layers.0.mlp.up_proj", "scale", None) for d in ("fp32", "fp16")}),
    ("SiLU -> Sigmoid", "tiny_llama", "silu_sigmoid", "model.layers.1.mlp.act_fn", [],
     {d: ("model.layers.1.mlp.act_fn", "op_substitution", "Sigmoid") for d in ("fp32", "fp16")}),
    ("down_proj weight x1.05 in model.onnx only", "tiny_llama", "weight_scale", DOWN1, ["--value", "1.05", "--plain-only"],
     {d: (DOWN1, "plain_graph", "node_linear_13") for d in ("fp32", "fp16")}),
]
SETS = {"issue9": FAULTS, "issue35": ISSUE35}


def contradicts(verdict: str, summary: str | None) -> bool:
    """A FAIL whose cause says the error is within the limit (a cause contradicting its verdict)."""
    s = summary or ""
    return verdict == "FAIL" and ("within limit" in s or "<= limit" in s or s.startswith("precision"))


def expectation(spec, dtype: str) -> tuple:
    """(expected drift_origin, cause label, text in the cause) of a row at `dtype`."""
    if isinstance(spec[5], dict):
        return spec[5].get(dtype, (None, None, None))
    return spec[5], spec[6], None


def one(repo: Path, tmp: Path, spec, dtype: str, provider: str) -> dict:
    name, model, fault, target, extra = spec[:5]
    want, want_cause, want_text = expectation(spec, dtype)
    d = tmp / f"{name}-{dtype}".replace(" ", "_").replace("/", "_")
    py = sys.executable
    r = run([py, "-m", "parity.analysis.faults", "--model-dir", f"artifacts/models/{model}", "--fault", fault,
             "--target", target, *extra, "--out", str(d / "model")], repo)
    if r.returncode:
        return {"fault": name, "model": model, "dtype": dtype, "error": "inject: " + (r.stderr or r.stdout).strip()[-300:]}
    cell = [f"--model", model, "--dtype", dtype, "--provider", provider]
    r = run([py, "-m", "stages.capture", *cell, "--model-dir", str(d / "model"),
             "--inputs", f"artifacts/inputs/{model}.parquet", "--calibration", f"artifacts/inputs/{model}.calibration.parquet",
             "--reference", f"artifacts/reference/{model}/fp64.parquet", "--out", str(d / "capture"),
             "--timing", str(d / "timing.json")], repo)
    if r.returncode:
        return {"fault": name, "model": model, "dtype": dtype, "error": "capture: " + r.stderr.strip()[-300:]}
    r = run([py, "-m", "stages.diff", *cell, "--capture", str(d / "capture"), "--reference", f"artifacts/reference/{model}",
             "--baseline", f"artifacts/baseline/{model}/{dtype}", "--model-dir", str(d / "model"),
             "--out", str(d / "diff")], repo)
    if r.returncode:
        return {"fault": name, "model": model, "dtype": dtype, "error": "diff: " + r.stderr.strip()[-300:]}
    m = json.loads((d / "diff" / "metrics.json").read_text())
    cause = (m.get("drift_origin_cause") or {})
    exact = m.get("drift_origin") == want and (want_cause is None or cause.get("label") == want_cause) \
        and (want_text is None or want_text in (cause.get("summary") or "")) \
        and (m["verdict"] == "PASS") == (want is None) and not contradicts(m["verdict"], cause.get("summary"))
    return {"fault": name, "model": model, "dtype": dtype, "target": target, "verdict": m["verdict"],
            "drift_origin": m.get("drift_origin"), "where": m.get("drift_origin_where"),
            "cause": cause.get("summary"), "cause_label": cause.get("label"), "worst_layer": m.get("worst_layer"),
            "layers_failed": m.get("layers_failed"), "expected": want, "expected_cause": want_cause, "exact": exact}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", default=".")
    ap.add_argument("--dtype", default="fp32", help="comma-separated: every row at each (fp32,fp16)")
    ap.add_argument("--provider", default="ort_cpu")
    ap.add_argument("--set", default="issue9", choices=list(SETS), help="which faults (issue9: the 14 above)")
    ap.add_argument("--only", default="", help="comma-separated fault numbers of the set (1-based)")
    ap.add_argument("--json")
    a = ap.parse_args()
    repo = Path(a.repo).resolve()
    faults = SETS[a.set]
    picked = [faults[int(i) - 1] for i in a.only.split(",") if i] or faults
    rows = []
    with tempfile.TemporaryDirectory(prefix="parity-faults-") as td:
        for spec in picked:
            for dtype in a.dtype.split(","):
                row = one(repo, Path(td), spec, dtype, a.provider)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    print(f"| # | fault | model | dtype | verdict | drift_origin (expected) | cause | layers failing | exact |")
    print("|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(rows, 1):
        if "error" in r:
            print(f"| {i} | {r['fault']} | {r['model']} | | | ERROR: {r['error']} | | | no |")
            continue
        print(f"| {i} | {r['fault']} | {r['model']} | {r['dtype']} | {r['verdict']} | "
              f"{r['where'] or r['drift_origin']} ({r['expected'] or 'PASS'}) | "
              f"{r['cause'] or '-'} | {r['layers_failed']} | {'yes' if r['exact'] else 'no'} |")
    print(f"\n{sum(bool(r.get('exact')) for r in rows)} of {len(rows)} exact")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
