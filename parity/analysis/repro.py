"""What the reduce stage hands to a backend's vendor (parity.analysis.reduce): under the cell's folder,

  reduced.onnx         the reduced subgraph as the provider hands it to onnxruntime (dtype conversion and
                       a diagnostic fault, if configured, applied): what repro.py runs by default
  reduced.source.onnx  the same nodes as in model.onnx (unconverted, unfaulted)
  inputs.npz           the subgraph's inputs: the reference's values of those tensors
  expected.npz         the reference's values of the subgraph's checked outputs
  repro.py             numpy + onnxruntime only; exit 1 while the mismatch is there, 0 when it is not

The .npz files are written with fixed zip timestamps, so the same reduction gives the same bytes.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import onnx

from parity.core.io import atomic_path, write_text

# repro.py of both bundles (this module's and parity.analysis.torch_reduce's): one template, its holes
# filled by `script` with Python text (a variant's docstring, how it opens the session, what it prints)
SCRIPT = '''#!/usr/bin/env python3
"""{doc}"""
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

HERE = Path(__file__).resolve().parent
{constants}LIMIT = {limit!r}


def main(argv):
    model = Path(argv[1]) if len(argv) > 1 else HERE / "reduced.onnx"
    so = ort.SessionOptions()
    so.graph_optimization_level = {opt_level}
    sess = ort.InferenceSession(str(model), so, providers={providers})
    with np.load(HERE / "inputs.npz") as f:
        feeds = {{k: f[k] for k in f.files}}
    with np.load(HERE / "expected.npz") as f:
        expected = {{k: f[k] for k in f.files}}
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    failed = []
    for name, want in expected.items():
        a, w = got[name].astype(np.float64), want.astype(np.float64)
        err = np.linalg.norm(a - w)
        rel = err / np.linalg.norm(w) if np.linalg.norm(w) > 0 else (0.0 if err == 0 else np.inf)
        if {infinite}:
            rel = np.inf
        bad = not rel <= LIMIT
        failed += [name] if bad else []
        print(f"{{'MISMATCH' if bad else 'ok':8}} {{name}}: rel_l2 {{rel:.3e}}{against} (limit {{LIMIT:{limit_format}}}), "
              f"max |diff| {{np.abs(a - w).max():.3e}}, shape {{list(a.shape)}}")
{summary}
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
'''
NOT_FINITE = "not np.isfinite(a).all() and np.isfinite(w).all()"  # an output the expectation has finite


def script(doc: str, limit: float, summary: str, *, constants: str = "", opt_level: str, providers: str,
           infinite: str = NOT_FINITE, against: str = "", limit_format: str = "g") -> str:
    """repro.py's text: `doc` its docstring, `limit` the rel_l2 it fails above; the rest is Python text
    put in as given: `constants` before LIMIT, the session's `opt_level` and `providers`, the condition
    that makes an output's error infinite, what each output's line says after its rel_l2 (`against`) and
    the LIMIT's format there, and `summary`, the closing print."""
    return SCRIPT.format(doc=doc, limit=limit, summary=summary, constants=constants, opt_level=opt_level,
                         providers=providers, infinite=infinite, against=against, limit_format=limit_format)


DOC = """Standalone repro written by parity's reduce stage for cell {cell}: numpy + onnxruntime only.

Runs a model (default: reduced.onnx beside this file, {nodes} node(s): {ops}) on onnxruntime's
{ep} (graph optimisation {opt_level}) with inputs.npz, and compares each output with expected.npz
(the reference: onnxruntime CPU, float32, graph optimisation disabled): it fails when
||actual - expected|| / ||expected|| > {limit:g}. Prints every output's error; exits 1 while one
fails, 0 when none does.

    python repro.py                       # the graph as the provider runs it
    python repro.py reduced.source.onnx   # the same nodes as in the original model
"""
SUMMARY = """\
    print(f"{model.name} on {EP}: " + (f"{len(failed)} of {len(expected)} outputs mismatch" if failed
                                         else f"all {len(expected)} outputs match"))"""


def write_npz(path: Path, arrays: dict) -> None:
    """np.savez, deterministic: sorted members, fixed timestamps, no compression; atomic."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name in sorted(arrays):
            arr = io.BytesIO()
            np.lib.format.write_array(arr, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            z.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), arr.getvalue())
    with atomic_path(path) as tmp:
        Path(tmp).write_bytes(buf.getvalue())


def write_repro(out: Path, cell: str, red, provider_bytes: bytes, settings: dict, limit: float) -> None:
    """The vendor's bundle for Reduction `red` (status REDUCED) under `out`."""
    with atomic_path(out / "reduced.source.onnx") as tmp:
        onnx.save(red.model, str(tmp))
    with atomic_path(out / "reduced.onnx") as tmp:
        Path(tmp).write_bytes(provider_bytes)
    write_npz(out / "inputs.npz", red.feeds)
    write_npz(out / "expected.npz", red.expected)
    doc = DOC.format(cell=cell, nodes=len(red.nodes), ops=", ".join(red.op_types), limit=limit, **settings)
    consts = "".join(f"{k.upper()} = {settings[k]!r}\n" for k in ("ep", "provider_options", "opt_level"))
    write_text(out / "repro.py", script(doc, limit, SUMMARY, constants=consts, providers="[(EP, PROVIDER_OPTIONS)]",
                                        opt_level="getattr(ort.GraphOptimizationLevel, OPT_LEVEL)"))


def summary(cell: str, red, limit: float) -> dict:
    """reduce.json: deterministic (no timings)."""
    return json.loads(json.dumps({
        "cell": cell, "status": red.status, "reason": red.reason, "rel_l2_limit": limit,
        "graph_nodes": red.graph_nodes, "nodes": red.nodes, "op_types": red.op_types,
        "inputs": red.inputs, "outputs": red.outputs, "worst": red.worst, "trials": red.trials,
    }))
