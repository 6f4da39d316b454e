"""Load and validate params.yaml (the composed Hydra config). Light: yaml only, never torch.

Every stage calls `load()` first, so a bad config fails before anything is written; the Hydra
plugin (hydra_plugins/parity_conf) calls `validate()` at compose time, so `dvc exp run -S ...`
fails before any stage runs. Errors name the bad key and list the valid choices.
"""

from __future__ import annotations

import ast
import itertools
import math
import numbers
import os
import re
import sys
from pathlib import Path

import yaml

from parity.core import codedeps, modelfiles, tolerance
from parity.config import imports, inputspec
from parity.config import inputspec
from parity.config import schema as S

from parity.config.stageargs import PARAMS_FILE, stage_parser  # noqa: F401 - every stage's parser

TOP_KEYS = {
    "models": "model configs, one per conf/models/*.yaml option",
    "dtypes": "precision modes, one per conf/dtypes/*.yaml option",
    "providers": "backends, one per conf/providers/*.yaml option",
    "seed": "int seed for weights and inputs",
    "export": "ONNX export settings",
    "inputs": "input generation settings",
    "reference": "reference run settings",
    "capture": "capture/latency settings",
    "diff": "comparison settings",
    "strict": "fail on UNAVAILABLE/UNSUPPORTED cells and NOT_EXERCISED ones",
    "validated": "written by the Hydra plugin",
    "report": "report inputs (coverage_dep: resolved by the Hydra plugin)",
    "suites": "op/module suites, one per conf/suites/*.yaml option (parity/suites)",
    "suites_run": "suite execution settings (workers, timeouts, gradient checks)",
    "suite_tolerances": "each suite's tolerance rules per dtype (resolved from `suites`, `dtypes`; suite diff deps)",
    "capture_providers": "providers captured directly (resolved from `providers`; dvc.yaml capture matrix)",
    "engine_providers": "providers whose cells need an engine stage (resolved from `providers`, `engine: true`)",
    "torch_models": "models built in torch: reference@model (resolved from `models`; dvc.yaml reference matrix)",
    "onnx_models": "models given as ONNX files: reference_onnx@model (resolved from `models`, `arch.source: onnx`)",
    "analysis": "verdict analyses: the mixed-precision plan (plan, plan_target, max_keep)",
    "plan_dtypes": "dtypes that get a plan@model-dtype-provider stage (resolved from `analysis.plan`, `dtypes`)",
    "reduce_dtypes": "dtypes that get reduce@model-dtype-provider stages (resolved from `analysis.reduce`, `dtypes`)",
    "fuzz": "fuzz campaigns: fuzz@suite-dtype-provider stages (parity/analysis/fuzz.py)",
    "train_step": "training step fp32 vs AMP: train_step@model-dtype stages (parity/analysis/train_step.py)",
    "generate": "generation drift: greedy decoding with a KV cache, generate@model-dtype-provider stages "
                "(parity/pipeline/generate.py)",
}
SECTION_KEYS = {
    "export": {"exporter", "opset"},
    "inputs": {"samples", "calibration"},
    "reference": {"fp64"},
    "capture": {"latency", "warmup", "repeats", "threads"},
    "diff": {"max_mismatch", "verdict"},
    "report": {"coverage_dep", "plan_dep", "reduce_dep", "fuzz_dep", "train_dep", "generate_dep"},
    "suites_run": {"workers", "threads", "timeout_s", "repeats", "onnx_opset", "grad", "grad_tol_scale"},
    "analysis": {"plan", "plan_target", "max_keep", "plan_group", "reduce", "reduce_rel_l2"},
    "fuzz": {"suites", "dtypes", "providers", "seed", "cases", "ops", "nonfinite", "empty", "max_numel",
             "timeout_s", "workers"},
    "train_step": {"models", "dtypes", "lr", "fp64", "limit", "device"},
    "generate": {"models", "dtypes", "providers", "steps", "prompt_len", "prompt", "own_every"},
}
EXPORTERS = {"dynamo": (18, 25), "legacy": (13, 23)}
MODEL_KEYS = {"arch", "input", "tolerances", "shapes"}  # shapes: parity/config/inputspec.py
MAX_INPUT_GIB = 4  # a model's input arrays (inputs.samples x shapes): more is refused at compose
ARCH_SOURCES = ("parity", "torchvision", "import", "onnx", "hf")
# `arch.head` of an hf model: base (AutoModel, the default) or causal_lm (AutoModelForCausalLM: lm_head,
# logits out); the keys of parity/models/hf.py's HEADS
HF_HEADS = ("base", "causal_lm")
# `arch` keys of a model built in torch (an ONNX-file model takes source and path only)
ARCH_KEYS = {"source", "name", "kwargs", "calibrate", "head", "import", "path", "weights"}
# `arch.weights` files (parity/models/weights.py SUFFIXES; tests/test_checkpoints.py keeps them equal)
WEIGHTS_SUFFIXES = (".safetensors", ".pt", ".pth")
# arch.kwargs beside an hf `path:` (from_pretrained arguments, parity/models/hf.py FROM_CONFIG_KEYS)
HF_PATH_KWARGS = ("attn_implementation",)
INPUT_DTYPES = ("float32", "float64", "float16", "int64", "int32", "bool")  # bool: Where conditions, masks
INPUT_INITS = {"normal": {"mean", "std"}, "uniform": {"low", "high"}, "randint": {"low", "high"},
               "zeros": set(), "ones": set(),
               "tokens": {"low", "high"}, "file": {"path", "key", "high"},
               "text": {"prompts", "path", "key"}}  # parity/config/inputspec.py
