"""The argument parser every stage starts from, apart from params' validation (parity.config.params
re-exports it): a stage that only publishes files another stage made (reference@, baseline@ after the
export, parity.pipeline.publish) starts without loading the config code (~0.1 s)."""

from __future__ import annotations

import argparse

PARAMS_FILE = "params.yaml"


def stage_parser(module: str, doc: str | None, cell: bool = False):
    """The argument parser every stage starts from: --params, plus --model/--dtype/--provider for
    per-cell stages."""
    ap = argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default=PARAMS_FILE, help="the composed config (default: %(default)s)")
    if cell:
        for k in ("model", "dtype", "provider"):
            ap.add_argument(f"--{k}", required=True)
    return ap
