"""Run the real-model set (docs/real-models.md) through the real pipeline and print/write its table.

    python benchmarks/real_models.py [--models a,b] [--out table.json] [--md table.md] [--keep]

Needs the models in the cache first (`python scripts/fetch_real_models.py`). For each model a scratch
repository (a copy of this checkout's pipeline files, as tests/conftest.py make_repo builds one, in a
temp dir deleted afterwards unless --keep) gets the model's files under models/real/<model>/, its inputs
as npy files under data/inputs/real/ (examples/real_models/inputs.py) and its conf snippet
(examples/real_models/<model>.yaml) as conf/models/<model>.yaml; then `parity compose -S models=[m]
-S dtypes=[fp32,fp16] -S providers=[ort_cpu(,torch_cpu)]` and `dvc repro` under /usr/bin/time -v.
Per cell it reads artifacts/diff/<cell>/metrics.json: the verdict, how it was judged (verdict_mode and
its reason), drift origin and cause, and the output's error.

Where this checkout lacks a feature a snippet uses, the model runs the way a user had to without it,
and the table says so: `arch.weights` -> the module's own `weights` kwarg; `source: hf, path:` with
`init: text` -> examples/real_models/minilm.py (from_pretrained) fed the prompt's token ids as a file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from examples.real_models import inputs as real_inputs  # noqa: E402  (numpy only)
from scripts.fetch_real_models import MODELS, cache_dir, present  # noqa: E402

PROJECT_FILES = ["dvc.yaml", "env", "conf", "stages", "parity", "hydra_plugins", ".dvcignore", "data"]
SNIPPETS = ROOT / "examples" / "real_models"
TORCH_MODELS = {"crepe_tiny", "crepe_unvoiced", "minilm"}
ALIASES = {"crepe_unvoiced": "crepe_tiny"}  # another conf (other inputs) of a fetched model: its cache folder
ORDER = ["ocr_det", "ocr_rec", "ocr_cls", "magika", "basic_pitch", "silero_vad", "silero_vad_op15", "nudenet",
         "crepe_tiny", "crepe_unvoiced", "minilm"]
BIN = str(Path(sys.executable).parent)


def env(repo: Path | None = None) -> dict:
    """The environment of every command in a scratch repo: its own copy of parity first on the path (the
    venv's editable install points at this checkout, which --src may not be)."""
    e = dict(os.environ)
    e["PATH"] = BIN + os.pathsep + e.get("PATH", "")
    e.pop("PYTHONPATH", None)
    if repo is not None:
        e["PYTHONPATH"] = str(repo)
    e.update(DVC_NO_ANALYTICS="1", GIT_AUTHOR_NAME="parity-real", GIT_COMMITTER_NAME="parity-real",
             GIT_AUTHOR_EMAIL="real@parity.local", GIT_COMMITTER_EMAIL="real@parity.local")
    return e


def sh(cmd: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=cwd, env=env(cwd), capture_output=True, text=True)
    if check and p.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def features(src: Path) -> dict:
    """What the checkout at `src` supports of what the snippets use (read from its config code)."""
    schema = (src / "parity/config/schema.py").read_text()
    params = (src / "parity/config/params.py").read_text()
    arch = schema.split("class Arch", 1)[1].split("@dataclass", 1)[0]
    inits = params.split("INPUT_INITS =", 1)[1].split("}}", 1)[0] if "INPUT_INITS =" in params else ""
    return {"weights": bool(re.search(r"^\s+weights\b", arch, re.M)),
            "text": '"text"' in inits,
            "hf_path": bool(re.search(r"source: hf, path|source.*==.*\"hf\".*\"path\"", params))}


def warm_state(model: str, cache: Path):
    """For the recurrent silero models: a function running the fetched file (onnxruntime CPU, fp32) over a
    stream's earlier chunks from the zero state, returning the state it ends in; None for the others."""
    if not model.startswith("silero_vad"):
        return None
    import numpy as np
    import onnxruntime as ort

    s = ort.InferenceSession(str(cache / model / Path(next(iter(MODELS[model][1]))).name),
                             providers=["CPUExecutionProvider"])

    def warm(chunks, sr):
        state = np.zeros((2, 1, 128), np.float32)
        for c in chunks:
            _, state = s.run(None, {"input": c, "state": state, "sr": np.array(sr, np.int64)})
        return state
    return warm


def make_scratch(path: Path, source: Path) -> None:
    """A git + DVC repo with the pipeline files of the checkout at `source` (and this checkout's
    examples/), as tests/conftest.py make_repo makes one."""
    path.mkdir(parents=True)
    for name in PROJECT_FILES:
        src = source / name
        if src.is_dir():
            shutil.copytree(src, path / name, ignore=shutil.ignore_patterns("__pycache__", "real"))
        elif src.exists():
            shutil.copy2(src, path / name)
    shutil.copytree(ROOT / "examples", path / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    (path / ".gitignore").write_text("/artifacts/\n__pycache__/\n")
    sh(["git", "init", "-q"], path)
    sh(["dvc", "init", "-q"], path)
    sh(["dvc", "config", "hydra.enabled", "true"], path)
    sh(["dvc", "config", "core.autostage", "true"], path)
    m = re.search(r"^\[cache\]\n(?:\s+.*\n)*?\s+type = \"?([\w,]+)", (source / ".dvc/config").read_text(), re.M)
    if m:
        sh(["dvc", "config", "cache.type", m.group(1)], path)


def conf_for(model: str, feat: dict, repo: Path, cache: Path) -> tuple[str, list[str]]:
    """The conf file text for `model` in `repo` (the snippet, or its fallback) and notes on fallbacks."""
    text = (SNIPPETS / f"{model}.yaml").read_text()
    notes = []
    if model in ("crepe_tiny", "crepe_unvoiced") and not feat["weights"]:
        text = text.replace("kwargs: {size: tiny}\n    weights: models/real/crepe_tiny/tiny.pth",
                            "kwargs: {size: tiny, weights: models/real/crepe_tiny/tiny.pth}")
        notes.append("no arch.weights: state dict loaded by the module's weights kwarg")
    if model == "minilm" and not (feat["hf_path"] and feat["text"]):
        f = "data/inputs/real/minilm_{}.npy"
        for k, a in zip(("input_ids", "attention_mask", "token_type_ids"), _tokens(cache / "minilm", text)):
            real_inputs.np.save(repo / f.format(k), a)
        text = text.replace("  arch: {source: hf, path: models/real/minilm}",
                            "  arch: {source: import, name: examples.real_models.minilm:from_folder,\n"
                            "         kwargs: {path: models/real/minilm}}")
        text = re.sub(r"init: text,\s+prompts: \[.*?\]\}", f"init: file, path: {f.format('input_ids')}}}", text,
                      flags=re.S)
        for k in ("attention_mask", "token_type_ids"):
            text = text.replace(f"init: text, key: {k}}}", f"init: file, path: {f.format(k)}}}")
        notes.append("no hf path/init: text: from_pretrained in examples/real_models/minilm.py, prompt "
                     "tokenised by the checkpoint's tokenizer into npy files")
    return text, notes


def _tokens(folder: Path, conf: str):
    """The snippet's prompts through the checkpoint's tokenizer: ([n, 1, 16] ids, mask, token types)."""
    from transformers import AutoTokenizer

    prompts = json.loads("[" + re.search(r"prompts: \[(.*?)\]\}", conf, re.S).group(1) + "]")
    tok = AutoTokenizer.from_pretrained(str(folder))
    enc = tok(prompts[:real_inputs.SAMPLES], padding="max_length", truncation=True, max_length=16, return_tensors="np")
    return tuple(enc[k][:, None].astype("int64") for k in ("input_ids", "attention_mask", "token_type_ids"))


def setup_model(repo: Path, model: str, cache: Path, feat: dict) -> list[str]:
    src = ALIASES.get(model, model)
    dest = repo / "models" / "real" / src
    dest.mkdir(parents=True, exist_ok=True)
    for member in MODELS[src][1]:
        shutil.copy2(cache / src / Path(member).name, dest / Path(member).name)
    real_inputs.write(model, repo / "data" / "inputs" / "real", warm=warm_state(src, cache))
    (repo / "data" / "inputs" / "real").mkdir(parents=True, exist_ok=True)
    text, notes = conf_for(model, feat, repo, cache)
    (repo / "conf" / "models" / f"{model}.yaml").write_text(text)
    return notes


def timed_repro(repo: Path) -> dict:
    """`dvc repro` under /usr/bin/time -v: rc, wall, CPU (user + sys of it and its children), max RSS."""
    t0 = time.time()
    p = subprocess.run(["/usr/bin/time", "-v", "dvc", "repro"], cwd=repo, env=env(repo), capture_output=True, text=True)
    wall = time.time() - t0

    def grab(key):
        m = re.search(rf"{re.escape(key)}: ([\d.:]+)", p.stderr)
        return m.group(1) if m else None
    cpu = float(grab("User time (seconds)") or 0) + float(grab("System time (seconds)") or 0)
    lines = (p.stdout + "\n" + p.stderr).splitlines()
    err = [ln for ln in lines if "ERROR" in ln or "Error" in ln][-3:]
    # what the stages said (one line each: "reference@m: ...", "export@m: ..."): why a cell has no result
    said = [ln for ln in lines if re.match(r"^[a-z_]+@[\w.-]+: ", ln)][-6:]
    return {"rc": p.returncode, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "max_rss_mb": round(int(grab("Maximum resident set size (kbytes)") or 0) / 1024),
            "stages": len(re.findall(r"^Running stage", p.stdout, re.M)), "errors": err, "said": said}


def cells(repo: Path, model: str, providers: list[str]) -> list[dict]:
    out = []
    for dt in ("fp32", "fp16"):
        for prov in providers:
            cell = f"{model}-{dt}-{prov}"
            f = repo / "artifacts" / "diff" / cell / "metrics.json"
            if not f.is_file():
                out.append({"cell": cell, "verdict": "NO RESULT"})
                continue
            out.append(summarize_cell(cell, json.loads(f.read_text()), repo))
    return out


def summarize_cell(cell: str, m: dict, repo: Path) -> dict:
    """What the table shows of a cell's metrics.json (the diff's own words, unchanged)."""
    keys = ("verdict", "status", "verdict_mode", "verdict_mode_reason", "drift_origin", "drift_origin_cause",
            "worst_layer", "worst_excess", "layers", "layers_failed", "reason", "precision")
    rec = {"cell": cell, **{k: m[k] for k in keys if k in m}}
    out = m.get("output") or {}
    rec.update(output_rel_l2=out.get("rel_l2"), output_max_abs=out.get("max_abs"), output_passed=out.get("passed"))
    extra = sorted(set(m) - set(keys) - {"output", "passed", "plain_output", "drift_origin_where", "worst_ratio",
                                         "worst_tol_ratio"})
    rec.update({k: m[k] for k in extra})  # what later diff code adds (notes, causes), kept as written
    return rec


def run_model(model: str, cache: Path, feat: dict, keep: bool, src: Path = ROOT) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"parity-real-{model}-"))
    repo = tmp / "repo"
    providers = ["ort_cpu", "torch_cpu"] if model in TORCH_MODELS else ["ort_cpu"]
    rec = {"model": model, "package": MODELS[ALIASES.get(model, model)][0], "providers": providers}
    try:
        make_scratch(repo, src)
        rec["notes"] = setup_model(repo, model, cache, feat)
        c = sh(["parity", "compose", "-S", f"models=[{model}]", "-S", "dtypes=[fp32,fp16]",
                "-S", f"providers=[{','.join(providers)}]"], repo, check=False)
        if c.returncode:
            rec.update(compose_error=(c.stderr or c.stdout).strip().splitlines()[-1:], cells=[])
            return rec
        sh(["git", "add", "-A"], repo)
        sh(["git", "commit", "-qm", "real model"], repo)
        rec["run"] = timed_repro(repo)
        rec["cells"] = cells(repo, model, providers)
        if keep:
            rec["repo"] = str(repo)
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return rec


