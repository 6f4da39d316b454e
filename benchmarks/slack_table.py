"""The oracle's slack, measured (issue 24): max excess per cell under the old absolute slack and the
relative one, from the diff stages' layers.json (every layer's and own value's err_rmse, floor_rmse,
ref_rms), and faults injected through the provider's `options.fault` (parity/backends/fault.py).

    python benchmarks/slack_table.py excess [--repo .] [--k 4] [--old 1e-5] [--new 1e-6] CELL...
        max excess (accumulated and own) per cell under both slacks, recomputed from layers.json
    python benchmarks/slack_table.py fault --model M --dtype D --node NODE --scale S [--provider ort_cpu]
        capture + diff of one cell with that fault (command lines as in dvc.yaml, the checkout's
        export, inputs, fp64 reference and baseline); prints verdict, drift origin, worst excess
    python benchmarks/slack_table.py smallest CELL...
        per cell, its smallest-valued layer (lowest fp64 rms among layers with own error, else
        accumulated) and the smallest relative error the oracle fails there:
        (k max(floor, u rms) + slack rms) / rms, for the old and the new slack

Outputs of `fault` go to a temp dir; the checkout's artifacts are only read.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

U = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


def _records(repo: Path, cell: str) -> tuple[list[dict], list[dict]]:
    lj = json.loads((repo / "artifacts/diff" / cell / "layers.json").read_text())
    return [d["oracle"] | {"name": d["name"]} for d in lj["layers"] if d.get("oracle")], lj.get("own") or []


def excess(r: dict, u: float, k: float, slack: float, relative: bool) -> float:
    rms = r["ref_rms"] or 0.0
    floor = max(r.get("floor_rmse") or 0.0, u * rms)
    denom = floor + (slack * rms if relative else slack) / k
    return r["err_rmse"] / denom if denom > 0 else (0.0 if r["err_rmse"] == 0 else math.inf)


def _u(repo: Path, cell: str) -> float:
    p = yaml.safe_load((repo / "params.yaml").read_text())
    return U[p["dtypes"][cell.split("-")[1]]["torch"]]


def cmd_excess(a) -> None:
    repo = Path(a.repo)
    print("| cell | layers | max excess, absolute slack %g | max excess, relative slack %g | where (relative) |" % (a.old, a.new))
    print("|---|---|---|---|---|")
    for cell in a.cells:
        layers, own = _records(repo, cell)
        u = _u(repo, cell)
        recs = [(r["name"], r) for r in layers] + [(r["name"], r) for r in own]
        old = max(excess(r, u, a.k, a.old, False) for _, r in recs)
        new, where = max((excess(r, u, a.k, a.new, True), n) for n, r in recs)
        print(f"| {cell} | {len(layers)} | {old:.2f} | {new:.2f} | {where} |")


def cmd_smallest(a) -> None:
    repo = Path(a.repo)
    print("| cell | smallest-valued layer | fp64 rms | floor rel | smallest relative error failed, absolute slack %g | relative slack %g |"
          % (a.old, a.new))
    print("|---|---|---|---|---|---|")
    for cell in a.cells:
        layers, own = _records(repo, cell)
        u = _u(repo, cell)
        recs = [r for r in (own or layers) if r.get("ref_rms")]
        r = min(recs, key=lambda r: r["ref_rms"])
        rms = r["ref_rms"]
        floor = max(r.get("floor_rmse") or 0.0, u * rms)
        old = (a.k * floor + a.old) / rms
        new = (a.k * floor + a.new * rms) / rms
        print(f"| {cell} | {r['name']} | {rms:.3g} | {floor / rms:.2g} | {old:.2g} | {new:.2g} |")


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)


def cmd_fault(a) -> None:
    repo = Path(a.repo).resolve()
    p = yaml.safe_load((repo / "params.yaml").read_text())
    p["providers"][a.provider].setdefault("options", {})["fault"] = {"node": a.node, "scale": a.scale}
    p["dtypes"][a.dtype]["oracle"]["slack"] = a.new  # the relative slack the diff judges with
    m, d = a.model, a.dtype
    with tempfile.TemporaryDirectory(prefix="parity-slack-") as td:
        t = Path(td)
        (t / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
        cell = ["--params", str(t / "params.yaml"), "--model", m, "--dtype", d, "--provider", a.provider]
        r = _run([sys.executable, "-m", "stages.capture", *cell, "--model-dir", f"artifacts/models/{m}",
                  "--inputs", f"artifacts/inputs/{m}.parquet", "--calibration", f"artifacts/inputs/{m}.calibration.parquet",
                  "--reference", f"artifacts/reference/{m}/fp64.parquet", "--out", str(t / "capture"),
                  "--timing", str(t / "timing.json")], repo)
        if r.returncode:
            sys.exit("capture: " + r.stderr[-600:])
        r = _run([sys.executable, "-m", "stages.diff", *cell, "--capture", str(t / "capture"),
                  "--reference", f"artifacts/reference/{m}", "--baseline", f"artifacts/baseline/{m}/{d}",
                  "--model-dir", f"artifacts/models/{m}", "--out", str(t / "diff")], repo)
        if r.returncode:
            sys.exit("diff: " + r.stderr[-600:])
        met = json.loads((t / "diff/metrics.json").read_text())
        lj = json.loads((t / "diff/layers.json").read_text())
        recs = [x["oracle"] for x in lj["layers"] if x.get("oracle")] + (lj.get("own") or [])
        u = U[p["dtypes"][d]["torch"]]
        before = max(excess(r, u, a.k, a.old, False) for r in recs)
        after = max(excess(r, u, a.k, a.new, True) for r in recs)
        print(json.dumps({"model": m, "dtype": d, "provider": a.provider, "node": a.node, "scale": a.scale,
                          "slack": p["dtypes"][d]["oracle"].get("slack"), "verdict": met["verdict"],
                          "max_excess_absolute_slack": before, "max_excess_relative_slack": after,
                          "drift_origin": met.get("drift_origin"), "where": met.get("drift_origin_where"),
                          "worst_layer": met.get("worst_layer"), "worst_excess": met.get("worst_excess"),
                          "layers_failed": met.get("layers_failed"),
                          "cause": (met.get("drift_origin_cause") or {}).get("summary")}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    for name in ("excess", "smallest"):
        s = sub.add_parser(name)
        s.add_argument("cells", nargs="+")
        s.add_argument("--k", type=float, default=4.0)
        s.add_argument("--old", type=float, default=1e-5, help="the absolute slack (an RMSE)")
        s.add_argument("--new", type=float, default=3e-6, help="the relative slack (x the layer's rms; conf/dtypes/fp32.yaml)")
    f = sub.add_parser("fault")
    f.add_argument("--k", type=float, default=4.0)
    f.add_argument("--old", type=float, default=1e-5, help="the absolute slack (an RMSE)")
    f.add_argument("--new", type=float, default=3e-6, help="the relative slack (x the layer's rms; conf/dtypes/fp32.yaml)")
    for arg in ("--model", "--dtype", "--node"):
        f.add_argument(arg, required=True)
    f.add_argument("--scale", type=float, required=True)
    f.add_argument("--provider", default="ort_cpu")
    for s in sub.choices.values():
        s.add_argument("--repo", default=".")
    a = ap.parse_args()
    {"excess": cmd_excess, "smallest": cmd_smallest, "fault": cmd_fault}[a.what](a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
