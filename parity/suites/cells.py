"""What a suite cell (suite x dtype x provider) hands its workers: the provider's runner and options, the
torch dtype and the suites_run settings. Here, in the suites layer, so the suite run
(parity.pipeline.suite_run) and a fuzz campaign (parity.analysis.fuzz_campaign) build a cell the same
way without importing each other (issue 37)."""

from __future__ import annotations

from parity.config import schema


def cell_of(p: dict, dtype: str, provider: str) -> dict:
    """What a worker needs to run a case of this cell: the provider's runner and options, the torch
    dtype, and the suites_run settings."""
    cfg = schema.of(p)
    sr, prov = cfg.suites_run, p["providers"][provider]
    return {"provider": provider, "runner": prov["runner"], "import": prov.get("import"),
            "torch_dtype": p["dtypes"][dtype]["torch"], "seed": int(cfg.seed),
            "repeats": int(sr.repeats), "threads": int(sr.threads),
            "onnx_opset": int(sr.onnx_opset), "options": prov.get("options") or {},
            "grad": bool(sr.grad),
            # the selected providers' runners: a case's `baseline: PROVIDER@...` runs through one of them
            "runners": {n: {"runner": c["runner"], "import": c.get("import"), "options": c.get("options") or {}}
                        for n, c in sorted(p["providers"].items())}}