def table(results: list[dict]) -> str:
    rows = ["| model | cell | verdict | judged by | layers failed | drift origin | cause | output rel_l2 vs fp32 ref | "
            "wall / CPU s (model) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        run = r.get("run", {})
        t = f"{run.get('wall_s', '-')} / {run.get('cpu_s', '-')}"
        if r.get("compose_error"):
            rows.append(f"| {r['model']} | - | CONFIG ERROR | - | - | - | {r['compose_error'][0][:200]} | - | - |")
        for c in r.get("cells", []):
            if c["verdict"] == "NO RESULT":
                why = (run.get("said") or run.get("errors") or r.get("notes") or ["-"])[-1]
                rows.append(f"| {r['model']} | {c['cell'].split('-', 1)[1]} | NO RESULT | - | - | - | "
                            f"{why[:240]} | - | {t} |")
                continue
            cause = c.get("drift_origin_cause")
            cause = (cause.get("label") or cause.get("cause")) if isinstance(cause, dict) else cause
            failed = f"{c.get('layers_failed', '-')} / {c.get('layers', '-')}"
            rows.append(f"| {r['model']} | {c['cell'].split('-', 1)[1]} | {c.get('verdict')} | "
                        f"{c.get('verdict_mode', '-')} | {failed} | {_short(c.get('drift_origin'))} | {cause or '-'} | "
                        f"{_g(c.get('output_rel_l2'))} | {t} |")
    return "\n".join(rows)


def _short(name) -> str:
    """A layer name as the table shows it (tf2onnx names are long paths: their last 3 parts)."""
    if not name:
        return "-"
    parts = str(name).split("/")
    return "`" + ("…/" + "/".join(parts[-3:]) if len(parts) > 3 else str(name)) + "`"


def _g(v) -> str:
    return f"{v:.3g}" if isinstance(v, (int, float)) else "-"


# --- the float64 check by hand of an fp16 cell (docs/real-models.md) ----------------------------------
# Independent of parity's reference code: the model file as fetched, its own float64 copy, onnx's
# reference evaluator (with two of its ops fixed: GlobalMaxPool on rank-3 inputs, where onnx 1.23's
# reduces the channel axis too; BatchNormalization in inference mode, below), ORT at fp32 and at fp16 (onnxruntime's convert_float_to_float16, float32 I/O, as ort_cpu).

def _to64(g) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, numpy_helper

    def tensor(t):
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))
    for t in g.initializer:
        tensor(t)
    for v in [*g.input, *g.output, *g.value_info]:
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = TensorProto.DOUBLE
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                tensor(a.t)
            elif a.type == onnx.AttributeProto.GRAPH:
                _to64(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sg in a.graphs:
                    _to64(sg)
            elif n.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.DOUBLE


def _global_max_pool():
    from onnx.reference.op_run import OpRun

    class GlobalMaxPool(OpRun):
        def _run(self, x):
            return (x.max(axis=tuple(range(2, x.ndim)), keepdims=True),)
    return GlobalMaxPool


def _batch_norm():
    """BatchNormalization in inference (one output), whatever its opset: onnx 1.23's evaluator switches
    opset-9..13 nodes with a `momentum` attribute (Paddle2ONNX writes one) to training mode, batch statistics."""
    from onnx.reference.op_run import OpRun

    class BatchNormalization(OpRun):
        def _run(self, x, scale, bias, mean, var, epsilon=1e-5, momentum=None, spatial=None, training_mode=None):
            shape = (-1,) + (1,) * (x.ndim - 2)
            y = scale.reshape(shape) * (x - mean.reshape(shape)) / (var.reshape(shape) + epsilon) ** 0.5
            return ((y + bias.reshape(shape)).astype(x.dtype),)
    return BatchNormalization


def fp64_check(model: str, cache: Path) -> list[dict]:
    """Per sample and output of an ONNX-file model: rel_l2 and max |diff| of ORT fp32 and ORT fp16 against
    the float64 run, and (classifier-like outputs) whether the fp16 argmax or thresholded mask differs."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator
    from onnxruntime.transformers.float16 import convert_float_to_float16

    path = cache / model / Path(next(iter(MODELS[model][1]))).name
    m = onnx.load(str(path))
    m64 = onnx.ModelProto.FromString(m.SerializeToString())
    _to64(m64.graph)
    ev = ReferenceEvaluator(m64, new_ops=[_global_max_pool(), _batch_norm()])
    s32 = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    s16 = ort.InferenceSession(convert_float_to_float16(m, keep_io_types=True).SerializeToString(),
                               providers=["CPUExecutionProvider"])
    names = [o.name for o in m.graph.output]
    rows = []
    arrays = real_inputs.arrays(model, warm=warm_state(model, cache))
    for k in range(real_inputs.SAMPLES):
        feed = {n: np.asarray(a[k]) for n, a in arrays.items()}
        o64 = ev.run(None, {n: v.astype(np.float64) if v.dtype.kind == "f" else v for n, v in feed.items()})
        o32, o16 = s32.run(None, feed), s16.run(None, feed)
        for name, g, a32, a16 in zip(names, o64, o32, o16):
            rows.append({"sample": k, "output": name, "rms64": _rms(g), **_err("fp32", a32, g), **_err("fp16", a16, g),
                         **_decision(model, a16, a32, g)})
    return rows


def torch_fp64_check(model: str, cache: Path) -> list[dict]:
    """The same for a torch checkpoint (crepe_tiny): the module in float64 / float32 / float16 (torch CPU),
    and its ONNX graph (torch.onnx's TorchScript exporter, opset 17) on ORT at fp32 and at fp16."""
    import copy
    import tempfile as tf

    import numpy as np
    import onnxruntime as ort
    import torch
    from onnxruntime.transformers.float16 import convert_float_to_float16

    if model not in ("crepe_tiny", "crepe_unvoiced"):
        return []
    from examples.real_models.crepe import crepe

    net = crepe("tiny", str(cache / "crepe_tiny" / "tiny.pth"))
    x = real_inputs.arrays(model)["frames"]
    with tf.TemporaryDirectory() as d:
        f = f"{d}/m.onnx"
        torch.onnx.export(net, (torch.from_numpy(x[0]),), f, input_names=["frames"], opset_version=17, dynamo=False)
        import onnx
        m = onnx.load(f)
        s32 = ort.InferenceSession(f, providers=["CPUExecutionProvider"])
        s16 = ort.InferenceSession(convert_float_to_float16(m, keep_io_types=True).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    rows = []
    with torch.no_grad():
        for k in range(real_inputs.SAMPLES):
            t = torch.from_numpy(x[k])
            g = copy.deepcopy(net).double()(t.double()).numpy()
            t32 = net(t).numpy()
            t16 = copy.deepcopy(net).half()(t.half()).float().numpy()
            o32, o16 = s32.run(None, {"frames": x[k]})[0], s16.run(None, {"frames": x[k]})[0]
            rows.append({"sample": k, "output": "output", "rms64": _rms(g), **_err("torch_fp32", t32, g),
                         **_err("torch_fp16", t16, g), **_err("fp32", o32, g), **_err("fp16", o16, g),
                         **_decision(model, o16, o32, g), "torch_fp16_argmax_flips": float(np.mean(
                             np.argmax(t16, -1) != np.argmax(g, -1)))})
    return rows


def fp64_table(rows: dict) -> str:
    """The hand check as a Markdown table: per model, sample and output, each side's error vs float64."""
    out = ["| model | sample | output | rms (fp64) | ORT fp32 rel_l2 | ORT fp16 rel_l2 | ORT fp16 max abs | "
           "decision | flips fp16 (fp32) |", "|---|---|---|---|---|---|---|---|---|"]
    for model, rs in rows.items():
        for r in rs:
            flips = f"{r['flips_fp16']:.2%} ({r['flips_fp32']:.2%})" if "flips_fp16" in r else "-"
            if model == "nudenet" and "flips_fp16" in r:
                flips += " of boxes > 0.25"
            out.append(f"| {model} | {r['sample']} | {_short(r['output'])} | {r['rms64']:.3g} | {r['fp32_rel_l2']:.2g} | "
                       f"{r['fp16_rel_l2']:.2g} | {r['fp16_max_abs']:.2g} | {r.get('decision', '-')} | {flips} |")
    return "\n".join(out)


def _rms(a) -> float:
    import numpy as np
    return float(np.sqrt(np.mean(np.square(np.asarray(a, np.float64))))) if np.size(a) else 0.0


def _err(tag: str, a, g) -> dict:
    import numpy as np
    d = np.asarray(a, np.float64) - np.asarray(g, np.float64)
    nonfinite = int(np.size(a) - np.isfinite(a).sum())
    return {f"{tag}_rel_l2": float(np.linalg.norm(d) / (np.linalg.norm(g) or 1.0)),
            f"{tag}_max_abs": float(np.nanmax(np.abs(d))) if np.size(d) else 0.0, f"{tag}_nonfinite": nonfinite}


# what a user reads off each model's output: the class argmax along an axis, or the >0.5 mask of probabilities
DECISIONS = {"ocr_det": ("mask", None), "ocr_rec": ("argmax", -1), "ocr_cls": ("argmax", -1),
             "magika": ("argmax", -1), "basic_pitch": ("mask", None), "silero_vad": ("mask", None),
             "silero_vad_op15": ("mask", None), "nudenet": ("argmax", 1), "crepe_tiny": ("argmax", -1),
             "crepe_unvoiced": ("argmax", -1)}


def _decision(model: str, a16, a32, g) -> dict:
    """The fraction of decisions (argmax positions or mask pixels) where fp16 / fp32 differ from fp64."""
    import numpy as np
    kind, axis = DECISIONS.get(model, ("argmax", -1))
    g, a16, a32 = (np.asarray(v, np.float64) for v in (g, a16, a32))
    if model == "nudenet":  # rows 4.. of [1, 22, anchors] are class scores; judged where a box is found (> 0.25)
        keep = g[0, 4:].max(0) > 0.25
        g, a16, a32 = g[:, 4:, keep], a16[:, 4:, keep], a32[:, 4:, keep]
        if not keep.any():
            return {"decision": "no box above 0.25"}
    if kind == "mask":
        if not (g.min() >= 0 and g.max() <= 1):
            return {}
        return {"decision": "mask > 0.5", "flips_fp16": float(np.mean((a16 > 0.5) != (g > 0.5))),
                "flips_fp32": float(np.mean((a32 > 0.5) != (g > 0.5)))}
    if g.ndim < 2:
        return {}
    return {"decision": f"argmax axis {axis}",
            "flips_fp16": float(np.mean(np.argmax(a16, axis) != np.argmax(g, axis))),
            "flips_fp32": float(np.mean(np.argmax(a32, axis) != np.argmax(g, axis)))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="", help=f"comma-separated (default: all: {', '.join(ORDER)})")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--md", type=Path, default=None, help="write the Markdown table here")
    ap.add_argument("--src", type=Path, default=ROOT,
                    help="the checkout whose pipeline runs (default: this one; e.g. a clone of an older commit)")
    ap.add_argument("--fp64-check", action="store_true",
                    help="instead of the pipeline: the float64 check by hand of each ONNX-file model's fp16 output")
    ap.add_argument("--render", type=Path, default=None, help="print the table of a results JSON and exit")
    ap.add_argument("--keep", action="store_true", help="keep the scratch repositories (paths in the JSON)")
    a = ap.parse_args(argv)
    if a.render:
        doc = json.loads(a.render.read_text())
        if "results" not in doc:  # a --fp64-check JSON
            print(fp64_table(doc))
            return 0
        print(f"commit {doc['commit']}, {doc['date']}\n\n{table(doc['results'])}")
        return 0
    cache = cache_dir()
    names = [n for n in a.models.split(",") if n] or ORDER
    missing = [n for n in names if ALIASES.get(n, n) not in MODELS or not present(cache, ALIASES.get(n, n))]
    if missing:
        print(f"real_models: not in the cache {cache}: {', '.join(missing)} "
              f"(run python scripts/fetch_real_models.py)", file=sys.stderr)
        return 2
    if a.fp64_check:
        rows = {n: fp64_check(n, cache) if n not in TORCH_MODELS else torch_fp64_check(n, cache) for n in names}
        print(json.dumps(rows, indent=1))
        if a.out:
            a.out.write_text(json.dumps(rows, indent=1))
        return 0
    src = a.src.resolve()
    feat = features(src)
    commit = sh(["git", "rev-parse", "--short", "HEAD"], src).stdout.strip()
    dirty = bool(sh(["git", "status", "--porcelain", "--", *PROJECT_FILES], src).stdout.strip())
    results = []
    for n in names:
        print(f"real_models: {n} ...", flush=True)
        results.append(run_model(n, cache, feat, a.keep, src))
        print(table(results[-1:]).split("\n", 2)[2], flush=True)
    doc = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
           "uncommitted_changes": dirty, "features": feat, "results": results}
    md = f"commit {commit}{' + uncommitted changes' if dirty else ''}, {doc['date']}\n\n{table(results)}\n"
    print(md)
    if a.out:
        a.out.write_text(json.dumps(doc, indent=1, default=str))
    if a.md:
        a.md.write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
