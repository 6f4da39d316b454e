"""Generation drift (generate_export@model, generate@model-dtype-provider). Heavy: torch (imported
inside the functions); onnxruntime through the provider's runner.

Greedy decoding of `generate.steps` tokens from a seeded prompt of `generate.prompt_len` tokens (or
`generate.prompt`, text tokenised by a checkpoint folder's tokenizer.json: then each side's decoded
text is recorded, `text` in steps.json, and printed), with a
KV cache on every side (parity.pipeline.decoder.DecoderStep: the same step on torch and, exported, on ONNX
Runtime). Step 0 is the prompt's prefill (past 0); step t > 0 feeds one token with the cache of the
steps before it. Three runs, one model in memory at a time:
  reference  torch float64 with its cache: the oracle's golden logits and the greedy tokens
  baseline   torch CPU eager at the cell's dtype: the oracle's yardstick (parity.core.oracle)
  provider   ort_cpu: decoder.onnx (past/present key-value inputs and outputs) through the provider's
             runner (its options, dtype conversion and fault); torch_cpu: the baseline itself
Baseline and provider are teacher-forced on the reference's tokens, so every step compares logits of
the same prefix even after a token diverged. Per step: the last position's logits against fp64
(max_abs, rel_l2, RMSE), the oracle's excess (error / (k x baseline error)), pass, top-1 of each side,
and the reference's top-1 margin (top-1 minus top-2 logit: a divergence at a small margin is a near tie).
The own-error test of the per-layer cells runs too (own_check), at step 0 (the prompt) and at the first
step whose logits fail: on that step's full prefix without cache, every leaf re-run on the fp64
reference's input to it, on the provider (decoder_layers.onnx cut at every leaf, parity.models.onnx_cut,
as the capture's own-error pass) and on the baseline (torch hooks feeding the inputs), judged by the
oracle; a leaf whose own error fails fails that step (`own_failed`, `own_worst_excess`);
`generate.own_every: k` (default 0: off) runs it at every k-th step too (k, 2k, ... below `steps`). A small weight
error late in the model hides in the logits' excess, whose yardstick is the whole model's accumulated
rounding (tiny_llama's last down_proj x1.01 at fp16: logits excess 3.31 < k = 4, own excess 20.5).
The first failing step is the first whose logits, own error or cache test fail; its drift origin is the first leaf
whose own error fails there, else (kind `accumulated`) the first leaf in execution order whose output on
the provider (decoder_layers.onnx, or torch hooks) is over the oracle's limit against fp64 on the prefix,
else (kind `cache`: the fault is on the KV-cache path, which the prefix re-run without a cache never
takes) the first value over the limit when steps 0..t are decoded again with the cache on every side,
the present.<i>.key/value tensors being values of layer i (cache_rows): `model.layers.1 cache
(present.1.value)`, with a cause that says "cache" (every origin carries a `cause` in words).
The cache test (ort cells): steps 0 and 1 decoded with the cache on every side, every leaf and present
value judged (cache_rows); step 1 fails when one fails (judge_cache): a key cache rounded to fp16 moves
the logits less than the limit.
What is held: one step's logits per side plus per-step summary numbers; the golden logits go to a
temporary file (steps x vocab float64) that the later runs read one row at a time.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
import onnx
import torch

from parity.core import oracle
from parity.backends import CaptureJob, fault
from parity.backends.ort_cpu import OrtCpuRunner
from parity.core import store
from parity.core.status import Status
from parity.core.verdict import decide
from parity.core.io import read_json, write_json
from parity.models import onnx_weights
from parity.models.layers import LayerRecorder
from parity.models.onnx_cut import scopes
from parity.models import hf
from parity.pipeline import decoder, inputfiles
from parity.pipeline.decoder import LOGITS, past_names, present_names
from parity.config import schema

# runners generate@ runs (conf/providers/<p>.yaml `runner:`): how each side is driven
SIDES = {"parity.backends.torch_cpu:TorchCpuRunner": "torch", "parity.backends.ort_cpu:OrtCpuRunner": "ort"}
PROMPT_SEED = 23  # numpy stream of the prompt: default_rng([seed, PROMPT_SEED])


def build_lm(model_cfg: dict, seed: int):
    """The model's causal LM (arch.source: hf), seeded weights, eval mode, fp32."""
    arch = model_cfg["arch"]
    if arch.get("source") != "hf":
        raise ValueError(f"arch.source: {arch.get('source')}: generation needs a Hugging Face causal LM (hf)")
    torch.manual_seed(seed)
    if arch.get("path"):  # a checkpoint folder: its trained weights (parity.models.hf)
        return hf.from_checkpoint(str(arch["path"]), "causal_lm", arch.get("kwargs"), use_cache=True).eval()
    return decoder.build_causal_lm(arch["name"], dict(arch.get("kwargs") or {})).eval()


