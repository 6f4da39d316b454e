"""Seeded, deterministic input samples (numpy only), and loading them back (the inputs stage writes
them; export, reference, baseline and capture read them).

Sample s of input i is drawn from numpy's default_rng([seed, s, i]) per the model's `input:` specs,
so adding samples never changes the existing ones. The `inputs.calibration` INT8 calibration samples
are drawn from default_rng([seed, CALIBRATION, c, i]): a different seed sequence, so a model is never
calibrated on the samples it is evaluated on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from parity.config import inputspec, schema

if TYPE_CHECKING:
    import numpy as np
# numpy and the Parquet store (pyarrow) are imported where they are used: importing this module (the
# inputs, export, reference, baseline and capture stages do) costs nothing extra.

CALIBRATION = 0xCA11B  # tags the calibration samples' seed sequence (distinct from evaluated samples)


def generate(spec: dict, seed: int, sample: int, index: int, calibration: bool = False) -> np.ndarray:
    # lazy: `stages.inputs --help` loads no numpy/pyarrow (+0.10 s, BENCHMARKS 22; tests/test_light_stages.py)
    import numpy as np

    rng = np.random.default_rng([seed, CALIBRATION, sample, index] if calibration else [seed, sample, index])
    s = schema.section(schema.InputSpec, spec)
    shape, dtype, init = s.shape, np.dtype(s.dtype), s.init
    if init == "normal":
        a = rng.normal(s.mean, s.std, size=shape)
    elif init == "uniform":
        a = rng.uniform(*s.bounds(), size=shape)
    elif init == "randint":
        a = rng.integers(*s.bounds(), size=shape)
    elif init == "zeros":
        a = np.zeros(shape)
    else:
        a = np.ones(shape)
    return a.astype(dtype)


def samples(p: dict, model: str) -> list[dict[str, np.ndarray]]:
    """Per sample {input name: array}; with `models.<m>.shapes`, one set of samples per shape label,
    and `init: file` inputs from their files (parity.pipeline.inputfiles, parity.config.inputspec)."""
    # lazy: `stages.inputs --help` loads no numpy/pyarrow (+0.18 s, BENCHMARKS 22; tests/test_light_stages.py)
    from parity.pipeline import inputfiles

    c = schema.of(p)
    return inputfiles.model_samples(inputspec.plan(p["models"][model], c.inputs.samples), c.seed, generate)


def calibration_samples(p: dict, model: str) -> list[dict[str, np.ndarray]]:
    # lazy: `stages.inputs --help` loads no numpy/pyarrow (+0.18 s, BENCHMARKS 22; tests/test_light_stages.py)
    from parity.pipeline import inputfiles

    c = schema.of(p)
    return inputfiles.model_calibration(inputspec.plan(p["models"][model]), c.seed, c.inputs.calibration, generate)


def load(path) -> list[dict[str, np.ndarray]]:
    # lazy: `stages.inputs --help` loads no numpy/pyarrow (+0.18 s, BENCHMARKS 22; tests/test_light_stages.py)
    from parity.core import store

    by_sample: dict[int, dict[str, np.ndarray]] = {}
    for t in store.read(path):
        by_sample.setdefault(t.sample, {})[t.name] = t.array
    return [by_sample[k] for k in sorted(by_sample)]


def rows(p: dict, model: str, calibration: bool = False) -> list:
    """The samples (or the calibration samples) as Parquet store rows."""
    # lazy: `stages.inputs --help` loads no numpy/pyarrow (+0.18 s, BENCHMARKS 22; tests/test_light_stages.py)
    from parity.core import store

    specs = p["models"][model]["input"]
    made = calibration_samples(p, model) if calibration else samples(p, model)
    return [store.Tensor(k, s["name"], i, arr[s["name"]]) for k, arr in enumerate(made) for i, s in enumerate(specs)]