TORCH_DTYPES = ("float32", "float16", "bfloat16", "float64")
# Precision modes (conf/dtypes/<d>.yaml `mode:`) and the `torch:` dtypes each allows. `torch:` is the
# cast dtype (cast), the autocast dtype (autocast), or the graph I/O dtype (the others).
DTYPE_MODES = {
    "cast": TORCH_DTYPES,              # model and inputs cast to `torch:` (fp32, fp16, bf16)
    "tf32": ("float32",),              # fp32 with TensorFloat-32 matmul/conv (CUDA)
    "autocast": ("float16", "bfloat16"),  # fp32 model under torch.autocast(dtype=`torch:`) (AMP)
    "int8_dynamic": ("float32",),      # int8 weights, activations quantized per call (ORT)
    "int8_static": ("float32",),       # int8 weights and calibrated activations (ORT QDQ, TensorRT)
    "int4_weight": ("float32",),       # 4-bit block-quantized MatMul weights, float32 activations (ORT)
    "fp8": ("float32",),               # TensorRT FP8 builder flag
}
TOL_RULE_KEYS = {"dtype", "layer", "atol", "rtol"}
PROVIDER_KEYS = {"runner", "dtypes", "uses", "options", "engine", "import"}
# Backend components the env stage fingerprints; a provider's `uses:` picks from these.
# the built-in fingerprint components (parity.backends.fingerprint.PROBES); a runner declares more
# (Runner.fingerprint_components)
COMPONENTS = ("numpy", "torch", "onnx", "onnxruntime", "cuda", "tensorrt", "cpu")


NAME = re.compile(r"[A-Za-z0-9_]+")  # option names become file paths and DVC stage names
GROUPS = ("models", "dtypes", "providers", "suites")
BOOLS = (("strict",), ("reference", "fp64"), ("capture", "latency"), ("suites_run", "grad"))

# Provider `options:` (conf/providers/<p>.yaml) are checked against the runner class's
# `options_schema` (parity.backends.runner.Runner), read from its source at compose: key -> allowed
# values (a tuple) or the name of a rule below (with what it allows). A runner declaring none (a
# user's own) gets only the mapping check.
OPTION_RULES = {
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "positive_int": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0, "a positive integer"),
    "string": (lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
    "mapping": (lambda v: isinstance(v, dict), "a mapping"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "auto_bool": (lambda v: isinstance(v, bool) or v == "auto", "auto, true or false"),
    "torch_device": (lambda v: isinstance(v, str) and re.fullmatch(r"cpu|cuda(:\d+)?", v) is not None,
                     "cpu, cuda or cuda:<index>"),
    # diagnostic: emulate a miscompiled node (parity.backends.fault)
    "fault": (lambda v: isinstance(v, dict) and set(v) <= {"node", "scale"} and "node" in v
              and isinstance(v.get("scale", 1.0), (int, float)), "{node: <name>, scale: <number>}"),
}


class ConfigError(ValueError):
    """A bad config. The message names the key and lists valid choices."""


def _choices(valid) -> str:
    return ", ".join(sorted(valid))


def _check_keys(where: str, got: dict, valid, required=()) -> None:
    if not isinstance(got, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(got).__name__} {got!r}")
    for k in got:
        if k not in valid:
            raise ConfigError(f"{where}: unknown key '{k}'. Valid keys: {_choices(valid)}")
    for k in required:
        if k not in got:
            raise ConfigError(f"{where}: missing key '{k}'")


def _num(where: str, v, lo=None, hi=None, integer=False) -> None:
    ok = isinstance(v, numbers.Integral) if integer else isinstance(v, numbers.Real)
    if not ok or isinstance(v, bool):
        raise ConfigError(f"{where}: expected {'an integer' if integer else 'a number'}, got {v!r}")
    if isinstance(v, float) and not math.isfinite(v):
        raise ConfigError(f"{where}: expected a finite number, got {v!r}")
    if lo is not None and v < lo or hi is not None and v > hi:
        rng = f"[{lo}, {hi}]" if lo is not None and hi is not None else (f">= {lo}" if lo is not None else f"<= {hi}")
        raise ConfigError(f"{where}: {v!r} is out of range (valid: {rng})")


def _tol(where: str, t: dict) -> None:
    _check_keys(where, t, {"atol", "rtol"}, required=("atol", "rtol"))
    _num(f"{where}.atol", t["atol"], lo=0)
    _num(f"{where}.rtol", t["rtol"], lo=0)


def _groups(p: dict) -> None:
    """models, dtypes and providers each select at least one option; every option name is safe."""
    if not isinstance(p, dict):
        raise ConfigError(f"params: expected a mapping, got {type(p).__name__}")
    for group in ("models", "dtypes", "providers"):
        if not isinstance(p.get(group), dict) or not p[group]:
            raise ConfigError(f"{group}: no option selected ({group}=[]); select at least one "
                              f"(e.g. -S '{group}=[...]', one per conf/{group}/*.yaml)")
    for group in GROUPS:
        for name in p.get(group) or {}:
            if not isinstance(name, str) or not NAME.fullmatch(name):
                raise ConfigError(f"{group}.{name}: bad option name {name!r}: use only letters, digits and '_' "
                                  f"([A-Za-z0-9_]; names become file paths and DVC stage names)")


def _bools(p: dict) -> None:
    for path in BOOLS:
        node = p
        for k in path[:-1]:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict) and path[-1] in node and not isinstance(node[path[-1]], bool):
            raise ConfigError(f"{'.'.join(path)}: expected true or false, got {node[path[-1]]!r}")


