"""fuzz@suite-dtype-provider: a seeded fuzz campaign over a suite's cases on one provider at one dtype
(parity.analysis.fuzz_campaign): `fuzz.cases` cases from `fuzz.seed`, run in the suite worker pool and
judged with the suite's tolerances.

Writes, under --out: campaign.json (counts, every case's row) and failures.parquet (each failure with
its seed and the full case); --timing gets wall time and cases/s (measured, so kept apart). This
process never imports torch unless the suite has OpInfo cases to convert.
"""

from __future__ import annotations

from pathlib import Path

from parity.config import params as config
from parity.analysis import fuzz_campaign
from parity.core.io import exit_now, write_json
from parity.suites import spec


def main(argv=None) -> int:
    ap = config.stage_parser("stages.fuzz", __doc__)
    for k in ("suite", "dtype", "provider", "out", "timing"):
        ap.add_argument(f"--{k}", required=True)
    a = ap.parse_args(argv)
    p = spec.load_or_die(a.params)  # and the selected suites checked
    f = fuzz_campaign.settings(p)
    try:
        section = spec.load_section(a.suite)[0]
        rows, failures, stats = fuzz_campaign.campaign(p, a.suite, section, a.dtype, a.provider, f)
    except spec.SuiteError as e:
        config.die(e)
    s = fuzz_campaign.write_campaign(Path(a.out), a.suite, a.dtype, a.provider, f, rows, failures)
    write_json(a.timing, stats)
    print(f"fuzz@{a.suite}-{a.dtype}-{a.provider}: {s['cases']} cases in {stats['wall_s']:.1f} s "
          f"({stats['cases_per_s']:.1f} cases/s), {s['failures']} failures: "
          + ", ".join(f"{k}={v}" for k, v in s["counts"].items()))
    for r in failures[:10]:
        print(f"  {r['id']}  seed {r['seed']}  {r['status']}  {r['reason'][:100]}")
    exit_now(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
