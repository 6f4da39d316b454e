"""baseline@model-dtype: the trusted backend (torch CPU eager) at one dtype, on the same inputs as
every cell: per-layer values to Parquet. The fp64 oracle (parity.core.oracle) measures each
cell's error against fp64 relative to this baseline's error at the same precision, so one baseline
serves every provider of that model and dtype.

Writes, under --out: layers.parquet, own.parquet (each layer's own values, with --reference) and
status.json (status OK, or UNSUPPORTED for precision modes
torch CPU eager does not reproduce: int8, fp8, tf32; those cells are judged by tolerance).
"""

from __future__ import annotations

import time
from pathlib import Path

from parity.config import params as config
from parity.core import memory
from parity.pipeline.publish import FOLD_DIR, made_by, publish_fold


def main(argv=None) -> int:
    ap = config.stage_parser("stages.baseline", __doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", required=True)
    ap.add_argument("--model-dir", required=True, help="export stage output (unused by torch; kept for the job)")
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--reference", help="fp64.parquet of the reference stage: each layer's own error")
    ap.add_argument("--out", required=True)
    ap.add_argument("--timing", help="peak RSS and the memory estimate (parity.core.memory), apart from the values")
    a = ap.parse_args(argv)
    p = config.load_or_die(a.params)
    t0 = time.perf_counter()

    key = f"{a.model}-{a.dtype}"
    if a.reference:  # fp32: made with the reference, published here (parity.pipeline.fold)
        line = publish_fold(Path(a.reference).parent, a.dtype, p["dtypes"][a.dtype], Path(a.out))
        if line:
            print(line)
            memory.record(a.timing, "baseline", key, t0, {"made_by": made_by(Path(a.reference).parent / FOLD_DIR)})
            return 0
    # lazy: numpy, pyarrow (+0.3 s) and the runners only where the baseline is computed, not published
    from parity.pipeline import memsize
    # lazy: numpy, pyarrow (+0.3 s) and the runners only where the baseline is computed, not published
    from parity.pipeline.baseline import capture_baseline

    # SA: the reference's fp32 values (a declared dep: the folder beside --reference), else a meta run
    sized = memsize.guard("baseline", key, p, a.model, memory.parquet_value_bytes(
        Path(a.reference).with_name("fp32.parquet")) if a.reference else None)
    if sized is None:
        return 1

    print(capture_baseline(p, a.model, a.dtype, Path(a.model_dir), Path(a.inputs), Path(a.out),
                           Path(a.reference) if a.reference else None))
    memory.record(a.timing, "baseline", key, t0, sized)
    return 0


if __name__ == "__main__":
    from parity.core.io import exit_now

    exit_now(main())  # outputs are in place; skip torch's interpreter teardown