def _option_ok(rule, v) -> tuple[bool, str]:
    """(v satisfies rule, what the rule allows)."""
    if isinstance(rule, tuple):
        return v in rule and not isinstance(v, bool), ", ".join("null" if x is None else str(x) for x in rule)
    check, allowed = OPTION_RULES[rule]
    return check(v), allowed


def runner_options(prov: dict) -> dict | None:
    """The `options_schema` the provider's runner class declares (or inherits), read from its source,
    never imported; None when it declares none."""
    mod, _, cls = str(prov.get("runner", "")).partition(":")
    got = imports.class_value(mod, cls, "options_schema") if cls else None
    return got if isinstance(got, dict) else None


def _provider_options(where: str, prov: dict) -> None:
    """`options:` of a provider whose runner parity knows: known keys, known values."""
    opts = prov.get("options")
    if opts is None:
        return
    if not isinstance(opts, dict):
        raise ConfigError(f"{where}.options: expected a mapping, got {opts!r}")
    schema = runner_options(prov)
    if schema is None:
        return  # a user's own runner: its options are its business
    for k, v in opts.items():
        if k not in schema:
            raise ConfigError(f"{where}.options: unknown option '{k}' for runner {prov['runner']}. "
                              f"Valid: {_choices(schema)}")
        ok, allowed = _option_ok(schema[k], v)
        if not ok:
            raise ConfigError(f"{where}.options.{k}: bad value {v!r}. Valid: {allowed}")


def validate(p: dict) -> dict:
    """Raise ConfigError on the first problem; return p unchanged."""
    _groups(p)
    _check_keys("params", p, TOP_KEYS, required=("models", "dtypes", "providers"))
    _bools(p)
    for sec, keys in SECTION_KEYS.items():
        if sec in p:
            _check_keys(sec, p[sec], keys)
    if "seed" in p:
        _num("seed", p["seed"], lo=0, integer=True)
    _sections(p)
    _dtypes(p)
    _providers(p)
    _analysis(p)
    _fuzz_train(p)
    _generate(p)
    _derived(p)
    for name, m in p["models"].items():
        _model(f"models.{name}", m)
        _input_budget(f"models.{name}", m, p.get("inputs", {}))
    return p


def _sections(p: dict) -> None:
    """export, inputs, capture, diff."""
    exp = p.get("export", {})
    exporter = exp.get("exporter", S.Export.exporter)
    if exporter not in EXPORTERS:
        raise ConfigError(f"export.exporter: unknown exporter '{exporter}'. Valid: {_choices(EXPORTERS)}")
    lo, hi = EXPORTERS[exporter]
    _num("export.opset", exp.get("opset", S.Export.opset), lo=lo, hi=hi, integer=True)
    _num("inputs.samples", p.get("inputs", {}).get("samples", S.Inputs.samples), lo=1, integer=True)
    _num("inputs.calibration", p.get("inputs", {}).get("calibration", S.Inputs.calibration), lo=0, integer=True)
    cap = p.get("capture", {})
    _num("capture.warmup", cap.get("warmup", S.Capture.warmup), lo=0, integer=True)
    _num("capture.repeats", cap.get("repeats", S.Capture.repeats), lo=1, integer=True)
    _num("capture.threads", cap.get("threads", S.Capture.threads), lo=0, integer=True)
    diff = S.section(S.Diff, p.get("diff"))
    _num("diff.max_mismatch", diff.max_mismatch, lo=0, hi=1)
    verdict = diff.verdict
    if verdict not in tolerance.VERDICT_MODES:
        raise ConfigError(f"diff.verdict: unknown verdict mode {verdict!r}. "
                          f"Valid: {_choices(tolerance.VERDICT_MODES)}")


