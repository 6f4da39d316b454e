"""The engine build of one cell for providers whose runner builds engines (Runner.engine_build: trt):
build.json with the status and reason when the cell cannot be built here (a result, not a failure)."""

from __future__ import annotations

from pathlib import Path

from parity.backends import load_runner
from parity.backends.loader import calibration_feeds
from parity.backends.runner import error_reason
from parity.backends.fingerprint import cluster_unavailable
from parity.config import params as config
from parity.core.io import read_json


def build_cell(p: dict, dtype: str, provider: str, model_dir: Path, calibration: Path, out: Path,
               timing_cache: Path) -> dict:
    """build.json's content (without the cell key); the engines and timing cache are written."""
    pc, dc = p["providers"][provider], p["dtypes"][dtype]
    why = config.unsupported_dtype(provider, pc, dtype)
    if why:
        return {"status": "UNSUPPORTED", "reason": why}
    cls = load_runner(pc["runner"], pc.get("import"))

    why = cluster_unavailable(provider) or cls.engine_availability()  # parity repro --cluster: no node offers it
    if why:
        return {"status": "UNAVAILABLE", "reason": why}

    names = [x["name"] for x in read_json(Path(model_dir) / "layers.json")["layers"]]
    calib = calibration_feeds(calibration) if cls.engine_precision(dc) == "int8" else None
    try:
        return cls.build_engine(Path(model_dir), dc, pc.get("options") or {}, calib, out, timing_cache, names)
    except Exception as e:  # a failed build is a result (EXPORT_FAIL), like a failed conversion
        return {"status": "EXPORT_FAIL", "reason": "engine build failed: " + error_reason(e)}
