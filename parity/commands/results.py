"""What the command line reads of a run's results, in one place: a cell's verdict, drift origin and
cause from its diff metrics (metrics.json), its layers (layers.json), the report's summary
(summary.json). Every key the CLI reads from these files is named in this module, so a change of
their layout is one edit here. Paths are not written here: they come from dvc.yaml (the diff
stage's command line, through DVC's index). Light: numpy and pyarrow only (and DVC for the index).
"""

from __future__ import annotations

import re
import shlex
import warnings
from dataclasses import dataclass
from pathlib import Path

from parity.core.status import VERDICTS

# ---- a cell's metrics.json (nested dict as the diff stage writes it) -----------------------------


def verdict(m: dict) -> str | None:
    """PASS, FAIL, or the capture's status when it did not run (INFER_FAIL, UNAVAILABLE, ...)."""
    return m.get("verdict")


def drift_origin(m: dict) -> str | None:
    return m.get("drift_origin") or m.get("origin")  # a cell's metrics.json / its summary entry


def drift_where(m: dict) -> str | None:
    return m.get("drift_origin_where") or m.get("drift_origin")


def cause(m: dict) -> dict | None:
    """{label, summary} of why the drift origin differs, or None."""
    c = m.get("drift_origin_cause")
    return c if c and c.get("label") else None


def reason(m: dict) -> str:
    return m.get("reason") or ""


def verdict_mode(m: dict) -> str | None:
    return m.get("verdict_mode")


def worst_layer(m: dict) -> str | None:
    return m.get("worst_layer")


def output_max_abs(m: dict) -> float | None:
    return (m.get("output") or {}).get("max_abs")


def worst_ratio(m: dict) -> float | None:
    """The worst error over what the verdict allows (1 = the limit): a cell's metrics.json `worst_ratio`
    or its summary.json entry's `worst` (parity.core.metrics); "inf" where the tolerance is zero."""
    v = m.get("worst_ratio", m.get("worst"))
    if v in ("inf", "Infinity"):
        return float("inf")
    return v if isinstance(v, (int, float)) else None


def layer_counts(m: dict) -> tuple[int | None, int | None]:
    """(layers, layers failed)."""
    return m.get("layers"), m.get("layers_failed")


def ran(m: dict) -> bool:
    return verdict(m) in VERDICTS


def precision(m: dict) -> dict | None:
    """{format, layers, rounded, exercised, evidence} of a reduced-precision cell (metrics.json)."""
    return m.get("precision")


def baseline(m: dict) -> str | None:
    """Why the cell is the oracle's baseline judged against itself (verdict BASELINE), or None."""
    return m.get("baseline")


# ---- the report's summary.json ------------------------------------------------------------------


# ---- a cell's layers.json -----------------------------------------------------------------------


def layers(doc: dict) -> list[dict]:
    return doc.get("layers") or []


def own_records(doc: dict) -> list[dict]:
    return doc.get("own") or []


def failing(doc: dict) -> tuple[list[dict], list[dict]]:
    """(layers that fail by the cell's verdict mode, own-error records that fail)."""
    return ([d for d in layers(doc) if not d.get("passed", True)],
            [r for r in own_records(doc) if not r.get("passed", True)])


def outside_tolerance(doc: dict) -> list[dict]:
    """Layers with elements outside atol + rtol |expected| (informational under the oracle verdict)."""
    return [d for d in layers(doc) if d.get("n_outside")]


def mismatch(d: dict) -> dict:
    """A layer's mismatch in torch.testing's terms: n / N elements outside, worst index and the
    tolerance that applied (actual/expected at the worst element: see worst_values)."""
    return {"layer": d["name"], "n_outside": d.get("n_outside", 0), "numel": d.get("numel", 0),
            "frac_outside": d.get("frac_outside", 0.0), "max_abs": d.get("max_abs"),
            "rel_l2": d.get("rel_l2"), "tol_ratio": d.get("tol_ratio"),
            "worst_sample": d.get("worst_sample", 0), "worst_index": list(d.get("worst_index") or []),
            "atol": d.get("atol"), "rtol": d.get("rtol"), "tol_source": d.get("tol_source"),
            "excess": (d.get("oracle") or {}).get("excess"), "problem": d.get("problem") or ""}


# ---- where a cell's files are: the diff stage's command line in dvc.yaml ------------------------