def _dtypes(p: dict) -> None:
    for name, d in p["dtypes"].items():
        _check_keys(f"dtypes.{name}", d, {"torch", "tol", "mode", "oracle"}, required=("torch", "tol", "oracle"))
        _check_keys(f"dtypes.{name}.oracle", d["oracle"], {"k", "slack"}, required=("k",))
        _num(f"dtypes.{name}.oracle.k", d["oracle"]["k"], lo=1)
        if "slack" in d["oracle"]:  # 0 unless given (parity.core.oracle.limits)
            _num(f"dtypes.{name}.oracle.slack", d["oracle"]["slack"], lo=0)
        mode = d.get("mode", S.Dtype.mode)  # conf/dtypes files all state it (dvc.yaml's capture reads the param)
        if d["torch"] not in TORCH_DTYPES:
            raise ConfigError(f"dtypes.{name}.torch: unknown dtype '{d['torch']}'. Valid: {_choices(TORCH_DTYPES)}")
        if mode not in DTYPE_MODES:
            raise ConfigError(f"dtypes.{name}.mode: unknown precision mode '{mode}'. "
                              f"Valid: {_choices(DTYPE_MODES)}")
        if d["torch"] not in DTYPE_MODES[mode]:
            raise ConfigError(f"dtypes.{name}: mode '{mode}' takes torch dtype "
                              f"{' or '.join(DTYPE_MODES[mode])}, not '{d['torch']}'")
        _tol(f"dtypes.{name}.tol", d["tol"])


def _providers(p: dict) -> None:
    for name, prov in p["providers"].items():
        where = f"providers.{name}"
        _check_keys(where, prov, PROVIDER_KEYS, required=("runner", "dtypes", "uses"))
        check_runner(where, prov)
        valid = (*COMPONENTS, *runner_components(prov))
        for u in prov["uses"]:
            if u not in valid:
                raise ConfigError(f"{where}.uses: unknown component '{u}'. Valid: {_choices(valid)}")
        if not isinstance(prov.get("engine", S.Provider.engine), bool):
            raise ConfigError(f"{where}.engine: expected true or false, got {prov['engine']!r}")
        _provider_options(where, prov)
        if p.get("strict"):
            for dt in p["dtypes"]:
                if dt not in prov["dtypes"]:
                    raise ConfigError(
                        f"{where} does not support dtype '{dt}' (strict: true rejects unsupported "
                        f"provider/dtype pairs; without it the cell is reported as UNSUPPORTED). "
                        f"{name} supports: {_choices(prov['dtypes'])} (conf/providers/{name}.yaml `dtypes:`). "
                        f"Drop '{dt}' or '{name}' from the selection, e.g. -S 'dtypes=[...]'")


def _derived(p: dict) -> None:
    """The keys params.yaml resolves from the selection (capture/engine providers, plan dtypes)."""
    for key, want in (("capture_providers", capture_providers(p)), ("engine_providers", engine_providers(p)),
                      ("plan_dtypes", plan_dtypes(p)), ("reduce_dtypes", reduce_dtypes(p)),
                      ("torch_models", torch_models(p)), ("onnx_models", onnx_models(p))):
        got = p.get(key)
        if isinstance(got, str) and got.startswith("${"):
            continue  # unresolved at compose time (the Hydra plugin validates before resolving)
        if key in p and list(got or []) != want:
            src = (f"`analysis.{key.split('_')[0]}` and `dtypes`" if key.endswith("_dtypes")
                   else "`models`" if key.endswith("_models") else "`providers`")
            raise ConfigError(f"{key}: {got!r} does not match the selected {src} (expected {want}): "
                              f"it is resolved from them; compose params.yaml again (parity compose)")


def _model(where: str, m: dict) -> None:
    _check_keys(where, m, MODEL_KEYS, required=("arch", "input"))
    arch = m["arch"]
    if modelfiles.is_onnx_file(m):
        _onnx_arch(f"{where}.arch", arch)
        arch = {**arch, "name": ""}
    else:
        _check_keys(f"{where}.arch", arch, ARCH_KEYS, required=("source",))
        _torch_arch(f"{where}.arch", arch)
    if "calibrate" in arch:
        c = arch["calibrate"]
        _check_keys(f"{where}.arch.calibrate", c, {"shape"}, required=("shape",))
        if not isinstance(c["shape"], list) or not all(isinstance(s, int) and s > 0 for s in c["shape"]):
            raise ConfigError(f"{where}.arch.calibrate.shape: expected a list of positive ints, got {c['shape']!r}")
    if arch["source"] not in ARCH_SOURCES:
        raise ConfigError(f"{where}.arch.source: unknown source '{arch['source']}'. Valid: {_choices(ARCH_SOURCES)}")
    if arch["source"] == "parity" and arch["name"] not in parity_zoo():
        raise ConfigError(f"{where}.arch.name: unknown parity model '{arch['name']}'. "
                          f"Valid: {_choices(parity_zoo())}")
    if arch["source"] == "import":
        check_import_model(f"{where}.arch.name", arch["name"], arch.get("import"))
    elif "import" in arch:
        raise ConfigError(f"{where}.arch.import: only for arch.source: import (it declares the package "
                          f"of a model of your own), not source {arch['source']}")
    if "head" in arch:
        if arch["source"] != "hf":
            raise ConfigError(f"{where}.arch.head: only an hf model has a head (source is '{arch['source']}')")
        if arch["head"] not in HF_HEADS:
            raise ConfigError(f"{where}.arch.head: unknown head '{arch['head']}'. Valid: {_choices(HF_HEADS)}")
    if not isinstance(m["input"], list) or not m["input"]:
        raise ConfigError(f"{where}.input: expected a non-empty list of input specs")
    for i, spec in enumerate(m["input"]):
        w = f"{where}.input[{i}]"
        init = spec.get("init", S.InputSpec.init) if isinstance(spec, dict) else None
        if init not in INPUT_INITS:
            raise ConfigError(f"{w}.init: unknown init '{init}'. Valid: {_choices(INPUT_INITS)}")
        _check_keys(w, spec, {"name", "shape", "dtype", "init"} | INPUT_INITS[init], required=("name", "shape"))
        if not isinstance(spec["shape"], list) or not all(isinstance(s, int) and s > 0 for s in spec["shape"]):
            raise ConfigError(f"{w}.shape: expected a list of positive ints, got {spec['shape']!r}")
        if spec.get("dtype", S.InputSpec.dtype) not in INPUT_DTYPES:
            raise ConfigError(f"{w}.dtype: unknown dtype '{spec.get('dtype')}'. Valid: {_choices(INPUT_DTYPES)}")
    try:  # shapes, token bounds, input files
        inputspec.validate(where, m)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    _tolerance_rules(where, m.get("tolerances"))


