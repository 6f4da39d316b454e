"""inputs@model: seeded, deterministic input samples (numpy only) to Parquet.

Sample s of input i is drawn from numpy's default_rng([seed, s, i]) per the model's `input:` specs,
so adding samples never changes the existing ones. With --calibration, the `inputs.calibration`
INT8 calibration samples go to a second file, drawn from default_rng([seed, CALIBRATION, c, i]): a
different seed sequence, so a model is never calibrated on the samples it is evaluated on.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from parity import config, inputfiles

if TYPE_CHECKING:
    import numpy as np
# numpy and the Parquet store (pyarrow) are imported where they are used: `--help` and a bad argument
# stay quick, and importing this module (stages.capture/export do, for load/samples) costs nothing extra.

CALIBRATION = 0xCA11B  # tags the calibration samples' seed sequence (distinct from evaluated samples)


def generate(spec: dict, seed: int, sample: int, index: int, calibration: bool = False) -> np.ndarray:
    import numpy as np

    rng = np.random.default_rng([seed, CALIBRATION, sample, index] if calibration else [seed, sample, index])
    shape, dtype, init = tuple(spec["shape"]), np.dtype(spec.get("dtype", "float32")), spec.get("init", "normal")
    if init == "normal":
        a = rng.normal(spec.get("mean", 0.0), spec.get("std", 1.0), size=shape)
    elif init == "uniform":
        a = rng.uniform(spec.get("low", 0.0), spec.get("high", 1.0), size=shape)
    elif init == "randint":
        a = rng.integers(spec.get("low", 0), spec.get("high", 2), size=shape)
    elif init == "zeros":
        a = np.zeros(shape)
    else:
        a = np.ones(shape)
    return a.astype(dtype)


def samples(p: dict, model: str) -> list[dict[str, np.ndarray]]:
    """Per sample {input name: array}; with `models.<m>.shapes`, one set of samples per shape
    label (parity.inputfiles, parity.inputspec)."""
    return inputfiles.model_samples(p["models"][model], p.get("seed", 0), p.get("inputs", {}).get("samples", 1),
                                   generate)


def calibration_samples(p: dict, model: str) -> list[dict[str, np.ndarray]]:
    return inputfiles.model_calibration(p["models"][model], p.get("seed", 0),
                                       p.get("inputs", {}).get("calibration", 0), generate)


def load(path) -> list[dict[str, np.ndarray]]:
    from parity import store

    by_sample: dict[int, dict[str, np.ndarray]] = {}
    for t in store.read(path):
        by_sample.setdefault(t.sample, {})[t.name] = t.array
    return [by_sample[k] for k in sorted(by_sample)]


def main(argv=None) -> int:
    ap = config.stage_parser("stages.inputs", __doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--calibration", help="also write the INT8 calibration samples (inputs.calibration) here")
    a = ap.parse_args(argv)
    p = config.load_or_die(a.params)
    from parity import store

    specs = p["models"][a.model]["input"]
    try:
        feeds, cal_feeds = samples(p, a.model), calibration_samples(p, a.model) if a.calibration else []
    except inputfiles.InputError as e:
        print(f"inputs@{a.model}: models.{a.model}.{e}", file=sys.stderr)
        return 1
    rows = [store.Tensor(k, s["name"], i, arr[s["name"]])
            for k, arr in enumerate(feeds) for i, s in enumerate(specs)]
    store.write(a.out, rows, {"model": a.model})
    print(f"inputs@{a.model}: {len(rows)} tensors ({p.get('inputs', {}).get('samples', 1)} samples) -> {a.out}")
    if a.calibration:
        cal = [store.Tensor(k, s["name"], i, arr[s["name"]])
               for k, arr in enumerate(cal_feeds) for i, s in enumerate(specs)]
        store.write(a.calibration, cal, {"model": a.model, "purpose": "calibration"})
        print(f"inputs@{a.model}: {len(cal)} calibration tensors -> {a.calibration}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
