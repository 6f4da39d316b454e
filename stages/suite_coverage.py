"""suite_coverage@suite: the coverage matrix of one suite over every (dtype, provider) cell in
params: coverage/<suite>.csv (op x provider/dtype -> status, support and pass rates) and
coverage/<suite>.json (the same with reasons, max_abs histograms and latency ratios: the input of
parity.suites.render.render_coverage_html). Light: no numpy, no torch.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from parity.config import params as config
from parity.config import schema
from parity.backends import load_runner
from parity.core.io import write_json, write_text
from parity.suites import coverage, spec


def main(argv=None) -> int:
    ap = config.stage_parser("stages.suite_coverage", __doc__)
    for k in ("suite", "diff", "timing", "out"):
        ap.add_argument(f"--{k}", required=True)
    a = ap.parse_args(argv)
    p = spec.load_or_die(a.params)  # and the selected suites checked
    cells = list(itertools.product(p["dtypes"], p["providers"]))
    onnx = [n for n, prov in p["providers"].items()
            if load_runner(prov["runner"], prov.get("import")).onnx_based]
    cov = coverage.build(a.suite, cells, Path(a.diff), Path(a.timing),
                         schema.of(p).suites_run.onnx_opset, onnx)
    out = Path(a.out)
    write_json(out / f"{a.suite}.json", cov, sort_keys=False)
    write_text(out / f"{a.suite}.csv", coverage.to_csv(cov))
    sup = ", ".join(f"{k}={v:.0%}" for k, v in cov["support_by_provider"].items() if v is not None)
    print(f"suite_coverage@{a.suite}: {len(cov['ops'])} ops, {len(cov['rows'])} cases x {len(cov['columns'])} cells; support: {sup}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
