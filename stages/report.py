"""report: one summary across every configured cell (read from params, not globbed: dvc.lock keeps
stages that left the matrix). Writes report.md, report.html (self-contained: inline SVG, no
scripts, no network), summary.json (the DVC metric: totals and per cell its verdict, worst error
ratio and drift origin, parity.core.metrics; byte-stable, so `dvc metrics diff` shows no timing noise) and latency.json (a plain output: measured latency per cell, its ratio to
torch_cpu fp32). With `strict: true`, fails naming every cell that did not run (UNAVAILABLE,
UNSUPPORTED, EXPORT_FAIL, INFER_FAIL) and every NOT_EXERCISED cell with its evidence."""

from __future__ import annotations

import sys
from pathlib import Path

from parity.config import params as config
from parity.config import schema
from parity.core import status
from parity.core.io import Corrupt
from parity.pipeline.report import write_report


def main(argv=None) -> int:
    ap = config.stage_parser("stages.report", __doc__)
    ap.add_argument("--artifacts", default="artifacts")
    ap.add_argument("--out", default="artifacts/report")
    a = ap.parse_args(argv)
    p = config.load_or_die(a.params)
    out = Path(a.out)

    try:
        summary, cells = write_report(p, Path(a.artifacts), out)
    except Corrupt as e:  # an input artifact that does not parse: named, with how to recover it
        print(f"report: {e}", file=sys.stderr)
        return 1
    print(f"report: {summary['cells']} cells, {summary['passed']} pass, {summary['failed']} fail, "
          f"{summary['not_run']} not run"
          + "".join(f", {summary[k]} {k.replace('_', ' ')}" for k in ("baseline", "not_exercised") if summary.get(k))
          + f" -> {out}/report.html")
    for c in cells:
        m = c["metrics"]
        w, o = m.get("worst_ratio"), m.get("drift_origin")  # one scale (excess/limit); an origin only where one is
        print(f"  {c['key']:40s} {m.get('verdict', 'MISSING'):12s} worst excess/limit "
              f"{format(w, '.3g') if isinstance(w, (int, float)) else w or '-'}" + (f", drift origin {o}" if o else ""))
    not_run = [c["key"] + f" ({c['metrics'].get('verdict')})" for c in cells
               if c["metrics"].get("verdict") not in status.VERDICTS]
    unexercised = [c["key"] + f" ({(c['metrics'].get('precision') or {}).get('evidence', '')})" for c in cells
                   if c["metrics"].get("verdict") in status.STRICT_FAILS]
    if schema.of(p).strict and (not_run or unexercised):
        if not_run:
            print("report: strict: true and these cells did not run: " + ", ".join(not_run), file=sys.stderr)
        if unexercised:
            print("report: strict: true and these cells did not compute in their precision (NOT_EXERCISED): "
                  + "; ".join(unexercised), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
