"""`parity suite import-onnx [--from DIR] [--name NAME] [--only GLOB ...]`: ONNX's backend node tests
as a parity suite (conf/suites/<name>.yaml, default `onnx_node`), run like any suite on every
ONNX-based provider (`dvc exp run -S 'suites=[onnx_node]'`; opt-in: no suite is selected by default).

Each node test is a case of kind `onnx` (parity.suites.onnxcase): its model, inputs and expected
outputs are copied to data/onnx/<name>/<test>/ (model.onnx, test_data_set_<k>/{input,output}_<j>.pb,
the layout of ONNX's backend tests), the folder the case names; its label is the test's op, so the
coverage matrix has a row per op. The reference is ONNX's expected outputs, compared with ONNX's own
backend-test tolerances at fp32 (rtol 1e-3, atol 1e-7, the suite's `tolerances`); other dtypes use
dtypes.<d>.tol. A test stamped with an opset the installed onnxruntime cannot read runs with the stamp
lowered when its ops are defined identically at the newest opset it reads, else it is SKIPPED naming
the op version; what onnxruntime has no kernel for is UNSUPPORTED in its words (parity.suites.onnxcase).

Where the tests come from: `--from DIR` copies the tests under DIR/node/ (or DIR itself), e.g. what
an onnx release's `python -m onnx.backend.test.cmd_tools generate-data -o DIR` wrote or the
`onnx/backend/test/data/node` folder of an onnx source tree. Without it they are written from the
installed onnx's generators (onnx.backend.test.case.node.collect_testcases; onnx 1.23's generate-data
writes only its model tests, real/ and simple/). `--only GLOB` keeps the tests whose name matches.
An existing suite file or data folder is refused unless --force.
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import shutil
import sys
import warnings
from pathlib import Path

import onnx
import yaml
from onnx import TensorProto, numpy_helper
from onnx.backend.test.case import node

from parity.core.io import atomic_path

NAME = re.compile(r"^[A-Za-z0-9_]+$")
DATA = "data/onnx"  # the suite's test folders: data/onnx/<suite>/<test>/
ONNX_TOL = {"dtype": "fp32", "atol": 1e-7, "rtol": 1e-3}  # onnx.backend.test.case.test_case.TestCase defaults


class ImportRefused(ValueError):
    """A refusal: one line naming the problem."""


def write_tests(out: Path, only: list[str]) -> list[str]:
    """Write the installed onnx's node tests (those matching `only`) under `out` in the backend-test
    layout; returns their names."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node.collect_testcases()
    names = []
    for c in sorted(cases, key=lambda c: c.name):
        if only and not any(fnmatch.fnmatchcase(c.name, g) for g in only):
            continue
        write_case(out, c)
        names.append(c.name)
    return names


def write_case(out: Path, c) -> Path:
    """One onnx.backend.test.case TestCase as out/<name>/ (model.onnx, test_data_set_<k>/)."""
    d = out / c.name
    d.mkdir(parents=True)
    (d / "model.onnx").write_bytes(c.model.SerializeToString())
    for k, (ins, outs) in enumerate(c.data_sets):
        ds = d / f"test_data_set_{k}"
        ds.mkdir()
        for kind, vals, vis in (("input", ins, c.model.graph.input), ("output", outs, c.model.graph.output)):
            for j, v in enumerate(vals):
                (ds / f"{kind}_{j}.pb").write_bytes(_proto(v, vis[j]).SerializeToString())
    return d


def _proto(v, vi):
    t = vi.type
    if t.HasField("sequence_type"):
        return numpy_helper.from_list(v, vi.name)
    if t.HasField("optional_type"):
        return numpy_helper.from_optional(v, vi.name)
    if t.HasField("map_type"):
        return numpy_helper.from_dict(v, vi.name)
    return v if isinstance(v, TensorProto) else numpy_helper.from_array(v, vi.name)


