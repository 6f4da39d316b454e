"""The argument parser every stage starts from, apart from params' validation (parity.config.params
re-exports it): a stage that only publishes files another stage made (reference@, baseline@ after the
export, parity.pipeline.publish) starts without loading the config code (~0.1 s)."""

from __future__ import annotations

import argparse
import errno
import os
import sys

PARAMS_FILE = "params.yaml"
FULL = (errno.ENOSPC, errno.EDQUOT)


def _one_line_full_disk(prog: str):
    """sys.excepthook for a stage: a full disk (ENOSPC, EDQUOT), or an error marked `one_line`, is one line
    naming the stage, exit 1; anything else keeps Python's traceback. Outputs are written to a temp file renamed into place
    (parity.core.io.atomic_path), so nothing partial was published (issue 36 item 8)."""
    previous = sys.excepthook

    def hook(kind, exc, tb):
        if getattr(exc, "one_line", False):  # an error that says all (parity.core.codedeps.CodeDepsError)
            print(f"{prog}: {exc}", file=sys.stderr)
            return None
        if not (isinstance(exc, OSError) and exc.errno in FULL):
            return previous(kind, exc, tb)
        where = f" writing {exc.filename}" if exc.filename else ""
        print(f"{prog}: {os.strerror(exc.errno).lower()}{where}: free space on the disk of {os.getcwd()} "
              f"(`df -h .`; DVC's cache is there too) and re-run; nothing partial was published", file=sys.stderr)
    return hook


def stage_parser(module: str, doc: str | None, cell: bool = False):
    """The argument parser every stage starts from: --params, plus --model/--dtype/--provider for
    per-cell stages."""
    ap = argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default=PARAMS_FILE, help="the composed config (default: %(default)s)")
    sys.excepthook = _one_line_full_disk(ap.prog)
    if cell:
        for k in ("model", "dtype", "provider"):
            ap.add_argument(f"--{k}", required=True)
    return ap