def prompt_ids(p: dict, model: str, vocab: int) -> tuple[list[int], object]:
    """(prompt ids, decode or None): `generate.prompt` tokenised by the model's checkpoint tokenizer
    (ids as it gives them, special tokens included; prompt_len does not apply), else prompt_len
    seeded ids (nothing to decode them with unless the model has a tokenizer.json)."""
    c = schema.of(p)
    arch = p["models"][model]["arch"]
    folder = Path(str(arch["path"])) if arch.get("path") else None
    codec = inputfiles.prompt_codec(folder) if folder and (folder / "tokenizer.json").is_file() else None
    if c.generate.prompt is not None:
        ids = codec[0](c.generate.prompt)
        if not ids or max(ids) >= vocab:
            raise ValueError(f"generate.prompt: tokenised by {folder}/tokenizer.json to {len(ids)} ids"
                             f"{f', up to {max(ids)}, outside the vocabulary [0, {vocab})' if ids else ''}")
        return ids, codec[1]
    return prompt(int(c.seed), vocab, int(c.generate.prompt_len)), (codec[1] if codec else None)


def export_model(p: dict, model: str, out: Path) -> dict:
    """decoder.onnx, decoder_layers.onnx and decoder.json under `out` (parity.pipeline.decoder.export)."""
    c = schema.of(p)
    lm = build_lm(p["models"][model], int(c.seed))
    info = decoder.export(lm, out, opset=int(c.export.opset))
    write_json(out / "decoder.json", info, sort_keys=False)
    return info


def prompt(seed: int, vocab: int, n: int) -> list[int]:
    return [int(x) for x in np.random.default_rng([seed, PROMPT_SEED]).integers(0, vocab, n)]


def decode(step, prompt_ids: list[int], tokens: list[int], steps: int):
    """Yield (t, last-position logits float64) for t in 0..steps-1, teacher-forced: step t > 0 feeds
    tokens[t - 1] (the caller may append to `tokens` between steps: the reference's greedy choice).
    `step(ids, past, past_len)` -> (logits [vocab], new past)."""
    past, ids, n = None, list(prompt_ids), 0
    for t in range(steps):
        logits, past = step(ids, past, n)
        n += len(ids)
        yield t, logits
        if t + 1 < steps:
            ids = [tokens[t]]


def torch_step(lm):
    """A decode step on torch (DecoderStep, the model's own cache)."""
    step, empty = decoder.DecoderStep(lm), decoder.empty_past(lm)

    def run(ids, past, n):
        with torch.no_grad():
            out = step(*decoder.feeds(ids, n), *(empty if past is None else past))
        return out[0][0, -1].double().numpy(), list(out[1:])
    return run


def ort_feeds(ids: list[int], past, n: int, info: dict) -> dict:
    """decoder.onnx's inputs for a step feeding `ids` after `n` cached tokens (past None: empty)."""
    s, names = len(ids), past_names(int(info["n_layers"]))
    if past is None:
        past = [np.zeros((1, info["kv_heads"], 0, info["head_dim"]), np.float32)] * len(names)
    return {"input_ids": np.asarray(ids, np.int64).reshape(1, s), "attention_mask": np.ones((1, n + s), np.int64),
            "position_ids": np.arange(n, n + s, dtype=np.int64).reshape(1, s), **dict(zip(names, past))}