def copy_tests(src: Path, out: Path, only: list[str]) -> list[str]:
    """Copy the test folders under src/node (or src) that hold a model.onnx."""
    base = src / "node" if (src / "node").is_dir() else src
    names = []
    for d in sorted(p for p in base.iterdir() if (p / "model.onnx").is_file()):
        if only and not any(fnmatch.fnmatchcase(d.name, g) for g in only):
            continue
        shutil.copytree(d, out / d.name)
        names.append(d.name)
    if not names:
        raise ImportRefused(f"--from {src}: no test folders with a model.onnx under {base}"
                            + (f" matching {only}" if only else ""))
    return names


def op_of(folder: Path, siblings: set[str]) -> str:
    """The op a node test exercises: its one node type; for an `_expanded` test (the function body
    inlined) the op of the test it expands; otherwise the node types joined with '+'."""
    m = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    types = sorted({n.op_type for n in m.graph.node})
    base = re.sub(r"_expanded(_ver\d+)?$", "", folder.name)
    if base != folder.name and base in siblings:
        return op_of(folder.parent / base, set())
    return types[0] if len(types) == 1 else "+".join(types) or "(no nodes)"


def suite_doc(name: str, data: Path, names: list[str]) -> dict:
    have = set(names)
    cases = [{"id": n, "onnx": {"path": f"{data.as_posix()}/{n}", "op": op_of(data / n, have)}} for n in names]
    return {name: {"tolerances": [dict(ONNX_TOL)], "spec": {"cases": cases}}}


def run(src: Path | None, name: str, only: list[str], force: bool, root: Path = Path(".")) -> tuple[Path, list[str]]:
    if not NAME.match(name):
        raise ImportRefused(f"--name {name!r}: a suite name may only use [A-Za-z0-9_] (it names conf/suites/<name>.yaml)")
    target = root / "conf" / "suites" / f"{name}.yaml"
    data = Path(DATA) / name
    for p in (target, root / data):
        if p.exists() and not force:
            raise ImportRefused(f"{p} exists: pass --force to replace it")
    if src is not None and not src.is_dir():
        raise ImportRefused(f"--from {src}: no such folder")
    tmp = root / f"{data}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        names = copy_tests(src, tmp, only) if src is not None else write_tests(tmp, only)
        if not names:
            raise ImportRefused(f"no node test matches --only {only}")
        doc = suite_doc(name, tmp, names)
        for c in doc[name]["spec"]["cases"]:
            c["onnx"]["path"] = f"{data.as_posix()}/{c['id']}"
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(root / data, ignore_errors=True)
    tmp.rename(root / data)

    with atomic_path(target) as t:
        Path(t).write_text(f"# parity suite import-onnx: {len(names)} ONNX node tests (parity/suites/onnximport.py)\n"
                           + yaml.safe_dump(doc, sort_keys=False, width=120, default_flow_style=None))
    return target, names


def main(argv=None, prog: str = "parity suite import-onnx") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="src", default=None, help="a folder of ONNX backend node tests (DIR/node/<test>/)")
    ap.add_argument("--name", default="onnx_node", help="suite name (default onnx_node)")
    ap.add_argument("--only", nargs="*", default=[], help="test-name globs to keep (default: every node test)")
    ap.add_argument("--force", action="store_true", help="replace an existing suite file and data folder")
    a = ap.parse_args(argv)
    try:
        target, names = run(Path(a.src) if a.src else None, a.name, a.only, a.force)
    except ImportRefused as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    ops = {c["onnx"]["op"] for c in yaml.safe_load(target.read_text())[a.name]["spec"]["cases"]}
    print(f"{target}: {len(names)} ONNX node tests ({len(ops)} ops), data under {DATA}/{a.name}/; "
          f"run: dvc exp run -S 'suites=[{a.name}]' -S 'providers=[ort_cpu]' -S 'dtypes=[fp32]'")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