def _input_budget(where: str, m: dict, inputs: dict) -> None:
    """The model's input arrays must fit in memory with room to spare: refused above
    PARITY_MAX_INPUT_GIB (default 4) before any stage runs (and before DVC removes outputs)."""
    try:
        cap = float(os.environ.get("PARITY_MAX_INPUT_GIB") or MAX_INPUT_GIB)
    except ValueError:
        raise ConfigError(f"PARITY_MAX_INPUT_GIB: expected a number of GiB, got "
                          f"{os.environ['PARITY_MAX_INPUT_GIB']!r}") from None
    n, c = inputs.get("samples", S.Inputs.samples), inputs.get("calibration", S.Inputs.calibration)
    got = inputspec.nbytes(m, n, c)
    if got > cap * 2**30:
        one = ", ".join(f"{s['name']} {s['shape']} {s.get('dtype', S.InputSpec.dtype)}"
                        for s in inputspec.specs_for(m, inputspec.export_label(m)))
        gib = f"{got / 2**30:.1f}" if got < 2**1000 else f"~2^{got.bit_length() - 30}"
        raise ConfigError(f"{where}: its inputs would take {gib} GiB ({n} samples of {one}"
                          f"{f' + {c} calibration' if c else ''}), over the {cap:g} GiB cap: lower "
                          f"inputs.samples or {where}.input shapes (or set PARITY_MAX_INPUT_GIB)")


def _tolerance_rules(where: str, rules) -> None:
    """A model's `tolerances:` rules (a rule for a dtype not selected in this run is allowed: it
    just never matches)."""
    rules = rules or []
    if not isinstance(rules, list):
        raise ConfigError(f"{where}.tolerances: expected a list of rules")
    for i, r in enumerate(rules):
        w = f"{where}.tolerances[{i}]"
        _check_keys(w, r, TOL_RULE_KEYS)
        if ("atol" in r) != ("rtol" in r):
            raise ConfigError(f"{w}: give atol and rtol together (torch.testing convention), got {sorted(r)}")
        if "atol" not in r:
            raise ConfigError(f"{w}: a rule needs atol and rtol")
        _tol(w, {"atol": r["atol"], "rtol": r["rtol"]})


def check_runner(where: str, prov: dict) -> None:
    """A provider's `runner:` is code: it must be a parity backend (parity.backends.*, the runners of
    conf/providers/*.yaml) unless the provider declares `import: <module>` (code of your own, to be
    reviewed as such). The module is located and read for the class, never imported here."""
    def valid() -> list[str]:  # the registry: runner values of conf/providers/*.yaml
        d = Path("conf/providers")
        d = d if d.is_dir() else Path(__file__).resolve().parents[2] / "conf" / "providers"
        found = set()
        for f in d.glob("*.yaml"):
            try:
                doc = S.load_yaml(f.read_text()) or {}
            except yaml.YAMLError:
                continue
            found |= {v["runner"] for v in doc.values() if isinstance(v, dict) and isinstance(v.get("runner"), str)}
        return sorted(found)

    try:
        declared = imports.declared(prov.get("import"), f"{where}.import")
    except imports.NotAllowed as e:
        raise ConfigError(str(e)) from None
    try:
        imports.check_runner(prov["runner"], declared, valid)
    except imports.NotAllowed as e:
        raise ConfigError(f"{where}.runner: {e}") from None


def runner_components(prov: dict) -> dict:
    """Fingerprint components the provider's runner class declares (Runner.fingerprint_components,
    read from its source, never imported): {name: distributions}."""
    mod, _, cls = str(prov.get("runner", "")).partition(":")
    got = imports.class_literal(mod, cls, "fingerprint_components") if cls else None
    return got if isinstance(got, dict) else {}


