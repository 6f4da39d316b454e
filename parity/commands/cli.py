"""`parity` command line.

  parity check [--params params.yaml]      validate params.yaml (what `dvc repro` will run)
  parity compose [-S override ...]         compose conf/ into params.yaml exactly as `dvc exp run`
                                            does (same DVC function, same Hydra plugin), then validate
  parity compare REV_A [REV_B]             per-cell verdict/metric changes between revisions
                                            (REV_B defaults to the workspace)
  parity sweep 'dtypes=fp32,fp16,bf16' ... one DVC experiment per combination (DVC's Hydra sweep
                                            grammar), live progress, a compact table
  parity exp [--md] [-n N] [--all-params]  dvc exp show narrowed to what differs (parity/commands/expview.py)
  parity repro -j N [--provider P ...]     dvc repro with N cells at once (shared stages first)
  parity repro --cluster ADDRESS           the cells on a Ray cluster, results through the DVC remote
  parity worker --address HEAD             join a Ray cluster advertising this node's providers
  parity show CELL                         one cell: verdict, drift origin, failing layers with
                                            mismatch counts and worst elements
  parity list models|dtypes|providers|suites   the options of a conf/ group
  parity suite list|validate|show|import-opdiff|import-onnx ...  expand a suite, show a case, convert opdiff, import ONNX node tests
  parity fuzz SUITE --dtype D --provider P  seeded fuzz campaign; --reproduce ID, --minimise ID (fuzz_cli)
  parity completion bash|zsh               a shell completion script (shtab)
  parity deps --write | --check            dvc.yaml's code deps = each stage's import closure
                                            (write them / exit 1 naming stale stages: CI runs it)

--json (check, compare, sweep, show, list) prints one JSON document on stdout: docs/cli-json.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from parity import __version__
from parity.commands import lockfile, remote_check
from parity.core.io import write_text
from parity.core.ui import at_least, dump_json


def _check(args) -> int:
    # lazy: `parity check` only; parity.config.params +0.03 s (BENCHMARKS 22)
    from parity.config import params as config
    from parity.suites import spec  # lazy: `parity check` only; parity.suites.spec +0.03 s (BENCHMARKS 22)

    try:
        p = config.load(args.params)
        spec.check_selected(p)
    except (config.ConfigError, spec.SuiteError) as e:
        if args.json:
            dump_json({"params": args.params, "ok": False, "error": str(e)})
        config.die(e)
    warnings = remote_check.remote_warnings(os.path.dirname(os.path.abspath(args.params)))
    for line in warnings:
        print(line, file=sys.stderr)
    if args.json:
        dump_json({"params": args.params, "ok": True, "models": list(p["models"]), "dtypes": list(p["dtypes"]),
                   "providers": list(p["providers"]), "cells": len(config.cells(p)), "warnings": warnings})
        return 0
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
    from dvc.utils.hydra import compose_and_dump  # lazy: dvc.repo +0.29 s (BENCHMARKS 22), `parity compose` only

    # lazy: `parity compose` only; parity.config.params +0.03 s (BENCHMARKS 22)
    from parity.config import params as config

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
    if args.params == "params.yaml" and (root / "dvc.yaml").exists():  # the params dvc.yaml reads
        dropped = lockfile.prune(root)
        if dropped:
            print(f"parity: dvc.lock: dropped {len(dropped)} entr{'y' if len(dropped) == 1 else 'ies'} of stages "
                  f"the pipeline no longer has ({', '.join(dropped[:3])}{', ...' if len(dropped) > 3 else ''}; "
                  "DVC's run-cache restores them if they come back)")
    return 0


def _compare(args) -> int:
    # lazy: `parity compare` only; parity.commands.history +0.30 s (BENCHMARKS 22)
    from parity.commands.history import compare

    try:
        rc = compare(args.rev_a, args.rev_b, show_all=args.all, fail_on_regression=args.fail_on_regression,
                     as_json=args.json, providers=args.provider, models=args.model)
        if args.html:
            # lazy: `parity compare` only; parity.commands.report_compare +0.42 s (BENCHMARKS 22)
            from parity.commands.report_compare import write_page

            # on stderr with --json, so stdout stays one JSON document
            print(f"parity compare: wrote {write_page(args.rev_a, args.rev_b, args.html)}",
                  file=sys.stderr if args.json else sys.stdout)
        return rc
    except RuntimeError as e:
        print(f"parity compare: {e}", file=sys.stderr)
        return 2


def _sweep(args) -> int:
    from parity.commands.sweep import sweep  # lazy: `parity sweep` only; parity.commands.sweep +0.47 s (BENCHMARKS 22)

    try:
        return sweep(args.override, jobs=args.jobs, as_json=args.json)
    except (RuntimeError, ValueError) as e:
        print(f"parity sweep: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("parity sweep: stopped watching; queued experiments keep running in DVC's queue "
              "(`dvc queue status`, `dvc queue kill NAME`, `dvc exp show`)", file=sys.stderr)
        return 130


def _show(args) -> int:
    # lazy: `parity show` only; parity.commands.show +0.10 s (BENCHMARKS 22)
    from parity.commands.show import ShowError, show

    try:
        return show(args.cell, as_json=args.json, all_layers=args.all)
    except ShowError as e:
        print(f"parity show: {e}", file=sys.stderr)
        return 2


def _list(args) -> int:
    # lazy: `parity list` only; parity.commands.listing +0.04 s (BENCHMARKS 22)
    from parity.commands.listing import ListError, show

    try:
        return show(args.group, args.root, as_json=args.json)
    except ListError as e:
        print(f"parity list: {e}", file=sys.stderr)
        return 2


def _completion(args) -> int:
    import shtab  # lazy: +0.06 s (BENCHMARKS 22), `parity completion` only

    print(shtab.complete(parser(), shell=args.shell))
    return 0


def _version() -> str:
    try:
        return version("parity")
    except PackageNotFoundError:
        return __version__


def _repro(args) -> int:
    if args.cluster:  # Ray is imported only here (the optional parity[cluster] extra)
        # lazy: `parity suite|fuzz` skip the parser; parity.commands.cluster +0.23 s (BENCHMARKS 22)
        from parity.commands import cluster

        return cluster.run_from_args(args)
    # lazy: `parity suite|fuzz` skip the parser; parity.commands.parallel +0.06 s (BENCHMARKS 22)
    from parity.commands import parallel

    return parallel.run_from_args(args)


def _json_flag(c: argparse.ArgumentParser) -> None:
    c.add_argument("--json", action="store_true", help="one JSON document on stdout (docs/cli-json.md)")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="parity", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"parity {_version()}")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    c = sub.add_parser("check", help="validate params.yaml")
    c.add_argument("--params", default="params.yaml")
    _json_flag(c)
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
    c.add_argument("--provider", action="append", default=[], metavar="P", help="only cells of provider P (repeatable)")
    c.add_argument("--model", action="append", default=[], metavar="M", help="only cells of model M (repeatable)")
    _json_flag(c)
    c.set_defaults(fn=_compare)
    _add_run_commands(sub)
    _add_result_commands(sub, at_least)
    return ap


def _add_run_commands(sub) -> None:
    """repro (local or on a cluster) and worker."""
    # lazy: `parity suite|fuzz` skip the parser; parity.commands.parallel +0.06 s (BENCHMARKS 22)
    from parity.commands import parallel

    c = sub.add_parser("repro", help="dvc repro with N independent cells at once (DVC has no jobs flag)",
                       description=parallel.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parallel.add_arguments(c)
    c.add_argument("--cluster", metavar="ADDRESS", help="run the cells on a Ray cluster (`auto`: the local "
                   "instance); needs parity[cluster] and a DVC remote every node reaches (docs/cluster.md)")
    # lazy: `parity suite|fuzz` skip the parser; parity.commands.cluster +0.23 s (BENCHMARKS 22)
    from parity.commands.cluster import add_timeout_argument

    add_timeout_argument(c)
    c.set_defaults(fn=_repro)
    c = sub.add_parser("worker", help="join a Ray cluster advertising this node's providers (parity[cluster])")
    # lazy: `parity suite|fuzz` skip the parser; parity.commands.cluster +0.23 s (BENCHMARKS 22)
    from parity.commands.cluster import add_worker_arguments

    add_worker_arguments(c)


def _add_result_commands(sub, at_least) -> None:
    """show, list, suite, fuzz, exp, sweep, completion, deps."""
    c = sub.add_parser("show", help="one cell: verdict, drift origin, failing layers and their worst elements")
    c.add_argument("cell", help="model-dtype-provider, e.g. resnet18-fp16-ort_cpu")
    c.add_argument("--all", action="store_true", help="every layer outside atol/rtol, not only the worst 10")
    _json_flag(c)
    c.set_defaults(fn=_show)
    c = sub.add_parser("list", help="the options of a conf/ group (* = selected in params.yaml)")
    c.add_argument("group", choices=["models", "dtypes", "providers", "suites"])
    c.add_argument("--root", default=".", help="the project root (default: .)")
    _json_flag(c)
    c.set_defaults(fn=_list)
    sub.add_parser("suite", help="list|validate SUITE ...: expand an op/module suite without running it",
                   add_help=False)
    sub.add_parser("fuzz", help="SUITE --dtype D --provider P: fuzz a suite's cases; --reproduce/--minimise ID",
                   add_help=False)
    # lazy: `parity suite|fuzz` skip the parser; parity.commands.expview +0.02 s (BENCHMARKS 22)
    from parity.commands import expview

    c = sub.add_parser("exp", help="dvc exp show narrowed: differing params, totals, one verdict per cell",
                       description=expview.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    expview.add_arguments(c)
    c.set_defaults(fn=expview.run_from_args)
    c = sub.add_parser("sweep", help="queue one DVC experiment per combination and tabulate them")
    c.add_argument("override", nargs="+",
                   help="Hydra overrides in DVC's sweep grammar, e.g. 'dtypes=fp32,fp16' 'models=[mlp],[resnet18]'")
    c.add_argument("-j", "--jobs", type=at_least(1), default=1, help="queue workers (default 1)")
    _json_flag(c)
    c.set_defaults(fn=_sweep)
    c = sub.add_parser("completion", help="print a shell completion script: eval \"$(parity completion bash)\"")
    c.add_argument("shell", choices=["bash", "zsh", "tcsh"])
    c.set_defaults(fn=_completion)
    c = sub.add_parser("deps", help="write or check dvc.yaml's code deps (each stage's import closure)")
    g = c.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true", help="rewrite the code entries of every stage's deps")
    g.add_argument("--check", action="store_true", help="exit 1 naming each stage whose code deps are stale")
    c.add_argument("--root", default=".", help="the project root (default: .)")
    c.set_defaults(fn=_deps)


def _deps(args) -> int:
    from parity.commands import stagedeps  # lazy: `parity deps` only; parity.commands.stagedeps +0.03 s (BENCHMARKS 22)

    return stagedeps.main(args)


def _main(argv: list[str]) -> int:
    if argv[:1] == ["suite"]:  # its own parser (parity.commands.suite_cli): list / validate
        # lazy: `parity suite` only; parity.commands.suite_cli +0.04 s (BENCHMARKS 22)
        from parity.commands.suite_cli import main as suite_main

        return suite_main(argv[1:], prog="parity suite")
    if argv[:1] == ["fuzz"]:  # its own parser (parity.commands.fuzz_cli): campaign / --reproduce / --minimise
        # lazy: `parity fuzz` only; parity.commands.fuzz_cli +0.21 s (BENCHMARKS 22)
        from parity.commands.fuzz_cli import main as fuzz_main

        return fuzz_main(argv[1:])
    args = parser().parse_args(argv)
    return args.fn(args)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        rc = _main(argv)
        sys.stdout.flush()
        return rc
    except BrokenPipeError:
        # the reader went away (`parity list models | head -1`): no traceback, and no second error
        # when Python flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by it


if __name__ == "__main__":
    raise SystemExit(main())
