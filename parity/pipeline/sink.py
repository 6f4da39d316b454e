"""Where the capture and baseline stages put a cell's values as the runner makes them: layers.parquet
and own.parquet written sample by sample (parity.core.store.Writer: row groups of a bounded size) and the
oracle's sums (oracle_sums.json) added up as they go, so a stage holds one sample of values and of
the fp64 reference at a time, not every sample of both (issue 23: a 1B decoder's capture).

The files hold what the whole-result writes gave: layers.parquet every row of an OK cell (none
otherwise), own.parquet (only when every sample's own values were measured) the same values, each
stored against its fp64 reference value (`base:` / `xor:`, parity.core.store), and oracle_sums.json
equals parity.analysis.sums.compute over the same values."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from parity.core import store
from parity.analysis import sums
from parity.backends.capture_driver import CaptureSink
from parity.backends.runner import CaptureResult


class StoreSink(CaptureSink):
    """`out`/layers.parquet, own.parquet and oracle_sums.json of one capture (or baseline: `plain`
    False keeps the plain graph's outputs out of layers.parquet, as the baseline always did)."""

    def __init__(self, out: Path, layers_meta: dict, own_meta: dict, with_sums: bool, plain: bool = True,
                 base_dir: Path | None = None, base_path: Path | None = None, background: bool = False):
        """own.parquet's `base` is the fp64 reference's path (`base_path`, default the file read) relative
        to `base_dir` (default `out`): the fp32 baseline made with the reference is written for the
        folders it will be published in (parity.pipeline.fold). `background`: row groups encoded on a
        thread while the next values are computed (store.Writer), where memory is to spare."""
        self.out, self.own_meta, self.plain, self.background = Path(out), own_meta, plain, background
        self.base_dir = Path(base_dir) if base_dir is not None else self.out
        self.base_path = base_path
        self.layers = store.Writer(self.out / "layers.parquet", layers_meta, background=background)
        self.own_w: store.Writer | None = None
        self.acc = sums.Acc() if with_sums else None
        self.wants_gold = with_sums
        self.first_layers = None  # layers of the first sample (the status line's count)

    def sample(self, k, named, gold):
        rows = store.rows_from(k, named)
        if self.first_layers is None:
            self.first_layers = sum(1 for t in rows if not store.is_output(t.name))
        self.layers.extend(t for t in rows if self.plain or not t.name.startswith(store.PLAIN))
        if self.acc is not None and gold is not None:
            self.acc.add(k, named, gold)

    def extra_gold(self, k, gold):
        if self.acc is not None:
            self.acc.add_gold(k, gold)

    def own(self, k, named, gold):
        """Each value written and summed, then dropped from `named` (the list is emptied): the sample's
        own values shrink as they go instead of being held whole till the last one is summed."""
        base = gold.rows.path if isinstance(gold, store.SampleRows) else None
        base = self.base_path if base is not None and self.base_path is not None else base
        if self.own_w is None:
            meta = dict(self.own_meta, base=os.path.relpath(os.path.abspath(base), os.path.abspath(self.base_dir))) \
                if base is not None else self.own_meta
            self.own_w = store.Writer(self.out / "own.parquet", meta, background=self.background)
        if self.acc is not None:
            self.acc.own_names(k, [n for n, _ in named])
        named.reverse()
        i = 0
        while named:
            n, v = named.pop()
            self.own_w.add(_against(store.Tensor(k, n, i, v), gold) if base is not None else store.Tensor(k, n, i, v))
            if self.acc is not None:
                self.acc.own_value(k, i, n, v, gold)
            i += 1

    def finish_cell(self, res: CaptureResult, key: str) -> tuple[dict, int]:
        """`finish`, or when the shapes ran one by one after a failure (parity.pipeline.shapes: their values
        are in res.samples, not here), those written whole; (own error's status entry, layers of the
        first sample that ran)."""
        if not res.samples:
            own = self.finish(res)
            return own, (self.first_layers or 0) if res.status == "OK" else 0
        rows = [t for k, named in enumerate(res.samples) for t in store.rows_from(k, named)]
        store.write(self.out / "layers.parquet", rows, {"cell": key, "status": res.status})
        first = min((t.sample for t in rows), default=0)  # sample 0's shape may have failed
        n_layers = sum(1 for t in rows if t.sample == first and not store.is_output(t.name))
        own = write_own(self.out / "own.parquet", res, key)
        (self.out / sums.FILE).unlink(missing_ok=True)
        return own, n_layers

    def finish(self, res: CaptureResult, keep_layers: bool = False) -> dict:
        """Publish or drop each file by the result; the status entry of own error (as write_own)."""
        ok = res.status == "OK"
        if ok or keep_layers:
            self.layers.publish()
        else:  # a failed cell: an empty layers.parquet with its status, as before
            self.layers.abort()
            store.write(self.out / "layers.parquet", [], {**self.layers.metadata, "status": res.status})
        measured = ok and self.own_w is not None and not res.own_reason
        if measured:
            self.own_w.publish()
        else:
            if self.own_w is not None:
                self.own_w.abort()
            (self.out / "own.parquet").unlink(missing_ok=True)
        if self.acc is not None and ok:
            if not measured:
                self.acc.drop_own()
            sums.write_json(self.out / sums.FILE, self.acc.doc())
        else:
            (self.out / sums.FILE).unlink(missing_ok=True)
        if measured:
            return {"measured": True, "skipped": res.own_skipped}
        return {"measured": False, "reason": res.own_reason or res.reason or res.status}

    def abort(self) -> None:
        """Drop everything handed so far (the shapes fallback re-runs the cell shape by shape)."""
        self.layers.abort()
        if self.own_w is not None:
            self.own_w.abort()


def write_own(path: Path, res: CaptureResult, key: str) -> dict:
    """own.parquet from the runner's own values (removed when there are none); the status entry."""
    if res.status != "OK" or res.own is None:
        path.unlink(missing_ok=True)
        return {"measured": False, "reason": res.own_reason or res.reason or res.status}
    rows = [store.Tensor(k, n, i, v) for k, named in enumerate(res.own) for i, (n, v) in enumerate(named)]
    store.write(path, rows, {"cell": key, "kind": "own"})
    return {"measured": True, "skipped": res.own_skipped}



def _against(t: store.Tensor, gold: store.SampleRows) -> store.Tensor:
    """An own value stored against its fp64 reference value cast to the value's dtype: as a reference
    to it (`base:<name>`) when byte for byte the same (a leaf fed straight by another leaf:
    `between:<leaf>` is the cast reference input; ReLU or max-pool on the cast input give the cast
    reference output), else as its bits XOR the cast's (`xor:<name>`: an own value is within a few
    units in the last place of it, so the high bytes are zero and compress away). The reader undoes
    it with the reference (store.Rows). resnet50's own.parquet: 515 -> 23 MB (BENCHMARKS.md 17d)."""
    ref, v = store.own_reference_name(t.name), np.asarray(t.array)
    if ref not in gold or gold.shape(ref) != v.shape or v.dtype.str not in ("<f2", "<f4", "<f8"):
        return t
    g = gold[ref]
    if g.dtype.kind != "f":
        return t
    cast = g.astype(v.dtype)
    if store.same_bytes(cast, v):
        return store.Tensor(t.sample, t.name, t.order, v, store.BASE + ref)
    return store.Tensor(t.sample, t.name, t.order, store.xor_bits(v, cast), store.XOR + ref)