def parity_zoo() -> tuple[str, ...]:
    """parity's own models: the keys of parity/models/zoo.py's BUILDERS, read from its source (torch is
    not imported at compose), so a zoo model is a builder there plus its conf file."""
    tree = ast.parse((Path(__file__).parents[1] / "models" / "zoo.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "BUILDERS" for t in node.targets):
            return tuple(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    return ()


def _onnx_arch(where: str, arch: dict) -> None:
    """`arch: {source: onnx, path: <file>}`: the file must exist (a light check at compose time; the
    export stage reads and checks the file itself: parity.models.onnx_source.load_checked)."""
    _check_keys(where, arch, {"source", "path"}, required=("source", "path"))
    if not Path(str(arch["path"])).is_file():
        raise ConfigError(f"{where}.path: {arch['path']}: no such file (relative to the repo root, "
                          f"{Path.cwd()}); track it with git or `dvc add`")


def _torch_arch(where: str, arch: dict) -> None:
    """A model built in torch: `name` (or, for hf, a checkpoint `path` instead), and `weights`."""
    if arch.get("source") == "hf" and "path" in arch:
        _hf_checkpoint(where, arch)
    elif "name" not in arch:
        raise ConfigError(f"{where}: missing key 'name'" + (" (or `path:` to a local Hugging Face checkpoint "
                                                              "folder)" if arch.get("source") == "hf" else ""))
    elif "path" in arch:
        raise ConfigError(f"{where}.path: only for arch.source: onnx (a .onnx file) or hf (a checkpoint "
                          f"folder), not source {arch.get('source')}; trained weights of a torch model go in "
                          f"{where}.weights")
    if "weights" in arch:
        w = arch["weights"]
        if arch.get("source") not in ("parity", "torchvision", "import", "hf"):
            return  # an unknown source: refused below with the valid ones
        if not isinstance(w, str) or Path(w).suffix not in WEIGHTS_SUFFIXES:
            raise ConfigError(f"{where}.weights: expected a {'/'.join(WEIGHTS_SUFFIXES)} state-dict file, got {w!r}")
        if not Path(w).is_file():
            raise ConfigError(f"{where}.weights: {w}: no such file (relative to the repo root, {Path.cwd()}); "
                              f"track it with git or `dvc add`")


def _hf_checkpoint(where: str, arch: dict) -> None:
    """`arch: {source: hf, path: <dir>}`: a folder holding config.json (the model type and its
    config come from there, so no `name`, no `kwargs` but from_pretrained's own, no `weights`)."""
    path = arch["path"]
    for key, why in (("name", "the model type comes from config.json"), ("weights", "the checkpoint holds them"),
                     ("calibrate", "a checkpoint's BatchNorm statistics are trained")):
        if key in arch:
            raise ConfigError(f"{where}.{key}: not with {where}.path ({why})")
    extra = sorted(set(arch.get("kwargs") or {}) - set(HF_PATH_KWARGS))
    if extra:
        raise ConfigError(f"{where}.kwargs: {', '.join(extra)}: not with {where}.path (the checkpoint's config.json "
                          f"sets the model). Valid: {_choices(HF_PATH_KWARGS)}")
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{where}.path: expected a checkpoint folder, got {path!r}")
    if not Path(path).is_dir():
        raise ConfigError(f"{where}.path: {path}: no such folder (relative to the repo root, {Path.cwd()}): a "
                          f"Hugging Face checkpoint folder (config.json, *.safetensors); track it with git or `dvc add`")
    if not (Path(path) / "config.json").is_file():
        raise ConfigError(f"{where}.path: {path}: no config.json in the folder: a Hugging Face checkpoint folder "
                          f"(what save_pretrained writes: config.json, *.safetensors)")


def check_import_model(where: str, name, declared=None) -> None:
    """An `arch.source: import` model names 'package.module:callable' (code that builds an nn.Module)
    whose module is a source file under the repo root, or under a package the model declares with
    `arch.import: <package>` (an installed one); never the standard library, builtins or parity's own
    modules. Located without importing anything (validation never runs user code); its files are what
    the env stage hashes into the model's code dependency (parity.core.codedeps)."""
    base = where.rpartition(".")[0]
    try:
        pkgs = imports.declared(declared, f"{base}.import")
    except imports.NotAllowed as e:
        raise ConfigError(str(e)) from None
    mod, _, attr = str(name).partition(":")
    if not mod or not attr or not attr.isidentifier():
        raise ConfigError(f"{where}: expected 'package.module:callable', got {name!r}")
    top = mod.split(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names or top in ("parity", "stages"):
        what = "parity's own code (use arch.source: parity)" if top in ("parity", "stages") else \
            "the Python standard library"
        raise ConfigError(f"{where}: '{mod}' is {what}, not a model: arch.source: import names a callable "
                          f"that returns an nn.Module, in a module of this repository or a declared package")
    roots = codedeps.search_roots()
    found = codedeps.find_module(mod, roots)
    if found is None:
        raise ConfigError(f"{where}: cannot find module '{mod}': no {codedeps.searched(mod)} in the repo root "
                          f"({Path.cwd()}) or on sys.path")
    if found[0] != roots[0] and not any(mod == d or mod.startswith(d + ".") for d in pkgs):
        raise ConfigError(f"{where}: '{mod}' ({found[1]}) is not in this repository: a model of an installed "
                          f"package is code to run: declare it with `import: {top}` in {base}")


def _analysis(p: dict) -> None:
    """analysis: {plan: bool, plan_target: null | {atol, rtol}, max_keep: int >= 1,
    plan_group: auto | leaf | block}."""
    a = p.get("analysis") or {}
    if not isinstance(a.get("plan", S.Analysis.plan), bool):
        raise ConfigError(f"analysis.plan: expected true or false, got {a['plan']!r}")
    if a.get("plan_target") is not None:
        _tol("analysis.plan_target", a["plan_target"])
    _num("analysis.max_keep", a.get("max_keep", S.Analysis.max_keep), lo=1, integer=True)
    if a.get("plan_group", S.Analysis.plan_group) not in ("auto", "leaf", "block"):
        raise ConfigError(f"analysis.plan_group: unknown '{a['plan_group']}' (valid: auto, leaf, block)")
    if not isinstance(a.get("reduce", S.Analysis.reduce), bool):
        raise ConfigError(f"analysis.reduce: expected true or false, got {a['reduce']!r}")
    _num("analysis.reduce_rel_l2", a.get("reduce_rel_l2", S.Analysis.reduce_rel_l2), lo=0)


def _fuzz_train(p: dict) -> None:
    """fuzz (when fuzz.suites names one): its dtypes/providers among the selected ones (their
    settings come from params); train_step: models among the selected ones, AMP dtypes float16/bfloat16."""
    f = p.get("fuzz") or {}
    for key, group in (("dtypes", "dtypes"), ("providers", "providers")):
        for name in (f.get(key) or []) if f.get("suites") else []:  # defaults matter only when fuzzing
            if name not in p[group]:
                raise ConfigError(f"fuzz.{key}: '{name}' is not selected in `{group}`. Selected: "
                                  f"{_choices(p[group])}")
    for name in f.get("suites") or []:
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ConfigError(f"fuzz.suites: bad suite name {name!r}")
    for k, lo in (("cases", 1), ("seed", 0), ("max_numel", 1), ("workers", 1)):
        if k in f:
            _num(f"fuzz.{k}", f[k], lo=lo, integer=True)
    if "timeout_s" in f:
        _num("fuzz.timeout_s", f["timeout_s"], lo=0.001)
    t = p.get("train_step") or {}
    for m in t.get("models") or []:
        if m not in p["models"]:
            raise ConfigError(f"train_step.models: '{m}' is not selected in `models`. Selected: "
                              f"{_choices(p['models'])}")
    for d in t.get("dtypes") or []:
        if d not in ("float16", "bfloat16"):
            raise ConfigError(f"train_step.dtypes: unknown AMP dtype {d!r}. Valid: bfloat16, float16")
    if "lr" in t:
        _num("train_step.lr", t["lr"], lo=0)
    if t.get("device", S.TrainStep.device) not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"train_step.device: unknown device {t['device']!r}. Valid: auto, cpu, cuda")
    if t.get("limit") is not None:
        _num("train_step.limit", t["limit"], lo=0)


def _generate(p: dict) -> None:
    """generate (when generate.models names one): models among the selected ones and built from a
    Hugging Face config (arch.source: hf), dtypes and providers among the selected ones, steps and
    prompt_len positive integers; a text `prompt` only for checkpoint folders with a tokenizer.json."""
    g = p.get("generate") or {}
    if not isinstance(g, dict):
        raise ConfigError(f"generate: expected a mapping, got {g!r}")
    for key, group in (("models", "models"), ("dtypes", "dtypes"), ("providers", "providers")):
        names = g.get(key) or []
        if not isinstance(names, list):
            raise ConfigError(f"generate.{key}: expected a list of `{group}` options, got {names!r}")
        for name in names if g.get("models") else []:  # dtypes/providers matter only when generating
            if name not in p[group]:
                raise ConfigError(f"generate.{key}: '{name}' is not selected in `{group}`. Selected: "
                                  f"{_choices(p[group])}")
    for m in g.get("models") or []:
        src = ((p["models"][m] or {}).get("arch") or {}).get("source")
        if src != "hf":
            raise ConfigError(f"generate.models: '{m}' is not a Hugging Face causal LM (models.{m}.arch.source: "
                              f"{src}). Valid: models with arch.source: hf")
    _num("generate.steps", g.get("steps", S.Generate.steps), lo=1, hi=4096, integer=True)
    _num("generate.prompt_len", g.get("prompt_len", S.Generate.prompt_len), lo=1, hi=4096, integer=True)
    _num("generate.own_every", g.get("own_every", S.Generate.own_every), lo=0, hi=4096, integer=True)
    text = g.get("prompt")
    if text is not None:
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(f"generate.prompt: expected a non-empty string (or null: prompt_len seeded ids), got {text!r}")
        for m in g.get("models") or []:
            arch = p["models"][m]["arch"]
            if not arch.get("path") or not (Path(str(arch["path"])) / "tokenizer.json").is_file():
                raise ConfigError(f"generate.prompt: models.{m} has no tokenizer to read it with (a text prompt needs "
                                  f"arch.path: a checkpoint folder holding tokenizer.json); drop generate.prompt "
                                  f"for seeded prompt ids")


# Precision modes a mixed-precision plan applies to (a `cast` dtype only below float32).
PLAN_MODES = ("cast", "autocast", "int8_dynamic", "int8_static", "int4_weight")


def plan_dtypes(p: dict) -> list[str]:
    """Selected dtypes that get a plan@model-dtype-provider stage: with `analysis.plan: true`, the
    reduced-precision ones (cast to float16/bfloat16, autocast, int8, int4); else none, and dvc.yaml's plan
    matrix is empty (no plan stage exists)."""
    if (p.get("analysis") or {}).get("plan") is not True:
        return []
    return [n for n, d in p["dtypes"].items() if isinstance(d, dict) and d.get("mode", S.Dtype.mode) in PLAN_MODES
            and not (d.get("mode", S.Dtype.mode) == "cast" and d.get("torch") in ("float32", "float64"))]


def reduce_dtypes(p: dict) -> list[str]:
    """Selected dtypes whose cells get a reduce@model-dtype-provider stage: all of them with
    `analysis.reduce: true` (the stage reduces FAIL cells and skips the rest), else none."""
    return list(p["dtypes"]) if (p.get("analysis") or {}).get("reduce") is True else []


def engine_providers(p: dict) -> list[str]:
    """Selected providers whose cells need an engine stage (`engine: true`, e.g. trt): dvc.yaml's
    engine and capture_engine matrices iterate these (none selected: those stages do not exist)."""
    return [n for n, pc in p["providers"].items() if isinstance(pc, dict) and pc.get("engine") is True]


def capture_providers(p: dict) -> list[str]:
    """The other selected providers: dvc.yaml's capture matrix iterates these."""
    return [n for n, pc in p["providers"].items() if not (isinstance(pc, dict) and pc.get("engine") is True)]


def onnx_models(p: dict) -> list[str]:
    """Selected models given as ONNX files (`arch.source: onnx`): dvc.yaml's reference_onnx matrix
    iterates these (reference by onnxruntime CPU, stages/reference_onnx.py)."""
    return [n for n, m in p["models"].items() if modelfiles.is_onnx_file(m)]


def torch_models(p: dict) -> list[str]:
    """The other selected models (built in torch): dvc.yaml's reference matrix iterates these, so
    their reference stage depends on no onnxruntime code."""
    return [n for n, m in p["models"].items() if not modelfiles.is_onnx_file(m)]


def load(path: str | Path = PARAMS_FILE) -> dict:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: not found (compose it from conf/ with `parity compose` or `dvc exp run`)")
    try:
        p = S.load_yaml(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(yaml_error(e, path)) from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not isinstance(p, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys, got a {type(p).__name__}")
    return validate(p)


def yaml_error(e, file) -> str:
    """`FILE:LINE:COL: YAML error: problem (context)` on one line, as compose says it (a tag such as
    !!python/object is an error: parity reads YAML with the safe loader)."""
    mark = getattr(e, "problem_mark", None)
    where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark else str(file)
    what = getattr(e, "problem", None) or (str(e).splitlines() or [type(e).__name__])[0]
    ctx = getattr(e, "context", None)
    return f"{where}: YAML error: {what}" + (f" ({ctx})" if ctx else "")


def cells(p: dict) -> list[tuple[str, str, str]]:
    """The (model, dtype, provider) cells in DVC matrix order (models x dtypes x providers)."""
    return list(itertools.product(p["models"], p["dtypes"], p["providers"]))


def cell_key(model: str, dtype: str, provider: str) -> str:
    return f"{model}-{dtype}-{provider}"


def summary_line(p: dict) -> str:
    n = len(cells(p))
    return (f"{len(p['models'])} models x {len(p['dtypes'])} dtypes x "
            f"{len(p['providers'])} providers = {n} cells")


def die(err: Exception, code: int = 2):
    """Print a config error the way every entry point does, and exit non-zero."""
    print(f"parity: config error: {err}", file=sys.stderr)
    raise SystemExit(code)


def unsupported_dtype(provider: str, prov: dict, dtype: str) -> str | None:
    """Why `provider` (its conf `prov`) does not run `dtype` (its `dtypes:` lacks it), or None."""
    supported = prov.get("dtypes", [])
    if dtype in supported:
        return None
    return f"provider {provider} supports dtypes {supported}, not {dtype} (conf/providers/{provider}.yaml)"


def load_or_die(path: str | Path = PARAMS_FILE) -> dict:
    """load(), or print the config error and exit 2 before the stage writes anything."""
    try:
        return load(path)
    except ConfigError as e:
        die(e)