def ort_step(sess, info: dict):
    """A decode step on an onnxruntime session of decoder.onnx (past/present as float32 numpy)."""
    outs = [LOGITS, *present_names(int(info["n_layers"]))]

    def run(ids, past, n):
        res = sess.run(outs, ort_feeds(ids, past, n, info))
        return res[0][0, -1].astype(np.float64), res[1:]
    return run


def _top2(x: np.ndarray) -> tuple[int, float]:
    """(argmax, top-1 minus top-2 value)."""
    i = int(np.argmax(x))
    rest = np.delete(x, i)
    return i, float(x[i] - rest.max()) if rest.size else math.inf


def reference(lm, prompt_ids: list[int], steps: int, gold: np.ndarray) -> tuple[list[int], list[float]]:
    """The fp64 greedy run: fills `gold` (steps x vocab) row by row; (tokens, top-1 margins)."""
    tokens, margins = [], []
    for t, logits in decode(torch_step(lm), prompt_ids, tokens, steps):
        gold[t] = logits
        tok, margin = _top2(logits)
        tokens.append(tok)
        margins.append(margin)
    return tokens, margins


def compare_run(step, prompt_ids, tokens, gold: np.ndarray) -> list[dict]:
    """A teacher-forced run against the golden logits: per step its Sq (oracle sums), top-1, max_abs."""
    rows = []
    for t, logits in decode(step, prompt_ids, tokens, len(tokens)):
        g = gold[t]
        sq = oracle.Sq().add(logits, g)
        rows.append({"sq": sq, "top1": int(np.argmax(logits)),
                     "max_abs": float(np.max(np.abs(logits - g))) if np.all(np.isfinite(logits)) else math.inf})
    return rows


def step_rows(prov: list[dict], base: list[dict], tokens, margins, dtype_cfg: dict) -> list[dict]:
    """The per-step records of a cell (values only, JSON-safe)."""
    u, k, slack = oracle.limits(dtype_cfg)
    out = []
    for t, (pv, bv) in enumerate(zip(prov, base)):
        j = oracle.judge(pv["sq"], bv["sq"], u, k, slack)
        rel = math.sqrt(pv["sq"].err / pv["sq"].ref) if pv["sq"].ref else 0.0
        out.append({"step": t, "token_ref": tokens[t], "token": pv["top1"], "token_baseline": bv["top1"],
                    "agree": pv["top1"] == tokens[t], "margin_ref": margins[t], "max_abs": pv["max_abs"],
                    "rel_l2": rel, "err_rmse": j["err_rmse"], "floor_rmse": j["floor_rmse"],
                    "excess": j["excess"], "limit": k, "passed": j["passed"]})
    return out


def _unsupported(p: dict, dtype: str, provider: str) -> str | None:
    """Why generate@ does not run this provider/dtype, or None."""
    pc, dc = p["providers"][provider], p["dtypes"][dtype]
    if pc.get("runner") not in SIDES:
        return (f"generation runs on the torch_cpu and ort_cpu runners ({', '.join(SIDES)}); "
                f"providers.{provider}.runner is {pc.get('runner')}")
    if dtype not in (pc.get("dtypes") or []):
        return f"providers.{provider}.dtypes does not list {dtype}"
    if schema.of(p).dtypes[dtype].mode != "cast" or dc.get("torch") not in ("float32", "float16", "bfloat16"):
        return f"dtypes.{dtype}: generation compares cast dtypes (mode: cast) only"
    return None


def _ort_runner(p: dict, model: str, dtype: str, provider: str, export_dir: Path):
    """(runner, None) for an ORT provider, or (None, (status, reason))."""
    pc = p["providers"][provider]
    job = CaptureJob(model=model, model_cfg=p["models"][model], dtype=dtype, dtype_cfg=p["dtypes"][dtype],
                     provider=provider, provider_cfg=pc, model_dir=export_dir, seed=int(schema.of(p).seed),
                     threads=int(schema.of(p).capture.threads))
    cls = OrtCpuRunner
    why = cls.availability(job)
    if why:
        return None, (Status.UNAVAILABLE.value, why)
    spec = (pc.get("options") or {}).get("fault")
    if spec:
        m = onnx.load(str(export_dir / "decoder.onnx"), load_external_data=False)
        spec = resolve_fault(m, spec)
        try:
            fault.check(m, spec, f"providers.{provider}.options.fault")
        except ValueError as e:
            return None, (Status.EXPORT_FAIL.value, str(e))
        job.provider_cfg = {**pc, "options": {**pc["options"], "fault": spec}}
    return cls(job), None


