"""Issue 34 items 1-2: trained checkpoints as models and real text inputs, on the real pipeline.

- `arch: {source: hf, path: <dir>}`: a Hugging Face checkpoint folder that transformers' own
  `save_pretrained` wrote in the test (a tiny Llama in bf16, sharded; a tiny Qwen2 with tied
  embeddings; a tiny BERT in fp32), loaded by `from_pretrained` (fp32), fed real prompts tokenised by
  the checkpoint's own tokenizer (built here with the `tokenizers` library, saved by
  PreTrainedTokenizerFast.save_pretrained).
- `arch.weights: <file>`: a torch model's trained state dict (.safetensors, .pt) replaces the seeded
  init; a file that does not fit fails the export in one line listing the bad keys.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import BIN, composed, config_error, make_repo, run
from parity.core import store

WORDS = ("the a cat dog sat on mat ran fast slow big small red blue green tree house river sun moon "
         "over under and of to in it is was").split()
# the tokenizers' vocabulary: every id of the checkpoints' 64 has a token (generated text decodes whole)
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "<s>", "</s>", *WORDS]
VOCAB += [f"w{i}" for i in range(len(VOCAB), 64)]


def save_tokenizer(folder: Path, style: str = "bert", padding_side: str = "right", pad: bool = True) -> dict:
    """A WordLevel tokenizer over WORDS saved as tokenizer.json (+ tokenizer_config.json) by
    PreTrainedTokenizerFast.save_pretrained; `style` bert: [CLS] a [SEP] b [SEP] with token type ids,
    llama: <s> a. Returns the vocabulary."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    from parity.models.hf import load

    vocab = {t: i for i, t in enumerate(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if style == "bert":
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
        special = {"cls_token": "[CLS]", "sep_token": "[SEP]"}
    else:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 4)])
        special = {"bos_token": "<s>", "eos_token": "</s>"}
    fast = load().PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", padding_side=padding_side,
                                          **({"pad_token": "[PAD]"} if pad else {}), **special)
    fast.save_pretrained(str(folder))
    return vocab


def save_checkpoint(folder: Path, kind: str, dtype: str = "float32", shard: str | None = None, seed: int = 5):
    """A tiny trained-looking checkpoint of `kind` (llama | qwen2 | bert) saved by save_pretrained, its
    weights drawn from `seed` (not parity's seeded init: the test can tell them apart)."""
    import torch

    from parity.models.hf import load

    tf = load()
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=64)
    if kind == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**common, num_key_value_heads=2, pad_token_id=0))
    elif kind == "qwen2":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**common, num_key_value_heads=2, tie_word_embeddings=True))
    else:
        model = tf.BertModel(tf.BertConfig(**common, type_vocab_size=2))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in model.parameters():
            t.copy_(torch.randn(t.shape, generator=gen) * 0.2)
    model.to(getattr(torch, dtype)).save_pretrained(str(folder), **({"max_shard_size": shard} if shard else {}))
    return model


LLAMA = """\
ck_llama:
  arch: {source: hf, path: models/ck_llama, head: causal_lm}
  input:
    - {name: input_ids, shape: [1, 12], dtype: int64, init: text, path: data/inputs/prompts.txt}
    - {name: attention_mask, shape: [1, 12], dtype: int64, init: text, key: attention_mask}
  tolerances: []
"""
QWEN2 = """\
ck_qwen2:
  arch: {source: hf, path: models/ck_qwen2, head: causal_lm}
  input:
    - {name: input_ids, shape: [2, 10], dtype: int64, init: text,
       prompts: ["the big red dog ran over the river", "a cat", "sun and moon"]}
    - {name: attention_mask, shape: [2, 10], dtype: int64, init: text, key: attention_mask,
       prompts: ["the big red dog ran over the river", "a cat", "sun and moon"]}
  tolerances: []
"""
BERT = """\
ck_bert:
  arch: {source: hf, path: models/ck_bert}
  input:
    - {name: input_ids, shape: [1, 16], dtype: int64, init: text, path: data/inputs/prompts.txt}
    - {name: attention_mask, shape: [1, 16], dtype: int64, init: text, key: attention_mask}
    - {name: token_type_ids, shape: [1, 16], dtype: int64, init: text, key: token_type_ids}
  tolerances: []
"""
PROMPTS = "the cat sat on the mat\n\na big green tree was over the house and the river in the sun\nmoon\n"


