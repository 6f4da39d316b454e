"""`parity` command line.

  parity check [--params params.yaml]      validate params.yaml (what `dvc repro` will run)
  parity compose [-S override ...]         compose conf/ into params.yaml exactly as `dvc exp run`
                                            does (same DVC function, same Hydra plugin), then validate
  parity compare REV_A [REV_B]             per-cell verdict/metric changes between revisions
                                            (REV_B defaults to the workspace)
  parity sweep 'dtypes=fp32,fp16,bf16' ... one DVC experiment per combination, a compact table
  parity exp [--md] [-n N] [--all-params]  dvc exp show narrowed to what differs (parity/expview.py)
  parity repro -j N [--provider P ...]     dvc repro with N cells at once (shared stages first)
  parity suite list|validate SUITE ...     expand an op/module suite (conf/suites) without running it
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _check(args) -> int:
    from parity import config

    try:
        p = config.load(args.params)
    except config.ConfigError as e:
        config.die(e)
    print(f"parity: {args.params} OK: {config.summary_line(p)}")
    return 0


def _compose_error(e: Exception) -> str:
    """The message of a failed composition: parity's own (one line) as it is; Hydra's and
    OmegaConf's without their "full_key:" / "object_type=" context lines."""
    msg = str(e)
    i = msg.find("parity: config error:")
    lines = [ln for ln in msg[max(i, 0):].splitlines()
             if not ln.strip().startswith(("full_key:", "object_type=", "reference_type="))]
    return ("" if i >= 0 else "parity: config error: ") + " ".join(ln.strip() for ln in lines)


def _compose(args) -> int:
    import tempfile

    from dvc.utils.hydra import compose_and_dump

    from parity import config
    from parity.io import write_text

    root = Path(args.root).resolve()
    # compose to a temp file first: a bad override leaves params.yaml untouched
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td) / "params.yaml"
        try:
            compose_and_dump(tmp, str(root / "conf"), None, "config", str(root), list(args.override))
        except Exception as e:  # Hydra/OmegaConf raise several types; all mean a bad config
            print(_compose_error(e), file=sys.stderr)
            return 2
        try:
            p = config.load(tmp)
        except config.ConfigError as e:
            config.die(e)
        write_text(root / args.params, tmp.read_text())
    print(f"parity: composed conf/ -> {args.params}: {config.summary_line(p)}")
    return 0


def _compare(args) -> int:
    from parity.history import compare

    try:
        rc = compare(args.rev_a, args.rev_b, show_all=args.all, fail_on_regression=args.fail_on_regression)
        if args.html:
            from parity.report_compare import write_page

            print(f"parity compare: wrote {write_page(args.rev_a, args.rev_b, args.html)}")
        return rc
    except RuntimeError as e:
        print(f"parity compare: {e}", file=sys.stderr)
        return 2


def _sweep(args) -> int:
    from parity.sweep import sweep

    try:
        return sweep(args.override, jobs=args.jobs)
    except (RuntimeError, ValueError) as e:
        print(f"parity sweep: {e}", file=sys.stderr)
        return 2


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["suite"]:  # its own parser (parity.suites.cli): list / validate
        from parity.suites.cli import main as suite_main

        return suite_main(argv[1:])
    ap = argparse.ArgumentParser(prog="parity", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="validate params.yaml")
    c.add_argument("--params", default="params.yaml")
    c.set_defaults(fn=_check)
    c = sub.add_parser("compose", help="compose conf/ into params.yaml (as dvc exp run does)")
    c.add_argument("-S", "--set", dest="override", action="append", default=[],
                   help="Hydra override, e.g. -S 'models=[mlp]' -S dtypes.fp16.tol.atol=1e-3")
    c.add_argument("--params", default="params.yaml")
    c.add_argument("--root", default=".")
    c.set_defaults(fn=_compose)
    c = sub.add_parser("compare", help="what changed per cell between two revisions (dvc metrics diff)")
    c.add_argument("rev_a", help="baseline revision, e.g. HEAD~1 or main")
    c.add_argument("rev_b", nargs="?", help="revision to compare (default: the workspace)")
    c.add_argument("--all", action="store_true", help="list unchanged cells too")
    c.add_argument("--fail-on-regression", action="store_true",
                   help="exit 1 if a cell passed in REV_A and does not in REV_B")
    c.add_argument("--html", metavar="OUT", help="also write a page with both revisions' per-layer curves per cell")
    c.set_defaults(fn=_compare)
    from parity import parallel

    c = sub.add_parser("repro", help="dvc repro with N independent cells at once (DVC has no jobs flag)",
                       description=parallel.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parallel.add_arguments(c)
    c.set_defaults(fn=parallel.run_from_args)
    sub.add_parser("suite", help="list|validate SUITE ...: expand an op/module suite without running it")
    from parity import expview

    c = sub.add_parser("exp", help="dvc exp show narrowed: differing params, totals, one verdict per cell",
                       description=expview.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    expview.add_arguments(c)
    c.set_defaults(fn=expview.run_from_args)
    c = sub.add_parser("sweep", help="queue one DVC experiment per combination and tabulate them")
    c.add_argument("override", nargs="+", help="Hydra overrides; comma lists are swept, e.g. 'dtypes=fp32,fp16'")
    c.add_argument("-j", "--jobs", type=int, default=1, help="queue workers (default 1)")
    c.set_defaults(fn=_sweep)
    args = ap.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    raise SystemExit(main())
