"""`parity list models|dtypes|providers|suites [--json]`: the options of a conf/ group (one YAML
file each, keyed by its own name), marked when params.yaml selects them, with what a user picks
them by: a model's architecture and input shape, a dtype's torch dtype, mode and tolerance, a
provider's runner and dtypes, a suite's case count. Light: yaml only.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

import yaml

from parity.config import schema
from parity.core.ui import dump_json, table
from parity.suites import spec

GROUPS = ("models", "dtypes", "providers", "suites")


class ListError(ValueError):
    pass


def _shape(inputs) -> str:
    return " ".join(f"{i.get('name', '?')}{list(i.get('shape') or [])}" for i in inputs or [] if isinstance(i, dict))


def _tol(t) -> str:
    return f"atol {t.get('atol')}, rtol {t.get('rtol')}" if isinstance(t, dict) else "-"


def _device(body: dict) -> str:
    """Where a provider runs, from its conf: `options.device` (torch runners), else ONNX Runtime's
    `options.provider_options.device_id` (cuda:<id>), else cuda when its results depend on `cuda`
    (`uses:`, e.g. native TensorRT), else cpu."""
    opts = body.get("options") if isinstance(body.get("options"), dict) else {}
    if opts.get("device"):
        return str(opts["device"])
    po = opts.get("provider_options") if isinstance(opts.get("provider_options"), dict) else {}
    if po.get("device_id") is not None:
        return f"cuda:{po['device_id']}"
    return "cuda" if "cuda" in (body.get("uses") or []) else "cpu"


def _describe(group: str, name: str, body: dict, root: Path) -> dict:
    if group == "models":
        arch = body.get("arch") or {}
        shapes = body.get("shapes") if isinstance(body.get("shapes"), dict) else {}
        name = f"{arch.get('name')} ({arch['head']})" if arch.get("head") else arch.get("name")  # hf arch.head
        return {"source": arch.get("source"), "arch": name,  # models.<m>.shapes: one per label
                "input": "; ".join(f"{lab}: " + " ".join(f"{n}{list(d)}" for n, d in e.items())
                                   for lab, e in shapes.items() if isinstance(e, dict)) or _shape(body.get("input"))}
    if group == "dtypes":
        return {"torch": body.get("torch"), "mode": schema.mode(body), "tol": _tol(body.get("tol"))}
    if group == "providers":
        return {"runner": body.get("runner"), "dtypes": ",".join(body.get("dtypes") or []),
                "device": _device(body)}

    try:
        n: int | str = len(spec.expand(name, body, root))
    except Exception as e:  # a broken suite is listed with its error (`parity suite validate` says more)
        n = f"error: {str(e).splitlines()[0][:80]}"
    return {"cases": n}


def options(group: str, root: str | Path = ".") -> list[dict]:
    """Every option of a conf/ group: {name, selected, file, ...its description}."""
    if group not in GROUPS:
        raise ListError(f"unknown group {group!r}: choose one of {', '.join(GROUPS)}")
    root = Path(root)
    folder = root / "conf" / group
    if not folder.is_dir():
        raise ListError(f"{folder} does not exist (run parity in the project's root, or pass --root)")
    params = root / "params.yaml"
    selected = set()
    if params.exists():
        selected = set((yaml.safe_load(params.read_text()) or {}).get(group) or {})
    rows = []
    for f in sorted(folder.glob("*.yaml")):
        try:
            doc = yaml.safe_load(f.read_text()) or {}
        except yaml.YAMLError as e:
            rows.append({"name": f.stem, "selected": f.stem in selected, "file": str(f), "error": str(e).splitlines()[0]})
            continue
        body = doc.get(f.stem) if isinstance(doc, dict) else None
        row = {"name": f.stem, "selected": f.stem in selected, "file": str(f)}
        row.update(_describe(group, f.stem, body, folder) if isinstance(body, dict) else
                   {"error": f"not keyed by its own name {f.stem!r}"})
        rows.append(row)
    return rows


def show(group: str, root: str | Path = ".", as_json: bool = False, out: TextIO = sys.stdout) -> int:
    rows = options(group, root)
    if as_json:
        dump_json({"group": group, "options": rows}, out)
        return 0
    keys = list(dict.fromkeys(k for r in rows for k in r if k not in ("name", "selected", "file")))
    table(["name", "selected", *keys], [[r["name"], "*" if r["selected"] else "", *(str(r.get(k, "")) for k in keys)]
                                        for r in rows], out)
    return 0
