"""Files one stage made for another, published into that stage's folder (no torch imported here).

The torch work of a model runs in one process (the export stage: export, the reference, the fp32
baseline; parity.pipeline.fold). It stages what the reference and baseline stages write in folders of
its own, each with a FOLD_FILE naming the folder it was made for; those stages publish the files into
their own folder when it matches, else compute them themselves. A file is published as a hard link
where the filesystem allows (one copy of the bytes on disk, and DVC's state knows the inode, so it
hashes them once; nothing in the pipeline writes a file in place), else as a copy.

Importing this module loads no numpy or pyarrow: the publishing stages start in ~0.1 s (BENCHMARKS.md
17g; tests/test_light_stages.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from parity.core.io import TMP_SUFFIX, atomic_path, read_json, write_json

FOLD_FILE = "fold.json"  # in a staging folder: {"for": the folder it was made for}
# the fp32 baseline is torch CPU eager at float32 in cast mode: the reference's own precision
FOLD_DTYPE = "fp32"
FOLD_CFG = {"torch": "float32", "mode": "cast"}
FOLD_DIR = "baseline-fp32"  # under the reference's folder: the fp32 baseline's staging folder
STAGING = "reference"  # under the export's folder: the reference's staging folder


def folds(dtype: str, dc: dict) -> bool:
    """Whether baseline@<model>-`dtype` is the fp32 baseline made with the reference."""
    from parity.config import schema  # lazy: dataclasses only where a baseline stage asks

    return dtype == FOLD_DTYPE and dc.get("torch") == FOLD_CFG["torch"] and schema.mode(dc) == FOLD_CFG["mode"]


def stage_for(staging: Path, target: Path, by: str) -> None:
    """Mark `staging` as made for `target` by stage `by` (e.g. export@mlp)."""
    write_json(Path(staging) / FOLD_FILE, {"for": str(target), "by": by})


def made_by(staging: Path) -> str:
    """The stage that made `staging`."""
    return read_json(Path(staging) / FOLD_FILE).get("by", "")


def made_for(staging: Path, target: Path) -> bool:
    """Whether `staging` holds files made for `target`."""
    f = Path(staging) / FOLD_FILE
    return f.is_file() and read_json(f).get("for") == str(target)


def publish_tree(staging: Path, out: Path) -> int:
    """Every file under `staging` (its own FOLD_FILE excepted) at the same relative path under `out`;
    how many."""
    staging, out, n = Path(staging), Path(out), 0
    for f in sorted(staging.rglob("*")):
        if f.is_file() and f != staging / FOLD_FILE and not f.name.endswith(TMP_SUFFIX):
            dst = out / f.relative_to(staging)
            dst.parent.mkdir(parents=True, exist_ok=True)
            publish(f, dst)
            n += 1
    return n


def publish(src: Path, dst: Path) -> None:
    """`src` at `dst`, atomically: a hard link where the filesystem allows, else a copy."""
    if dst.exists() and os.path.samefile(src, dst):
        return  # the same file already (rename() of two links to one file does nothing, leaving tmp)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}{TMP_SUFFIX}")
    try:
        tmp.unlink(missing_ok=True)
        os.link(src, tmp)
        os.replace(tmp, dst)
    except OSError:
        tmp.unlink(missing_ok=True)
        with atomic_path(dst) as t:
            shutil.copyfile(src, t)


# the fp64 reference's decoded bytes per SA byte (fp32 values of every leaf output): twice the width,
# plus the `pre:` inputs not stored once (measured 1.17-1.18: resnet18, bert_base), with a margin
FP64_PER_SA = 2.4


def keep_mb(weight_bytes: int | None, sa_bytes: int | None) -> float | None:
    """How many MB of the fp64 reference its writer keeps decoded for the baseline (gold_rows' bound),
    or None when the reference is expected not to fit it: values kept while they are written and
    dropped at the bound would sit on top of the reference's peak for nothing (resnet50: +256 MB)."""
    # lazy: numpy + pyarrow (+0.3 s) for the stages that compute, not for those that publish
    from parity.backends.loader import WHOLE_MAX_MB
    # lazy: numpy + pyarrow (+0.3 s) for the stages that compute, not for those that publish
    from parity.core import store

    bound = min(max((weight_bytes or 0) / 2**20, store.KEEP_MB), WHOLE_MAX_MB)
    return bound if sa_bytes is not None and FP64_PER_SA * sa_bytes / 2**20 <= bound else None


def publish_fold(reference_dir: Path, dtype: str, dc: dict, out: Path) -> str | None:
    """baseline@<model>-fp32: the fp32 baseline made with the reference (parity.pipeline.fold) published
    into `out` (None when there is none made for `out`, or `dtype` is not the fold's precision: the
    stage then runs the baseline itself)."""
    staging = Path(reference_dir) / FOLD_DIR
    if not folds(dtype, dc) or not made_for(staging, out):
        return None
    publish_tree(staging, out)
    return f"baseline@{read_json(out / 'status.json')['baseline']}: made by {made_by(staging)} with the reference -> {out}"


def background_ok(weight_bytes: int | None) -> bool:
    """Whether the fold's writers encode in the background (store.Writer background): such a writer
    holds up to ~3 more row groups for the time of one (~100 MB at the 32 MB buffer), used where that is
    at most a quarter of W, which the bound (3 W + 1 GiB) scales with: bert_base's export 1.87 -> 2.07
    GiB against 2.22, resnet18's 0.98 -> 1.11 GiB against 1.13 (too close: not there; BENCHMARKS 17g)."""
    # lazy: numpy + pyarrow (+0.3 s) for the stages that compute, not for those that publish
    from parity.core import store

    return (weight_bytes or 0) >= 4 * 3 * store.buffer_bytes()
