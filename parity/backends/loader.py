"""Loaders: what a runner is given, read apart from the runner (as Polygraphy keeps loaders apart
from runners).

- load_runner: the Runner class a provider's conf names (`runner: package.module:Class`): the conf
  directory is the registry; only parity.backends.* is imported unless the provider declares the
  module under `import:`;
- calibration_feeds: the INT8 calibration samples the inputs stage wrote;
- gold_samples / lazy_gold_samples / gold_rows / reference_samples: the fp64 reference (fp64.parquet)
  one sample at a time, for the own-error run and the oracle's sums.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pyarrow.parquet as pq

from parity.backends.runner import Runner
from parity.config import imports as code
from parity.core import store


def load_runner(path: str, imports=None) -> type[Runner]:
    """The Runner class `path` ('package.module:Class') names. Only parity.backends.* is imported
    unless `imports` (the provider's `import:`) declares the module as code to run; parity.config.params
    checked the same rule at compose, without importing."""
    if not path.startswith(code.RUNNER_NAMESPACE) and not any(
            path.partition(":")[0] == d or path.startswith(d + ".") for d in code.declared(imports, "import")):
        raise ValueError(f"runner '{path}' is not a parity backend ({code.RUNNER_NAMESPACE}*) and the provider "
                         "declares no `import:` for it: not imported")
    mod, _, cls = path.partition(":")
    try:
        obj = getattr(importlib.import_module(mod), cls)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"runner '{path}' cannot be imported: {e}") from e
    if not (isinstance(obj, type) and issubclass(obj, Runner)):
        raise ValueError(f"runner '{path}' is not a parity.backends.runner.Runner subclass")
    return obj


def calibration_feeds(path) -> list[dict]:
    """The calibration samples written by the inputs stage: [{input name: array}, ...] (what an INT8
    runner calibrates on: ort_int8's static quantization, an engine build's INT8 calibrator)."""
    by_sample: dict[int, dict] = {}
    for t in store.read(path):
        by_sample.setdefault(t.sample, {})[t.name] = t.array
    return [by_sample[k] for k in sorted(by_sample)]


def gold_samples(path: Path):
    """fp64.parquet one sample at a time: (k, {name: array}) in sample order (the file holds each
    sample's rows together), so a reader holds one sample of the reference at once."""
    cur, by = None, {}
    for t in store.read(path):
        if t.sample != cur and by:
            yield cur, by
            by = {}
        cur = t.sample
        by[t.name] = t.array
    if by:
        yield cur, by


def lazy_gold_samples(path: Path, model_dir: Path | None = None):
    """fp64.parquet one sample at a time as (k, {name: array}), each array read when it is looked up
    (store.SampleRows): the own-error run and the oracle's sums hold the row groups they are reading,
    not a whole fp64 sample (resnet50: 490 MB of leaf outputs and `pre:` inputs). The two passes of a
    capture (the sums, then the own-error run) share one reader (gold_rows): a reference small enough
    to stay decoded is decoded once, not once per pass and lookup region."""
    return gold_rows(path, model_dir).by_sample()


_GOLD: dict[Path, store.Rows] = {}  # this process's fp64 reference reader, by path (one capture per process)
WHOLE_MAX_MB = 1024  # the most a reference kept decoded may take, whatever the weights


def gold_rows(path: Path, model_dir: Path | None = None, weight_bytes: int | None = None) -> store.Rows:
    """One store.Rows of `path` per process. It stays decoded whole when it takes no more than the
    model's weights (weights.bin, which the stage maps anyway; at least store.KEEP_MB, at most
    WHOLE_MAX_MB), else it keeps its last 2 row groups (the streaming bound of issue 23): the memory
    it adds stays within the budgets of parity.core.memory (3 W + 1 GiB; a 1B model's reference,
    several GB, streams). gpt2_small's (368 MB decoded, 12 row groups, W 474 MB) was decoded 64 times
    in its baseline: 5.8 of 10.6 s. `weight_bytes`: W when no model_dir gives it (the fp32
    baseline made with the reference: W from parity.pipeline.memsize); the first call for a path decides."""
    key = Path(path).resolve()
    if key not in _GOLD:
        _GOLD.clear()  # one reference at a time
        w = model_dir / "weights.bin" if model_dir is not None else None
        mb = (w.stat().st_size if w is not None and w.is_file() else (weight_bytes or 0)) / 2**20
        _GOLD[key] = store.Rows(key, keep=store.Rows.WHOLE, whole_mb=min(max(mb, store.KEEP_MB), WHOLE_MAX_MB))
    return _GOLD[key]


def reference_samples(path: Path) -> int:
    """How many samples fp64.parquet holds (its `sample` column alone is read)."""
    col = pq.read_table(path, columns=["sample"]).column("sample").to_pylist()
    return len(set(col))
