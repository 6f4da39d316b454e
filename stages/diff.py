"""diff@model-dtype-provider: per-layer comparison of a capture against the torch fp32 reference
(tolerance metrics) and against the fp64 run relative to the trusted baseline at the cell's dtype
(the oracle verdict, the default: parity.pipeline.diff). numpy only.

Writes, under --out: metrics.json (verdict and its mode, drift_origin with its cause, worst layer,
worst_ratio, output-level metrics; a plain output: the report's summary.json is the DVC metric,
parity.core.metrics), layers.json (every layer's metrics, the tolerance key that
applied, the worst element's index and values, a histogram of |a - b| / allowed per decade
(`hist_edges`), the oracle's excess/bits_lost, each layer's own error, the capture's `settings` and the
causes they explain per failing layer) and layers.csv (DVC plot data).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from parity.config import params as config, schema
from parity.core import memory
from parity.core.io import Corrupt


def main(argv=None) -> int:
    ap = config.stage_parser("stages.diff", __doc__, cell=True)
    ap.add_argument("--capture", required=True)
    ap.add_argument("--reference", required=True)
    ap.add_argument("--baseline", help="baseline@model-dtype output (the oracle's trusted backend)")
    ap.add_argument("--model-dir", help="export output: layers.json names the ops between leaves")
    ap.add_argument("--out", required=True)
    ap.add_argument("--timing", help="peak RSS (parity.core.memory), apart from the values")
    a = ap.parse_args(argv)
    p = config.load_or_die(a.params)
    t0 = time.perf_counter()
    # lazy: `stages.diff --help` loads no numpy/pyarrow (+0.25 s, BENCHMARKS 22; tests/test_light_stages.py)
    from parity.pipeline.diff import diff_and_write
    # lazy: as the line above (pyarrow)
    from parity.core.store import reuse_pool

    reuse_pool()  # decoded row groups' buffers reused (store.reuse_pool): bert_base's diff -0.5 s
    try:
        print(diff_and_write(schema.rule(p, a.model, a.dtype), config.cell_key(a.model, a.dtype, a.provider),
                             Path(a.capture), Path(a.reference), Path(a.baseline) if a.baseline else None,
                             Path(a.model_dir) if a.model_dir else None, Path(a.out)))
    except Corrupt as e:  # a capture/reference Parquet that does not parse: named, with how to recover it
        print(f"diff@{a.model}-{a.dtype}-{a.provider}: {e}", file=sys.stderr)
        return 1
    memory.record(a.timing, "diff", config.cell_key(a.model, a.dtype, a.provider), t0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
