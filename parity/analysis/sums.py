"""The oracle's squared-error sums, computed where the values are made and stored beside them.

The oracle verdict (parity.core.oracle) needs, per layer and sample, the squared error of the
values against the fp64 reference, the number of non-finite errors, the element count and the
squared fp64 values: sums that do not depend on any tolerance or diff setting. The capture and
baseline stages hold the values and the fp64 reference in memory anyway (the reference feeds the
own-error run), so they write these sums to `oracle_sums.json` next to layers.parquet and own.parquet.
The diff stage then judges every layer from the two small files instead of reading the fp64
reference and both own.parquet files again (about 550 of the 670 MB it read for resnet18); it reads
those arrays only to explain a drift origin, or when a producer wrote no sums (older artifacts).

The sums come from the same functions on the same arrays as the diff's own computation
(parity.core.compare.sq_error, sum_sq), one entry per sample, added in sample order by `sq`: the verdicts
and metrics are the same bytes either way (tests/test_oracle_sums.py). JSON keeps every float
exactly (repr round-trips). numpy only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from parity.core import store
from parity.core.oracle import Sq, has_baseline
from parity.core.compare import sq_error, sum_sq_max
from parity.core.io import read_json, write_json

FILE = "oracle_sums.json"
VERSION = 2  # 2: ref_max, the largest |fp64| value per reference tensor and sample (the scale floor)


def _shape(a: np.ndarray) -> tuple:
    return np.shape(a) or (1,)  # the store keeps a 0-d tensor as shape [1]


def _table(samples: list[list[tuple[str, np.ndarray]]], gold: list[dict], gold_name, ref_sq: dict) -> dict:
    """{name: {"gold": gold name, "samples": [[err, nonfinite, n] or None per sample]}}: entries for
    the samples 0..S-1 that the fp64 reference has this tensor for (it stops at the first it lacks, as
    the diff's loop does); None where the values lack the sample or their shape differs."""
    names: dict[str, None] = {}
    for named in samples:
        names.update((n, None) for n, _ in named)
    by_sample = [dict(named) for named in samples]
    out = {}
    for name in names:
        gname = gold_name(name)
        rows = []
        for s, g in enumerate(gold):
            ref = g.get(gname)
            if ref is None:
                break
            val = by_sample[s].get(name) if s < len(by_sample) else None
            if val is None or _shape(np.asarray(val)) != _shape(ref):
                rows.append(None)
                continue
            if (s, gname) not in ref_sq:
                ref_sq[s, gname] = sum_sq_max(ref)
            err, bad = sq_error(val, ref)
            rows.append([err, bad, int(np.size(ref))])
        out[name] = {"gold": gname, "samples": rows}
    return out


def compute(layers: list[list[tuple[str, np.ndarray]]], own: list[list[tuple[str, np.ndarray]]] | None,
            gold: list[dict]) -> dict:
    """The sums file's content for a capture (or baseline): its layer values (plain: outputs
    included) and own values against the fp64 reference `gold` (per sample {name: array})."""
    ref_sq: dict = {}
    doc = {"version": VERSION,
           "layers": _table(layers, gold, store.reference_name, ref_sq),
           "own": _table(own, gold, store.own_reference_name, ref_sq) if own is not None else None,
           # own.parquet's order per sample (the diff lists own records in it)
           "own_order": [[n for n, _ in named] for named in own] if own is not None else None}
    names = sorted({g for _, g in ref_sq})
    for key, i in (("ref_sq", 0), ("ref_max", 1)):
        doc[key] = {g: [ref_sq[s, g][i] if (s, g) in ref_sq else None for s in range(len(gold))] for g in names}
    return doc


class Acc:
    """compute() one sample at a time: the same document from values handed over sample by sample
    (parity.pipeline.sink), so the capture never holds every sample of values and reference at once.
    `add` takes sample k's values and its fp64 reference, `add_own` its own values, `add_gold` a
    reference sample beyond the values'; `doc()` then equals compute(layers, own, gold)."""

    def __init__(self):
        self.layers: dict[str, dict] = {}
        self.own: dict[str, dict] | None = {}
        self.own_order: list[list[str]] = []
        self.ref_sq: dict = {}
        self.gold_names: list[set] = []

    def add(self, k: int, named: list, gold: dict) -> None:
        if k != len(self.gold_names):
            raise ValueError(f"sums: sample {k} after {len(self.gold_names)} samples")
        self.gold_names.append(set(gold))
        self._rows(self.layers, k, named, gold, store.reference_name)

    def add_gold(self, k: int, gold: dict) -> None:
        self.add(k, [], gold)

    def add_own(self, k: int, named: list, gold: dict) -> None:
        self.own_names(k, [n for n, _ in named])
        for i, (name, val) in enumerate(named):
            self.own_value(k, i, name, val, gold)

    def own_names(self, k: int, names: list[str]) -> None:
        """Sample k's own values will come in this order (own_value, one at a time)."""
        if self.own is not None:
            self.own_order.append(names)
            self._last = {n: i for i, n in enumerate(names)}  # a repeated name: its last value (as dict())

    def own_value(self, k: int, i: int, name: str, val, gold: dict) -> None:
        """The i-th own value of sample k (add_own, value by value: the caller may drop each after)."""
        if self.own is None:
            return
        if self._last[name] == i:
            self._row(self.own, k, name, val, gold, store.own_reference_name)
        else:  # the entry where dict(named) puts it: at the name's first place
            self.own.setdefault(name, {"gold": store.own_reference_name(name), "rows": {}})

    def drop_own(self) -> None:
        self.own = None

    def _rows(self, table: dict, k: int, named: list, gold: dict, gold_name) -> None:
        for name, val in dict(named).items():
            self._row(table, k, name, val, gold, gold_name)

    def _row(self, table: dict, k: int, name: str, val, gold: dict, gold_name) -> None:
        gname = gold_name(name)
        entry = table.setdefault(name, {"gold": gname, "rows": {}})
        ref = gold.get(gname)
        if ref is None or _shape(np.asarray(val)) != _shape(ref):
            return
        if (k, gname) not in self.ref_sq:
            self.ref_sq[k, gname] = sum_sq_max(ref)
        err, bad = sq_error(val, ref)
        entry["rows"][k] = [err, bad, int(np.size(ref))]

    def _table(self, table: dict, used: set) -> dict:
        out = {}
        for name, entry in table.items():
            rows = []
            for k, names in enumerate(self.gold_names):
                if entry["gold"] not in names:
                    break
                row = entry["rows"].get(k)
                rows.append(row)
                if row is not None:
                    used.add((k, entry["gold"]))
            out[name] = {"gold": entry["gold"], "samples": rows}
        return out

    def doc(self) -> dict:
        used: set = set()
        doc = {"version": VERSION, "layers": self._table(self.layers, used),
               "own": self._table(self.own, used) if self.own is not None else None,
               "own_order": self.own_order if self.own is not None else None}
        names = sorted({g for _, g in used})
        for key, i in (("ref_sq", 0), ("ref_max", 1)):
            doc[key] = {g: [self.ref_sq[k, g][i] if (k, g) in used else None
                            for k in range(len(self.gold_names))] for g in names}
        return doc


def write(out_dir: Path, layers, own, gold: list[dict] | None) -> None:
    """oracle_sums.json in `out_dir`, or none (removed) without an fp64 reference."""
    path = Path(out_dir) / FILE
    if gold is None:
        path.unlink(missing_ok=True)
        return
    write_json(path, compute(layers, own, gold))


def write_for(out_dir: Path, res, reference: Path | None, dtype_cfg: dict) -> None:
    """oracle_sums.json for a capture or baseline result (parity.backends.runner.CaptureResult): its
    values against the fp64 reference at `reference`, for an OK result at a dtype the oracle judges
    (none otherwise). The reference the own-error run read is reused; else it is read here."""
    ok = res.status == "OK" and reference is not None and Path(reference).exists() and has_baseline(dtype_cfg)
    gold = None
    if ok:
        gold = res.reference if res.reference is not None else _read_gold(Path(reference))
    write(out_dir, res.samples, res.own, gold)


def _read_gold(path: Path) -> list[dict]:
    """fp64.parquet -> per sample {name: array}."""
    by: dict[int, dict] = {}
    for t in store.read(path):
        by.setdefault(t.sample, {})[t.name] = t.array
    return [by[k] for k in sorted(by)]


def load(directory: Path | None) -> dict | None:
    """The sums a producer wrote in `directory`, or None (none written, or another version)."""
    if directory is None or not (Path(directory) / FILE).exists():
        return None
    doc = read_json(Path(directory) / FILE)
    return doc if doc.get("version") == VERSION else None


def sq(doc: dict, kind: str, name: str, gold_name: str, samples: range | None = None) -> Sq | None:
    """Sq of `name` (kind "layers" or "own") over `samples` (all when None, else that range), as the
    diff's array loop builds it: None when a sample lacks the values or no sample was compared."""
    entry = (doc.get(kind) or {}).get(name)
    if entry is None or entry["gold"] != gold_name:
        return None
    rows, refs = entry["samples"], doc["ref_sq"].get(gold_name, [])
    tops = doc.get("ref_max", {}).get(gold_name, [])
    if samples is not None:
        rows, refs, tops = (x[samples.start:samples.stop] for x in (rows, refs, tops))
    out = Sq()
    for i, (r, ref) in enumerate(zip(rows, refs)):
        if r is None:
            return None
        out.err += r[0]
        out.nonfinite += r[1]
        out.ref += ref
        out.n += r[2]
        out.amax = max(out.amax, tops[i]) if i < len(tops) and tops[i] is not None else out.amax
    return out if out.n else None


def own_names(doc: dict, samples: range | None = None) -> list[str]:
    """Own value names in own.parquet's order, of the first sample of `samples`."""
    order = doc.get("own_order") or []
    k = samples.start if samples is not None else 0
    return list(order[k]) if k < len(order) else []
