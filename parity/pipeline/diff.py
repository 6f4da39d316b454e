"""The diff of one cell, in four steps: its values read (parity.pipeline.diffcell.load: nothing of the
config), the config resolved once into the cell's Rule (parity.config.schema.rule), every layer judged by it
against the torch fp32 reference (tolerance) and the fp64 oracle relative to the trusted baseline
(parity.pipeline.diffcell.judge), and what the stage writes made and written: metrics.json,
layers.json, layers.csv (parity.pipeline.cellfiles). numpy only (the stage imports this module after
parsing its arguments)."""

from __future__ import annotations

from pathlib import Path

from parity.analysis import plaindiff
from parity.config import params as config, schema
from parity.core.io import read_json
from parity.pipeline import cellfiles, diffcell


def diff_and_write(p: dict, model: str, dtype: str, provider: str, capture: Path, reference: Path,
                   baseline: Path | None, model_dir: Path | None, out: Path) -> str:
    """Diff the cell, write metrics.json, layers.json and layers.csv under `out`; the summary line."""
    key = config.cell_key(model, dtype, provider)
    lj = model_dir / "layers.json" if model_dir else None
    layers_json = read_json(lj) if lj and lj.exists() else {}
    cell = diffcell.load(capture, reference, baseline)  # the values: nothing of the config
    rule = schema.rule(p, model, dtype, cell.names)  # the config: resolved once
    shapes = diffcell.judge(rule, cell)  # (label, CellDiff) per input shape
    for _, cd in shapes:  # only the shipped graph fails: the nodes where it differs from layers.onnx
        plaindiff.locate(cd, model_dir)
    line = cellfiles.write(shapes, layers_json, key, out)  # as judged: nothing of the config
    return f"diff@{key}: {line}"