@dataclass
class CellFiles:
    cell: str
    out: Path                 # the diff stage's --out: metrics.json, layers.json
    capture: Path | None      # --capture: layers.parquet (the backend's values)
    reference: Path | None    # --reference: fp32.parquet (the torch fp32 values)

    @property
    def metrics(self) -> Path:
        return self.out / "metrics.json"

    @property
    def layers(self) -> Path:
        return self.out / "layers.json"


def _arg(cmd: str, flag: str) -> str | None:
    args = shlex.split(cmd)
    return args[args.index(flag) + 1] if flag in args[:-1] else None


DIFF_STAGE = re.compile(r"^diff@(?P<cell>.+)$")


def cell_files(root: str | Path = ".") -> dict[str, CellFiles]:
    """{cell: CellFiles} of every diff stage in dvc.yaml (DVC resolves the matrix from params.yaml)."""
    # lazy: dvc.repo +0.29 s (BENCHMARKS 22); parallel (the `parity --help` parser) imports this module
    from dvc.repo import Repo

    root = Path(root).resolve()
    out = {}
    with warnings.catch_warnings(), Repo(str(root)) as repo:
        warnings.simplefilter("ignore", DeprecationWarning)
        for st in repo.index.stages:
            m = DIFF_STAGE.match(getattr(st, "name", "") or "")
            if not m or not st.cmd:
                continue
            cmd = st.cmd if isinstance(st.cmd, str) else " ".join(st.cmd)
            paths = {f: _arg(cmd, f) for f in ("--out", "--capture", "--reference")}
            if paths["--out"]:
                wd = Path(st.wdir)
                out[m["cell"]] = CellFiles(m["cell"], wd / paths["--out"],
                                           wd / paths["--capture"] if paths["--capture"] else None,
                                           wd / paths["--reference"] if paths["--reference"] else None)
    return out


CAPTURE_VALUES = "layers.parquet"   # parity.pipeline.diff reads the same names
REFERENCE_VALUES = "fp32.parquet"


def worst_values(files: CellFiles, rows: list[dict]) -> None:
    """Add actual, expected and allowed (atol + rtol |expected|) at each row's worst element, read
    from the capture and the fp32 reference (Parquet); rows whose values are gone keep None."""
    # lazy: store loads pyarrow.parquet (+0.15 s, BENCHMARKS 22); only worst_values reads Parquet
    from parity.core import store

    for r in rows:
        r.setdefault("actual", None), r.setdefault("expected", None), r.setdefault("allowed", None)
    try:
        act = store.read_dict(files.capture / CAPTURE_VALUES)
        ref = store.read_dict(files.reference / REFERENCE_VALUES)
    except (OSError, TypeError, ValueError):  # not pulled / not produced (pyarrow raises OSError)
        return
    for r in rows:
        name, s, idx = r["layer"], r["worst_sample"], tuple(r["worst_index"])
        ref_name = store.reference_name(name)
        if (s, name) not in act or (s, ref_name) not in ref or not idx:
            continue
        try:
            a, e = float(act[s, name].array[idx]), float(ref[s, ref_name].array[idx])
        except (IndexError, ValueError):
            continue
        r["actual"], r["expected"] = a, e
        if r.get("atol") is not None and r.get("rtol") is not None:
            r["allowed"] = float(r["atol"]) + float(r["rtol"]) * abs(e)


# ---- an experiment's metrics files ({path: data}, as `dvc metrics show` / `dvc exp show` give) ---


def experiment_cells(metrics: dict[str, dict]) -> dict[str, dict]:
    """{cell: its metrics} of one revision: each diff stage's metrics file (a file with a verdict,
    named by its folder, the cell); else the report summary's cell entries, in either layout
    (`per_cell: {cell: {...}}`, or cells as top-level keys `model-dtype-provider: {verdict, ...}`
    beside the totals)."""
    cells = {Path(p).parent.name: d for p, d in metrics.items() if isinstance(d, dict) and "verdict" in d}
    if cells:
        return cells
    for d in metrics.values():
        if not isinstance(d, dict):
            continue
        if isinstance(d.get("per_cell"), dict):
            return {c: (m if isinstance(m, dict) else {"verdict": m}) for c, m in d["per_cell"].items()}
        top = {k: v for k, v in d.items() if "-" in k and isinstance(v, dict) and "verdict" in v}
        if top:
            return top
    return {}