def _json(repo, rel):
    return json.loads((repo.path / rel).read_text())


def _checkpoint_repo(tmp_path, models: dict, dtypes=("fp32",), providers=("ort_cpu",)):
    """A repo holding each (name -> (kind, dtype, shard, tokenizer style, padding side)) checkpoint
    under models/<name>, its conf file, and data/inputs/prompts.txt."""
    confs = {"ck_llama": LLAMA, "ck_qwen2": QWEN2, "ck_bert": BERT}
    r = make_repo(tmp_path / "repo", models=tuple(models), dtypes=dtypes, providers=providers, compose=False)
    for name, (kind, dtype, shard, style, side) in models.items():
        save_checkpoint(r.path / "models" / name, kind, dtype, shard)
        save_tokenizer(r.path / "models" / name, style, side)
        (r.path / f"conf/models/{name}.yaml").write_text(confs[name])
    (r.path / "data/inputs/prompts.txt").write_text(PROMPTS)
    r.commit("checkpoints")
    return r


def _transformers_reference(folder: Path, head: str, feeds: list[dict], names: list[str]):
    """What transformers itself computes for the checkpoint on the pipeline's input arrays (fp32)."""
    import torch

    from parity.models.hf import load

    tf = load()
    cls = tf.AutoModelForCausalLM if head == "causal_lm" else tf.AutoModel
    model = cls.from_pretrained(str(folder), dtype=torch.float32, local_files_only=True).eval()
    with torch.no_grad():
        out = [model(**{n: torch.from_numpy(f[n].copy()) for n in names}) for f in feeds]
    return [(o.logits if head == "causal_lm" else o.last_hidden_state).numpy() for o in out]


def _tokenised(folder: Path, prompts: list[str], length: int, pad_token: str | None = None,
               side: str = "right") -> dict:
    """transformers' own tokenisation of `prompts` by the fast tokenizer the folder holds (its
    tokenizer.json and tokenizer_config.json). PreTrainedTokenizerFast, not AutoTokenizer: for a
    config.json of model type qwen2, transformers 5's AutoTokenizer picks Qwen2Tokenizer, which rebuilds
    a byte-level BPE from the vocabulary (what a real Qwen2 tokenizer.json holds anyway) and would not
    read this test's word-level tokenizer as saved."""
    from parity.models.hf import load

    tok = load().PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)
    if pad_token is not None:
        tok.pad_token = pad_token
    return tok(prompts, padding="max_length", truncation=True, max_length=length, return_token_type_ids=True,
               padding_side=side)


