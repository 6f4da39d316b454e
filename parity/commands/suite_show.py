"""`parity suite show SUITE CASE`: one case of a suite, its expanded spec and its result in every
(dtype, provider) cell that ran it (artifacts/suites/diff/<suite>/<dtype>-<provider>/results.json).
Light: yaml/json only.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

import yaml

from parity.core.ui import plain_table
from parity.suites import spec

COLUMNS = (("status", None), ("max_abs", ".3g"), ("rel_l2", ".3g"), ("tol_ratio", ".3g"), ("grad_tol_ratio", ".3g"),
           ("verdict", None), ("excess", ".3g"))  # excess: the fp64 oracle's (<= k passes)


def case_results(suite: str, case: str, diff_root: Path) -> dict[str, dict]:
    """{"<provider>/<dtype>": the diff stage's row for this case} for every cell found."""
    out = {}
    for f in sorted((diff_root / suite).glob("*/results.json")):
        doc = json.loads(f.read_text())
        for r in doc.get("cases") or []:
            if r["id"] == case:
                out[f"{doc.get('provider')}/{doc.get('dtype')}"] = r
    return out


def _fmt(v, f):
    if v is None:
        return "-"
    return format(v, f) if f else str(v)


def render(suite: str, case: dict, results: dict[str, dict]) -> str:
    shown = {k: v for k, v in case.items() if k not in ("file",)}
    lines = [f"{suite} / {case['id']}  ({case['label']}, {case['file']})", "",
             yaml.safe_dump(json.loads(json.dumps(shown)), sort_keys=False, default_flow_style=None, width=110).rstrip(), ""]
    if not results:
        lines.append("no results yet (run `dvc exp run -S 'suites=[...]'` or `dvc repro`)")
        return "\n".join(lines)
    head = ["cell", *(k for k, _ in COLUMNS), "tolerance"]
    rows = [[cell, *(_fmt(r.get(k), f) for k, f in COLUMNS), str(r.get("tol_source") or "-")]
            for cell, r in results.items()]
    lines.append(plain_table(head, rows))
    for cell, r in results.items():
        for k in ("reason", "note", "drawn"):
            if r.get(k):
                lines.append(f"{cell} {k}: {r[k]}")
    return "\n".join(lines)


def main(argv=None, prog: str = "parity suite show") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__)
    ap.add_argument("suite", help="suite name (conf/suites/<name>.yaml)")
    ap.add_argument("case", help="case id (as `parity suite list SUITE` prints it)")
    ap.add_argument("--diff", default="artifacts/suites/diff", help="suite diff folder (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="one JSON document: {case, results}")
    a = ap.parse_args(argv)
    try:
        cases = {c["id"]: c for c in spec.expand(a.suite)}
    except spec.SuiteError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    if a.case not in cases:
        near = difflib.get_close_matches(a.case, list(cases), n=5, cutoff=0.4)
        print(f"{prog}: error: suite '{a.suite}' has no case '{a.case}'"
              + (f". Close: {', '.join(near)}" if near else f" ({len(cases)} cases: `parity suite list {a.suite}`)"),
              file=sys.stderr)
        return 2
    res = case_results(a.suite, a.case, Path(a.diff))
    if a.json:
        print(json.dumps({"case": cases[a.case], "results": res}, indent=1, sort_keys=True))
    else:
        print(render(a.suite, cases[a.case], res))
    return 0