def resolve_fault(m, spec: dict) -> dict:
    """options.fault (parity.backends.fault) with `node` a module path as users name it
    (`model.layers.1.mlp.down_proj`) replaced by the node that module's weight feeds in the decoder
    graph (the first node in its name_scopes reading a floating initializer); decoder.onnx and
    decoder_layers.onnx share node names (one is pruned from the other), so the same fault hits both.
    A node or tensor name is kept as it is."""
    target = str(spec["node"])
    if fault.find(m, target) is not None:
        return spec
    floats = {t.name for t in m.graph.initializer if t.data_type in (1, 10, 11)}  # FLOAT, FLOAT16, DOUBLE
    for n in m.graph.node:
        if any(i in floats for i in list(n.input)[1:]) and any(s.endswith("." + target) for s in scopes(n)):
            return {**spec, "node": n.name}
    return spec


def session(runner, path: Path):
    """An onnxruntime session on `path` as the provider runs it (dtype conversion, fault, session
    options): the ORT runner's own session builder (OrtRunner._session), called here rather than
    through a new public method so the capture stages' code (parity/backends) stays as it is."""
    return runner._session(path)


def leaf_values(lm, prefix: list[int]) -> dict:
    """Every leaf module's output (float64 numpy, execution order) on `prefix`, no cache."""
    rec = decoder.record(lm)
    with torch.no_grad():
        out = rec(*decoder.feeds(prefix, 0), *decoder.empty_past(lm))
    n = 1 + 2 * int(lm.config.num_hidden_layers)
    return {name: t.double().numpy() for name, t in zip(decoder.layer_names(rec, n), out[n:])}


def drift_origin(p: dict, model: str, dtype: str, side: str, runner, export_dir: Path, info: dict,
                 prefix: list[int]) -> dict:
    """Per-layer oracle on the full prefix (no cache): fp64, baseline and provider leaf outputs; the
    first leaf over the limit in execution order is the origin."""
    dc = p["dtypes"][dtype]
    lm = build_lm(p["models"][model], int(schema.of(p).seed)).double()
    gold = leaf_values(lm, prefix)
    lm = lm.to(getattr(torch, dc["torch"]))
    floors = {n: oracle.Sq().add(v, gold[n]) for n, v in leaf_values(lm, prefix).items() if n in gold}
    del lm
    if side == "torch":
        sqs = floors
    else:
        names = [n for n in info["layers"] if n in gold]
        sess = session(runner, export_dir / "decoder_layers.onnx")
        values = sess.run(names, ort_feeds(prefix, None, 0, info))
        sqs = {n: oracle.Sq().add(v, gold[n]) for n, v in zip(names, values)}
    u, k, slack = oracle.limits(dc)
    rows = []
    for n, sq in sqs.items():
        j = oracle.judge(sq, floors[n], u, k, slack)
        rows.append({"name": n, "err_rmse": j["err_rmse"], "floor_rmse": j["floor_rmse"], "excess": j["excess"],
                     "rel_l2": math.sqrt(sq.err / sq.ref) if sq.ref else 0.0, "passed": j["passed"]})
    origin = next((r["name"] for r in rows if not r["passed"]), None)
    return {"prefix_len": len(prefix), "origin": origin, "layers": rows}


