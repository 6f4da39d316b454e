"""inputs@model: seeded, deterministic input samples (numpy only) to Parquet.

Sample s of input i is drawn from numpy's default_rng([seed, s, i]) per the model's `input:` specs,
so adding samples never changes the existing ones. With --calibration, the `inputs.calibration`
INT8 calibration samples go to a second file, drawn from default_rng([seed, CALIBRATION, c, i]): a
different seed sequence, so a model is never calibrated on the samples it is evaluated on.
"""

from __future__ import annotations

import sys

from parity.config import params as config
from parity.pipeline import inputs


def main(argv=None) -> int:
    ap = config.stage_parser("stages.inputs", __doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--calibration", help="also write the INT8 calibration samples (inputs.calibration) here")
    a = ap.parse_args(argv)
    p = config.load_or_die(a.params)
    # lazy: `stages.inputs --help` loads no numpy/pyarrow (+0.18 s, BENCHMARKS 22; tests/test_light_stages.py)
    from parity.core import store

    # lazy: `stages.inputs --help` loads no numpy/pyarrow (+0.18 s, BENCHMARKS 22; tests/test_light_stages.py)
    from parity.pipeline.inputfiles import InputError

    try:  # a real input file (init: file) that does not fit its spec: named, nothing written
        rows = inputs.rows(p, a.model)
        cal = inputs.rows(p, a.model, calibration=True) if a.calibration else []
    except InputError as e:
        print(f"inputs@{a.model}: models.{a.model}.{e}", file=sys.stderr)
        return 1
    store.write(a.out, rows, {"model": a.model})
    print(f"inputs@{a.model}: {len(rows)} tensors ({p.get('inputs', {}).get('samples', 1)} samples) -> {a.out}")
    if a.calibration:
        store.write(a.calibration, cal, {"model": a.model, "purpose": "calibration"})
        print(f"inputs@{a.model}: {len(cal)} calibration tensors -> {a.calibration}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