def test_hf_checkpoints_with_text_prompts_run_through_the_pipeline(tmp_path, monkeypatch):
    """A bf16 sharded Llama, a Qwen2 with tied embeddings (inline prompts, a tokenizer that asks for
    left padding) and an fp32 BERT (three text inputs) run as `source: hf, path:` with real prompts: the
    inputs are the checkpoint tokenizer's ids and masks (padded on the right: with left padding the
    fully masked attention rows of the pads differ between torch and ORT, a false alarm), the reference
    is the trained model's output (not parity's seeded init), and every fp32 ort_cpu cell passes."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    models = {"ck_llama": ("llama", "bfloat16", "20KB", "llama", "right"),
              "ck_qwen2": ("qwen2", "float32", None, "llama", "left"),
              "ck_bert": ("bert", "float32", None, "bert", "right")}
    r = _checkpoint_repo(tmp_path, models)
    shards = sorted(p.name for p in (r.path / "models/ck_llama").glob("*.safetensors"))
    assert len(shards) > 1 and (r.path / "models/ck_llama/model.safetensors.index.json").is_file(), shards
    r.exp_run()
    prompts = [ln for ln in PROMPTS.splitlines() if ln.strip()]
    qwen_prompts = ["the big red dog ran over the river", "a cat", "sun and moon"]
    cases = {"ck_llama": (["input_ids", "attention_mask"], prompts[:2], "causal_lm", 1),
             "ck_qwen2": (["input_ids", "attention_mask"], qwen_prompts + qwen_prompts[:1], "causal_lm", 2),
             "ck_bert": (["input_ids", "attention_mask", "token_type_ids"], prompts[:2], "base", 1)}
    for name, (names, used, head, b) in cases.items():
        feeds = {}
        for t in store.read(r.path / f"artifacts/inputs/{name}.parquet"):
            feeds.setdefault(t.sample, {})[t.name] = t.array
        feeds = [feeds[k] for k in sorted(feeds)]
        assert len(feeds) == 2, name  # inputs.samples: 2; sample s holds prompts s*B .. s*B+B-1
        length = feeds[0]["input_ids"].shape[-1]
        want = _tokenised(r.path / "models" / name, used, length)
        for key in names:
            got = np.concatenate([f[key] for f in feeds])
            assert got.dtype == np.int64 and np.array_equal(got, np.array(want[key])), (name, key, got, want[key])
        if name == "ck_qwen2":  # padded on the right although its tokenizer_config.json says left
            assert feeds[0]["attention_mask"][1, 0] == 1 and feeds[0]["attention_mask"][1, -1] == 0
        ref = sorted((t for t in store.read(r.path / f"artifacts/reference/{name}/fp32.parquet")
                      if t.name in ("output", "output:0")), key=lambda t: t.sample)
        expect = _transformers_reference(r.path / "models" / name, head, feeds, names)
        for t, e in zip(ref, expect):
            np.testing.assert_allclose(t.array, e, rtol=1e-4, atol=1e-5, err_msg=name)
        met = _json(r, f"artifacts/diff/{name}-fp32-ort_cpu/metrics.json")
        assert met["status"] == "OK" and met["verdict"] == "PASS" and met["layers"] > 10, (name, met)


MLP_W = """\
w_mlp:
  arch:
    source: parity
    name: mlp
    kwargs: {in_features: 16, hidden: 32, out_features: 8}
    weights: models/mlp.safetensors
  input:
    - {name: input, shape: [4, 16], dtype: float32, init: normal}
  tolerances: []