def reference_io(lm, prefix: list[int]) -> tuple[dict, dict]:
    """({leaf: output}, {leaf: first floating input}) of every leaf call on `prefix`, no cache (float64
    numpy, execution order; the first holds the logits and present values too): the fp64 reference's
    values and the inputs the own-error test feeds."""
    rec = LayerRecorder(decoder.DecoderStep(lm), inputs=True)
    with torch.no_grad():
        out = rec(*decoder.feeds(prefix, 0), *decoder.empty_past(lm))
    n, pre = 1 + 2 * int(lm.config.num_hidden_layers), {}
    gold = {name: t.double().numpy() for name, t in zip([LOGITS, *present_names(n // 2)], out[:n])}
    for name, t in zip(rec.names[n:], out[n:]):
        if name.startswith(store.PRE):
            pre[name[len(store.PRE):].removeprefix(decoder.LM + ".")] = t.double().numpy()
        else:
            gold[name.removeprefix(decoder.LM + ".")] = t.double().numpy()
    rec.remove_hooks()
    return gold, pre


def own_torch(lm, prefix: list[int], pre: dict) -> dict:
    """Every leaf of `lm` (at its dtype) run on the reference's input to it (`pre`, float64, cast to the
    dtype): {leaf: output float64}, as the torch runners' own-error pass computes it."""
    rec = LayerRecorder(decoder.DecoderStep(lm))
    rec.enable_pre_hooks()
    dt = next(lm.parameters()).dtype
    rec.feed_inputs = {f"{decoder.LM}.{k}": torch.from_numpy(v).to(dt) for k, v in pre.items()}
    with torch.no_grad():
        out = rec(*decoder.feeds(prefix, 0), *decoder.empty_past(lm))
    n = 1 + 2 * int(lm.config.num_hidden_layers)
    vals = {name.removeprefix(decoder.LM + "."): t.double().numpy() for name, t in zip(rec.names[n:], out[n:])}
    rec.remove_hooks()
    return vals


def own_ort(runner, export_dir: Path, info: dict, prefix: list[int], gold: dict, pre: dict) -> dict:
    """The provider's own values on `prefix`: decoder_layers.onnx cut at every leaf (parity.models.onnx_cut,
    as the capture's own-error pass: OrtCpuRunner.infer_own), each leaf fed the reference's input."""
    runner.own_source = onnx_weights.load_graph(export_dir / "decoder_layers.onnx")
    runner.own = None
    ref = {**gold, **{store.PRE + k: v for k, v in pre.items()}}
    got = runner.infer_own(ort_feeds(prefix, None, 0, info), ref)
    runner.own = runner.own_source = None
    return {n: np.asarray(v, np.float64) for n, v in got if n in gold}


def own_check(p: dict, model: str, dtype: str, side: str, runner, export_dir: Path, info: dict,
              prefix: list[int]) -> dict:
    """The per-layer cells' own-error test at one step's prefix (no cache): every leaf re-run on the fp64
    reference's input to it, on the provider and on the trusted baseline at the cell's dtype, judged by
    the oracle against the leaf's fp64 output (a leaf whose own error is beyond k times the baseline's
    fails, however small its effect on the logits). {prefix_len, origin: the first failing leaf, layers}."""
    dc = p["dtypes"][dtype]
    lm = build_lm(p["models"][model], int(schema.of(p).seed)).double()
    gold, pre = reference_io(lm, prefix)
    lm = lm.to(getattr(torch, dc["torch"]))
    floors = own_torch(lm, prefix, pre)
    del lm
    values = floors if side == "torch" else own_ort(runner, export_dir, info, prefix, gold, pre)
    u, k, slack = oracle.limits(dc)
    rows = []
    for n in [n for n in info["layers"] if n in values and n in floors and n in gold]:
        sq, fl = oracle.Sq().add(values[n], gold[n]), oracle.Sq().add(floors[n], gold[n])
        j = oracle.judge(sq, fl, u, k, slack)
        rows.append({"name": n, "err_rmse": j["err_rmse"], "floor_rmse": j["floor_rmse"], "excess": j["excess"],
                     "rel_l2": math.sqrt(sq.err / sq.ref) if sq.ref else 0.0, "passed": j["passed"]})
    origin = next((r["name"] for r in rows if not r["passed"]), None)
    return {"prefix_len": len(prefix), "kind": "own", "origin": origin, "layers": rows,
            "worst_excess": max((r["excess"] for r in rows), default=None)}


def own_steps(first: int | None, steps: int, every: int) -> list[int]:
    """The steps the own-error test runs at: 0 (the prompt), the first whose logits fail, and with
    generate.own_every = k > 0 every k-th step below `steps` too."""
    return sorted({0, *([first] if first else []), *(range(every, steps, every) if every else ())})


def judge_own(rows: list[dict], step: int, own: dict) -> None:
    """Step `step`'s record takes the own-error test's result: it fails when a leaf's own error fails."""
    r = rows[step]
    r["own_worst_excess"], r["own_failed"] = own["worst_excess"], [x["name"] for x in own["layers"] if not x["passed"]]
    r["passed"] = bool(r["passed"] and not r["own_failed"])


def torch_cache_step(lm):
    """A decode step on torch recording every value: ({present.<i>.key/value and every leaf: float64},
    new past); `run.close()` detaches the recorder."""
    empty, rec = decoder.empty_past(lm), decoder.record(lm)
    n = 1 + 2 * int(lm.config.num_hidden_layers)

    def run(ids, past, p):
        with torch.no_grad():
            out = rec(*decoder.feeds(ids, p), *(empty if past is None else past))
        names = [*present_names(n // 2), *decoder.layer_names(rec, n)]
        return {k: t.double().numpy() for k, t in zip(names, out[1:])}, list(out[1:n])
    run.close = rec.remove_hooks
    return run


def ort_cache_step(sess, info: dict):
    """A decode step on a session of decoder_layers.onnx with its own cache, recording every value."""
    n = int(info["n_layers"])
    names = [*present_names(n), *info["layers"]]

    def run(ids, past, p):
        res = sess.run([LOGITS, *names], ort_feeds(ids, past, p, info))
        return {k: np.asarray(v, np.float64) for k, v in zip(names, res[1:])}, res[1:1 + 2 * n]
    return run


def _cache_sqs(step, ids: list[int], tokens: list[int], steps: int, gold: Path) -> list[dict]:
    """Per step {value: Sq against the reference's values of that step (gold/<t>.npz)}."""
    out = []
    for t, values in decode(step, ids, tokens, steps):
        with np.load(gold / f"{t}.npz") as g:
            out.append({n: oracle.Sq().add(v, g[n]) for n, v in values.items() if n in g.files})
    return out


def cache_rows(p: dict, model: str, dtype: str, side: str, runner, export_dir: Path, info: dict,
               ids: list[int], tokens: list[int], last: int) -> tuple[list[list[dict]], list[str]]:
    """Steps 0..last decoded again with the cache on fp64, the baseline and the provider
    (decoder_layers.onnx fed its own present as the next past), every leaf and every present.<i>.key/value
    (a value of layer i: decoder.cache_order) judged by the oracle at every step: (per step its rows in
    execution order, the decoder layers' names)."""
    dc = p["dtypes"][dtype]
    lm = build_lm(p["models"][model], int(schema.of(p).seed)).double()
    blocks = decoder.block_names(lm)
    order = decoder.cache_order(list(info["layers"]), blocks)
    with tempfile.TemporaryDirectory() as tmp:
        gold, step = Path(tmp), torch_cache_step(lm)
        for t, values in decode(step, ids, tokens, last + 1):
            np.savez(gold / f"{t}.npz", **values)
        step.close()
        step = torch_cache_step(lm.to(getattr(torch, dc["torch"])))
        floors = _cache_sqs(step, ids, tokens, last + 1, gold)
        step.close()
        del lm
        sqs = floors if side == "torch" else _cache_sqs(
            ort_cache_step(session(runner, export_dir / "decoder_layers.onnx"), info), ids, tokens, last + 1, gold)
    u, k, slack = oracle.limits(dc)
    steps = []
    for sq_t, fl_t in zip(sqs, floors):
        rows = []
        for n in [n for n in order if n in sq_t and n in fl_t]:
            j = oracle.judge(sq_t[n], fl_t[n], u, k, slack)
            rows.append({"name": n, "err_rmse": j["err_rmse"], "floor_rmse": j["floor_rmse"], "excess": j["excess"],
                         "rel_l2": math.sqrt(sq_t[n].err / sq_t[n].ref) if sq_t[n].ref else 0.0, "passed": j["passed"]})
        steps.append(rows)
    return steps, blocks


def judge_cache(rows: list[dict], steps: list[list[dict]]) -> None:
    """Step 1 (the first to read a cache) takes the cache test's result (steps 0 and 1 with the cache):
    it fails when a value fails there, a present written at step 0 or a leaf of step 1 (a key cache
    rounded to fp16 moves the logits less than the limit: tiny_llama's present.0.key, excess 3.7 < 4)."""
    r = rows[1]
    r["cache_failed"] = list(dict.fromkeys(x["name"] for rs in steps[:2] for x in rs if not x["passed"]))
    r["cache_worst_excess"] = max((x["excess"] for rs in steps[:2] for x in rs), default=None)
    r["passed"] = bool(r["passed"] and not r["cache_failed"])


def cache_origin(steps: list[list[dict]], blocks: list[str], prompt_len: int, k: float, prefix: dict) -> dict:
    """The cache search's result from its per-step rows: origin (a leaf, or `<layer> cache (present.<i>.<kv>)`),
    the step it fails at (`cache_step`), the cause (it says "cache") and that step's rows."""
    first = next(((t, r) for t, rows in enumerate(steps) for r in rows if not r["passed"]), None)
    past = lambda t: 0 if t == 0 else prompt_len + t - 1  # noqa: E731  (tokens cached before step t)
    worst = max((r["excess"] for r in prefix.get("layers") or []), default=None)
    without = (f"the re-run of the prefix without the cache passes every leaf"
               + (f" (worst excess {worst:.3g})" if worst is not None else ""))
    res = {"kind": "cache", "prefix_len": prefix.get("prefix_len"), "prefix_worst_excess": worst,
           "cache_steps": [{"step": t, "past_len": past(t), "failed": [r["name"] for r in rows if not r["passed"]],
                            "worst_excess": max((r["excess"] for r in rows), default=None)}
                           for t, rows in enumerate(steps)]}
    if first is None:
        return {**res, "origin": None, "cache_step": None, "layers": steps[-1] if steps else [],
                "cause": f"cache: every leaf and cache value passes with the cache at every step, and {without}"}
    t, r = first
    nums = f"excess {r['excess']:.3g} > k = {k:g}, rel_l2 {r['rel_l2']:.3g}"
    if r["name"].startswith("present."):
        i, kv = r["name"].split(".")[1:]
        module = blocks[int(i)]
        origin = f"{module} cache ({r['name']})"
        cause = (f"cache: the {kv} cache {module} writes ({r['name']}) is off from fp64 from step {t} ({nums}) "
                 f"while every leaf output of that step passes; step {t + 1} reads it; {without}")
    else:
        origin = r["name"]
        cause = (f"cache: {r['name']} fails at step {t} run with the cache ({past(t)} cached tokens; {nums}) "
                 f"while {without}: the fault is on the cached path (how the cache is read)"
                 if t else f"{r['name']} fails at the prompt's prefill ({nums})")
    return {**res, "origin": origin, "cache_step": t, "cause": cause, "layers": steps[t]}


def locate(p: dict, model: str, dtype: str, side: str, runner, export_dir: Path, info: dict, ids: list[int],
           tokens: list[int], fail: int, own: dict | None, cached=None) -> dict:
    """The drift origin at the first failing step `fail`: the first leaf whose own error fails (kind own),
    else the first leaf over the limit on the prefix re-run without the cache (kind accumulated), else
    the first leaf or present value over the limit on the steps re-run with the cache (kind cache;
    `cached`: cache_rows' result through step 1, reused when it covers the failing step)."""
    if own and own["origin"]:
        r = next(r for r in own["layers"] if r["name"] == own["origin"])
        return {"step": fail, **own, "cause": f"own error: {own['origin']} re-run on the fp64 reference's input "
                f"to it (prefix of {own['prefix_len']} tokens, no cache) fails (excess {r['excess']:.3g})"}
    found = drift_origin(p, model, dtype, side, runner, export_dir, info, ids + tokens[:fail])
    if found["origin"] is not None:
        r = next(r for r in found["layers"] if r["name"] == found["origin"])
        return {"step": fail, "kind": "accumulated", **found, "cause": f"accumulated: {found['origin']} is the first "
                f"leaf over the limit on the prefix of {found['prefix_len']} tokens re-run without the cache "
                f"(excess {r['excess']:.3g}), no leaf's own error failing"}
    steps, blocks = cached if cached and len(cached[0]) > fail else cache_rows(
        p, model, dtype, side, runner, export_dir, info, ids, tokens, fail)
    return {"step": fail, **cache_origin(steps[:fail + 1], blocks, len(ids), oracle.limits(p["dtypes"][dtype])[1], found)}


def run_cell(p: dict, model: str, dtype: str, provider: str, export_dir: Path) -> dict:
    """One generate@ cell: status, per-step records, first divergence / failure, drift origin."""
    c = schema.of(p)
    steps, plen, seed = int(c.generate.steps), int(c.generate.prompt_len), int(c.seed)
    res = {"model": model, "dtype": dtype, "provider": provider, "steps": steps, "prompt_len": plen}
    why = _unsupported(p, dtype, provider)
    if why:
        return {**res, "status": Status.UNSUPPORTED.value, "reason": why, "verdict": Status.UNSUPPORTED.value}
    side, runner = SIDES[p["providers"][provider]["runner"]], None
    if side == "ort":
        runner, bad = _ort_runner(p, model, dtype, provider, export_dir)
        if bad:
            return {**res, "status": bad[0], "reason": bad[1], "verdict": bad[0]}

    threads = int(c.capture.threads)
    if threads:
        torch.set_num_threads(threads)

    info = read_json(export_dir / "decoder.json")
    lm = build_lm(p["models"][model], seed)
    ids, decode_text = prompt_ids(p, model, int(lm.config.vocab_size))
    res["prompt_len"] = len(ids)
    with tempfile.TemporaryDirectory() as tmp:
        gold = np.lib.format.open_memmap(Path(tmp) / "gold.npy", mode="w+", dtype=np.float64,
                                         shape=(steps, int(lm.config.vocab_size)))
        tokens, margins = reference(lm.double(), ids, steps, gold)
        lm = lm.to(getattr(torch, p["dtypes"][dtype]["torch"]))
        base = compare_run(torch_step(lm), ids, tokens, gold)
        del lm
        try:
            prov = base if side == "torch" else compare_run(
                ort_step(session(runner, export_dir / "decoder.onnx"), info), ids, tokens, gold)
        except Exception as e:  # a backend failure is a result
            return {**res, "status": Status.INFER_FAIL.value, "reason": f"{type(e).__name__}: {e}",
                    "verdict": Status.INFER_FAIL.value}
        finally:
            del gold
    rows = step_rows(prov, base, tokens, margins, p["dtypes"][dtype])
    first = next((r["step"] for r in rows if not r["passed"]), None)
    own = {t: own_check(p, model, dtype, side, runner, export_dir, info, ids + tokens[:t])
           for t in own_steps(first, steps, int(c.generate.own_every))}
    for t, o in own.items():
        judge_own(rows, t, o)
    cached = None  # the cache test: steps 0 and 1 with the cache on the provider (the torch side is the baseline)
    if side == "ort" and steps > 1:
        cached = cache_rows(p, model, dtype, side, runner, export_dir, info, ids, tokens, 1)
        judge_cache(rows, cached[0])
    fail = next((r["step"] for r in rows if not r["passed"]), None)
    div = next((r["step"] for r in rows if not r["agree"]), None)
    res.update(status=Status.OK.value, reason="", verdict=decide({"status": Status.OK}, {"passed": fail is None}).status.value,
               provider_is_baseline=side == "torch", prompt=ids, tokens_ref=tokens, agreement=sum(r["agree"] for r in rows),
               first_divergence=div, first_fail=fail, worst_excess=max(r["excess"] for r in rows), steps_detail=rows, origin=None)
    if decode_text is not None:  # the text of each side: the provider's top-1 at each step, on the reference's prefix
        res["text"] = {"prompt": decode_text(ids), "reference": decode_text(tokens),
                       "provider": decode_text([r["token"] for r in rows])}
    res["own"] = {str(t): {k: o[k] for k in ("prefix_len", "origin", "worst_excess")} for t, o in own.items()}
    if fail is not None:  # own error, else the prefix without the cache, else the steps with it
        res["origin"] = locate(p, model, dtype, side, runner, export_dir, info, ids, tokens, fail, own.get(fail),
                               cached)
    return res