"""


def _mlp_state(seed: int, out_features: int = 8, dtype=None) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    sd = {"fc1.weight": torch.randn(32, 16, generator=g), "fc1.bias": torch.randn(32, generator=g),
          "fc2.weight": torch.randn(out_features, 32, generator=g), "fc2.bias": torch.randn(out_features, generator=g)}
    return {k: v.to(dtype) for k, v in sd.items()} if dtype is not None else sd


def _mlp_out(sd: dict, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        h = torch.nn.functional.gelu(torch.from_numpy(x.copy()) @ sd["fc1.weight"].float().T + sd["fc1.bias"].float())
        return (h @ sd["fc2.weight"].float().T + sd["fc2.bias"].float()).numpy()


def test_a_weights_file_replaces_the_seeded_init_and_a_wrong_one_is_one_line(tmp_path):
    """parity's mlp with `weights: models/mlp.safetensors` (stored fp16: cast to fp32) computes with those
    weights through the whole pipeline; a .pt file (under 'state_dict') runs the same way; a file with
    other keys and shapes fails the export in one line listing them, and nothing is published."""
    import torch
    from safetensors.torch import save_file

    r = make_repo(tmp_path / "repo", models=("w_mlp",), dtypes=("fp32",), providers=("ort_cpu",), compose=False)
    (r.path / "models").mkdir()
    sd = _mlp_state(3, dtype=torch.float16)
    save_file(sd, str(r.path / "models/mlp.safetensors"))
    (r.path / "conf/models/w_mlp.yaml").write_text(MLP_W)
    r.commit("weights")
    r.exp_run()
    inputs = sorted((t for t in store.read(r.path / "artifacts/inputs/w_mlp.parquet")), key=lambda t: t.sample)
    ref = sorted((t for t in store.read(r.path / "artifacts/reference/w_mlp/fp32.parquet") if t.name == "output"),
                 key=lambda t: t.sample)
    for x, y in zip(inputs, ref):
        np.testing.assert_allclose(y.array, _mlp_out(sd, x.array), rtol=1e-5, atol=1e-5)
    assert _json(r, "artifacts/diff/w_mlp-fp32-ort_cpu/metrics.json")["verdict"] == "PASS"

    torch.save({"state_dict": _mlp_state(4), "epoch": 3}, r.path / "models/mlp.pt")
    r.edit("conf/models/w_mlp.yaml", "models/mlp.safetensors", "models/mlp.pt")
    r.exp_run()
    ref = sorted((t for t in store.read(r.path / "artifacts/reference/w_mlp/fp32.parquet") if t.name == "output"),
                 key=lambda t: t.sample)
    for x, y in zip(inputs, ref):
        np.testing.assert_allclose(y.array, _mlp_out(_mlp_state(4), x.array), rtol=1e-5, atol=1e-5)

    bad = _mlp_state(4, out_features=10)
    bad["head.weight"] = bad.pop("fc2.bias")
    torch.save(bad, r.path / "models/mlp.pt")
    p = r.run(["dvc", "exp", "run"], check=False)
    assert p.returncode != 0
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if "does not fit" in ln]
    assert lines == ["export@w_mlp: models.w_mlp.arch: weights: models/mlp.pt does not fit MLP (4 tensors in the "
                     "model, 4 in the file): 1 missing (fc2.bias); 1 unexpected (head.weight); 1 mis-shaped "
                     "(fc2.weight (file [10, 32], model [8, 32]))"], p.stdout + p.stderr


def test_weights_errors_name_the_file_and_a_torchvision_model_loads_its_state_dict(tmp_path):
    """Unit level, no pipeline: a torchvision model (squeezenet1_1) loads its own state dict from a
    .safetensors and from a .pth (DataParallel's `module.` prefix dropped, BatchNorm counters optional);
    a pickled module, a non-tensor dict and an unknown suffix are refused in one line naming the file."""
    import torch
    from safetensors.torch import save_file

    from parity import models
    from parity.models import weights

    arch = {"source": "torchvision", "name": "mobilenet_v3_small", "kwargs": {"num_classes": 10}}
    torch.manual_seed(11)
    trained = models.construct(arch).eval()
    sd = trained.state_dict()
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "tv.safetensors"))
    torch.save({"model": {f"module.{k}": v for k, v in sd.items() if not k.endswith("num_batches_tracked")}},
               tmp_path / "tv.pth")
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = trained(x)
        for f in ("tv.safetensors", "tv.pth"):
            net = models.build({**arch, "weights": str(tmp_path / f), "calibrate": {"shape": [2, 3, 64, 64]}}, 0)
            assert torch.equal(net(x), want), f  # the trained weights and BN stats, no calibration over them
    torch.save(trained, tmp_path / "obj.pt")
    torch.save({"weights": [1, 2]}, tmp_path / "list.pt")
    for f, msg in (("obj.pt", "cannot be read with torch.load(weights_only=True)"),
                   ("list.pt", "not a state dict: 1 entries are not tensors (weights)"),
                   ("w.bin", "unknown file type '.bin'"), ("none.pt", "no such file")):
        with pytest.raises(weights.WeightsError) as e:
            weights.load_into(trained, tmp_path / f)
        assert msg in str(e.value) and str(tmp_path / f) in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_checkpoint_and_text_config_errors_at_compose(tmp_path, monkeypatch):
    """Compose refuses, in one line naming the key: a checkpoint folder that is missing or has no
    config.json, `name`/`kwargs`/`weights` beside `path`, a weights file that is missing or of another
    type, text inputs without a checkpoint tokenizer, an unknown key, prompts given twice or differently."""
    from parity.config import params as config
    from parity.models import weights

    assert config.WEIGHTS_SUFFIXES == weights.SUFFIXES
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck/config.json").write_text('{"model_type": "llama", "vocab_size": 64}')
    (tmp_path / "ck/tokenizer.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    (tmp_path / "w.pt").write_bytes(b"")
    base = composed("models=[tiny_llama]", "dtypes=[fp32]", "providers=[ort_cpu]")
    text = {"name": "input_ids", "shape": [1, 8], "dtype": "int64", "init": "text", "prompts": ["a b"]}
    bare = {k: v for k, v in text.items() if k != "prompts"}

    def arch(**a):
        def mutate(p):
            p["models"]["tiny_llama"]["arch"] = a
            p["models"]["tiny_llama"]["input"] = [dict(text)]
        return mutate

    def inputs(*specs, a=None):
        def mutate(p):
            p["models"]["tiny_llama"]["arch"] = a or {"source": "hf", "path": "ck", "head": "causal_lm"}
            p["models"]["tiny_llama"]["input"] = list(specs)
        return mutate

    cases = [
        (arch(source="hf", path="nope"), "models.tiny_llama.arch.path: nope: no such folder"),
        (arch(source="hf", path="empty"), "models.tiny_llama.arch.path: empty: no config.json in the folder"),
        (arch(source="hf", path="ck", name="llama"), "models.tiny_llama.arch.name: not with models.tiny_llama.arch.path"),
        (arch(source="hf", path="ck", kwargs={"vocab_size": 3}), "arch.kwargs: vocab_size: not with"),
        (arch(source="hf", path="ck", weights="w.pt"), "models.tiny_llama.arch.weights: not with"),
        (arch(source="parity", name="mlp", weights="w.bin"), "arch.weights: expected a .safetensors/.pt/.pth"),
        (arch(source="parity", name="mlp", weights="gone.pt"), "arch.weights: gone.pt: no such file"),
        (arch(source="parity", name="mlp", path="ck"), "arch.path: only for arch.source: onnx"),
        (arch(source="hf", kwargs={}), "models.tiny_llama.arch: missing key 'name' (or `path:`"),
        (inputs(dict(text), a={"source": "parity", "name": "mlp"}),
         "models.tiny_llama.input[0].init: text is tokenised by the checkpoint's own tokenizer"),
        (inputs({**text, "name": "mask"}), "models.tiny_llama.input[0].key: init text gives the tokenizer's"),
        (inputs({**text, "dtype": "float32"}), "models.tiny_llama.input[0].dtype: init text gives token ids"),
        (inputs({**text, "path": "data/inputs/p.txt"}), "models.tiny_llama.input[0]: give prompts: [...] or path"),
        (inputs({**bare, "path": "p.txt"}), "input[0].path: 'p.txt' is not under data/inputs/"),
        (inputs({**bare, "path": "data/inputs/p.csv"}), "input[0].path: expected a .txt file under data/inputs/"),
        (inputs(bare), "init text needs prompts: [...] or path:"),
        (inputs(text, {**text, "name": "attention_mask", "prompts": ["other"]}),
         "models.tiny_llama.input[1]: its prompts differ from models.tiny_llama.input[0]'s"),
        (inputs(text, {**text, "name": "attention_mask", "shape": [1, 9]}), "input[1].shape: [1, 9] differs"),
        (inputs({**text, "bogus": 1}), "models.tiny_llama.input[0]: unknown key 'bogus'"),
    ]
    for mutate, want in cases:
        msg = config_error(base, mutate)
        assert want in msg and "\n" not in msg, (want, msg)
    (tmp_path / "ck/tokenizer.json").unlink()
    assert "no tokenizer.json in ck" in config_error(base, inputs(dict(text)))
    # init: tokens reads the checkpoint's vocabulary from its config.json
    (tmp_path / "ck/tokenizer.json").write_text("{}")
    tokens = {"name": "input_ids", "shape": [1, 8], "dtype": "int64", "init": "tokens"}
    msg = config_error(base, inputs(tokens, {**bare, "name": "attention_mask"}))
    assert "input[1]: init text needs prompts" in msg, msg  # one text input without prompts, none to inherit
    from parity.config import inputspec

    assert inputspec.vocab_bound({"name": "input_ids", "init": "tokens"}, {"source": "hf", "path": "ck"}) == 64


def test_text_inputs_match_transformers_tokenisation_and_cycle_the_prompts(tmp_path):
    """The inputs stage's tokenisation (the `tokenizers` library on tokenizer.json, no torch) gives what
    transformers' own tokenizer gives at max_length padding (on the right, whatever the tokenizer's
    padding_side) and truncation, and without a pad token; sample s holds prompt s (cycling); a tokenizer whose ids exceed the model's
    vocabulary is refused naming the folder."""
    from parity.config import inputspec
    from parity.pipeline import inputfiles, inputs

    prompts = ["the cat sat on the mat", "a big green tree was over the house and the river in the sun", "moon"]
    for side, pad, style in (("right", True, "bert"), ("left", True, "llama"), ("right", False, "llama")):
        folder = tmp_path / f"{side}{pad}{style}"
        save_tokenizer(folder, style, side, pad)
        (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 64, "eos_token_id": 5}))
        m = {"arch": {"source": "hf", "path": str(folder)},
             "input": [{"name": "input_ids", "shape": [10], "dtype": "int64", "init": "text", "prompts": prompts},
                       {"name": "mask", "shape": [10], "dtype": "int32", "init": "text", "key": "attention_mask"},
                       {"name": "token_type_ids", "shape": [10], "dtype": "int64", "init": "text"}]}
        got = inputfiles.model_samples(inputspec.plan(m, 4), 0, inputs.generate)
        # without a pad token it pads with its EOS token (transformers would refuse to pad: given one here)
        want = _tokenised(folder, prompts + prompts[:1], 10, pad_token=None if pad else "</s>")
        for key, name in (("input_ids", "input_ids"), ("attention_mask", "mask"), ("token_type_ids", "token_type_ids")):
            arr = np.stack([g[name] for g in got])
            assert np.array_equal(arr, np.array(want[key])), (side, pad, key, arr, want[key])
        assert got[0]["mask"].dtype == np.int32
    small = tmp_path / "rightTruebert"
    (small / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 8}))
    with pytest.raises(inputfiles.InputError, match=r"gives token id \d+, outside the model's vocabulary \[0, 8\)"):
        inputfiles.model_samples(inputspec.plan({"arch": {"source": "hf", "path": str(small)}, "input": [
            {"name": "input_ids", "shape": [10], "dtype": "int64", "init": "text", "prompts": prompts}]}), 0,
            inputs.generate)


def test_the_inputs_stage_tokenises_without_torch(tmp_path):
    """Text inputs keep the inputs stage light: tokenising imports tokenizers, not torch or transformers."""
    folder = tmp_path / "ck"
    save_tokenizer(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 64}))
    code = (f"import sys; from parity.pipeline import inputfiles, inputs; from parity.config import inputspec\n"
            f"m = {{'arch': {{'source': 'hf', 'path': {str(folder)!r}}}, 'input': [{{'name': 'input_ids', "
            f"'shape': [1, 8], 'dtype': 'int64', 'init': 'text', 'prompts': ['the cat']}}]}}\n"
            f"s = inputfiles.model_samples(inputspec.plan(m), 0, inputs.generate)\n"
            f"print(s[0]['input_ids'].tolist(), [k for k in ('torch', 'transformers') if k in sys.modules])")
    import sys

    p = run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1])
    assert p.stdout.strip() == "[[2, 6, 8, 3, 0, 0, 0, 0]] []", p.stdout


@pytest.mark.slow
def test_a_dvc_tracked_checkpoint_loads_and_runs(tmp_path, monkeypatch):
    """A checkpoint folder tracked by `dvc add` (the project's cache.type: links into DVC's cache, not
    copies) loads through from_pretrained and runs; an edit of one shard re-runs that model's stages
    and no other model's."""
    from safetensors.torch import load_file, save_file

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = make_repo(tmp_path / "repo", models=("ck_llama", "tiny_mlp"), dtypes=("fp32",), providers=("ort_cpu",),
                  compose=False)
    save_checkpoint(r.path / "models/ck_llama", "llama", "bfloat16", "20KB")
    save_tokenizer(r.path / "models/ck_llama", "llama")
    (r.path / "conf/models/ck_llama.yaml").write_text(LLAMA)
    (r.path / "data/inputs/prompts.txt").write_text(PROMPTS)
    r.run([f"{BIN}/parity", "compose"])  # dvc add reads dvc.yaml, whose matrices read params.yaml
    r.run(["dvc", "add", "models/ck_llama"])
    r.commit("dvc-tracked checkpoint")
    shard = sorted((r.path / "models/ck_llama").glob("*.safetensors"))[0]
    cache_type = r.run(["dvc", "config", "cache.type"], check=False).stdout.strip()
    links = shard.stat().st_nlink
    t0 = time.perf_counter()
    r.exp_run()
    print(f"dvc-tracked checkpoint: cache.type {cache_type!r}, {shard.name} has {links} links; "
          f"first exp run {time.perf_counter() - t0:.1f}s")
    assert links == 2 or shard.is_symlink(), (cache_type, links)  # a link into DVC's cache, not a copy
    assert _json(r, "artifacts/diff/ck_llama-fp32-ort_cpu/metrics.json")["verdict"] == "PASS"

    r.run(["dvc", "unprotect", "models/ck_llama"])  # DVC's way to edit a linked file (else the cache changes too)
    sd = load_file(str(shard))
    key = sorted(sd)[0]
    sd[key] = sd[key] * 1.5
    save_file(sd, str(shard), metadata={"format": "pt"})
    t0 = time.perf_counter()
    ran = r.repro()
    print(f"one shard edited: {time.perf_counter() - t0:.1f}s, ran {ran}")
    assert any(s.startswith("export@ck_llama") for s in ran), ran
    assert not any("tiny_mlp" in s for s in ran), ran


def test_generation_takes_a_text_prompt_and_prints_both_sides_text(tmp_path, monkeypatch):
    """generate.prompt on a checkpoint folder: tokenised by its tokenizer.json (special tokens as it adds
    them), greedy decoding from the checkpoint's trained weights, and the decoded text of the reference
    and of the provider printed by the stage and kept in steps.json; compose refuses a prompt for a
    model without a tokenizer."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = make_repo(tmp_path / "repo", models=("ck_llama",), dtypes=("fp32",), providers=("ort_cpu",), compose=False)
    save_checkpoint(r.path / "models/ck_llama", "llama", "float32")
    save_tokenizer(r.path / "models/ck_llama", "llama")
    (r.path / "conf/models/ck_llama.yaml").write_text(LLAMA)
    (r.path / "data/inputs/prompts.txt").write_text(PROMPTS)
    r.edit("conf/config.yaml", "  models: []               # dvc exp run -S 'generate.models=[gpt2_small]'",
           "  models: [ck_llama]")
    r.edit("conf/config.yaml", "  providers: [torch_cpu, ort_cpu]\n  steps: 32 ", "  providers: [ort_cpu]\n  steps: 4 ")
    r.edit("conf/config.yaml", "  prompt: null ", "  prompt: 'the cat sat on the' ")
    r.run([f"{BIN}/parity", "compose"])
    r.commit("generate with a prompt")
    out = r.run(["dvc", "repro", "generate@ck_llama-fp32-ort_cpu"]).stdout
    steps = json.loads((r.path / "artifacts/generate/ck_llama-fp32-ort_cpu/steps.json").read_text())
    words = VOCAB
    assert steps["prompt"] == [4, *(words.index(w) for w in "the cat sat on the".split())], steps["prompt"]
    assert steps["status"] == "OK" and steps["verdict"] == "PASS", steps
    text = steps["text"]
    assert text["prompt"] == "<s> the cat sat on the"
    assert text["reference"] == " ".join(words[t] for t in steps["tokens_ref"])
    for line in (f"generate@ck_llama-fp32-ort_cpu: prompt    {text['prompt']!r}",
                 f"generate@ck_llama-fp32-ort_cpu: reference {text['reference']!r} (torch fp64, greedy)",
                 f"generate@ck_llama-fp32-ort_cpu: ort_cpu   {text['provider']!r}"):
        assert line in out, out
    assert "generate.prompt: models.tiny_llama has no tokenizer" in config_error(
        composed("models=[tiny_llama]", "generate.models=[tiny_llama]"), lambda p: p["generate"].update(prompt="hi"))
