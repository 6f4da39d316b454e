"""`parity suite list|validate SUITE...`: expand suites and print case ids, or the exact error
(file, case id, key), without running anything. `parity suite show SUITE CASE` prints one case (its
expanded spec and its results in every cell); `parity suite import-opdiff FILE.yaml` converts an
opdiff suite (parity.suites.opdiff); `parity suite import-onnx` imports ONNX's backend node tests
(parity.suites.onnximport).

    python -m parity.commands.suite_cli list critical
    python -m parity.commands.suite_cli validate critical --file my_suite.yaml

`list` is light (yaml only). `validate` also resolves every torch target (aten::name must exist in
torch.ops.aten, torch.* names must exist) and every OpInfo name, which imports torch (and op_db for
opinfo cases), but never runs a case. It never imports code of your own: a module declared with
`import:` (and parity.suites.testops) is located and read for the name, not imported
(parity.config.imports); both `list` and `validate` refuse a target outside the torch namespaces that no
`import:` declares.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from parity.commands import suite_show as show
from parity.config import imports as code
from parity.suites import opdiff, spec


def _load(name_or_file: str, root: Path | None) -> tuple[str, dict, str, Path | None]:
    """A suite name (conf/suites/<name>.yaml) or a path to a suite file."""
    p = Path(name_or_file)
    if p.suffix in (".yaml", ".yml") and p.exists():
        sec, f = spec.load_section(p.stem, p.parent)
        return p.stem, sec, f, p.parent
    sec, f = spec.load_section(name_or_file, root)
    return name_or_file, sec, f, root


def list_cases(suite: str, root: str | Path | None = None) -> list[dict]:
    """Expanded cases of a suite (name or .yaml path), structure-checked; raises SuiteError."""
    name, sec, _, r = _load(suite, Path(root) if root else None)
    return spec.expand(name, sec, r)


def validate(suite: str, root: str | Path | None = None, resolve: bool = True) -> list[dict]:
    """list_cases() plus resolution of the torch targets (imports torch when resolve=True); raises
    SuiteError naming the file, case id and key of the first problem. Declared modules were located
    and read by list_cases(); nothing here imports them."""
    cases = list_cases(suite, root)
    if not resolve:
        return cases
    from parity.suites import execute  # lazy: execute loads torch (+1.84 s, BENCHMARKS 22); `suite validate` only

    for c in cases:
        if c["kind"] == "onnx":
            continue  # a model file, checked at expansion; nothing to resolve
        if c["kind"] == "opinfo":
            oi = c["opinfo"]
            if (oi["name"], oi["variant"]) not in execute.opinfo_db():
                raise spec.SuiteError(c["file"], c["id"], "opinfo.name",
                                      f"unknown OpInfo {oi['name']!r} (variant {oi['variant']!r}) in this torch")
            continue
        targets = ([(f"pair.{s}.{c['pair'][s]['kind']}", c["pair"][s]["kind"], c["pair"][s]["target"])
                    for s in ("a", "b")] if c["kind"] == "pair" else [(c["kind"], c["kind"], c["target"])])
        for key, kind, t in targets:
            if not (t.startswith("aten::") or code.torch_target(t, kind)):
                continue  # our own / a declared module: located and read at expansion, never imported
            try:
                obj = execute.resolve(t, (), kind)
            except (ImportError, AttributeError, ValueError) as e:
                what = "op" if t.startswith("aten::") else "import path"
                raise spec.SuiteError(c["file"], c["id"], key, f"unknown {what} {t!r}: {type(e).__name__}: {e}") from None
            if not callable(obj):
                raise spec.SuiteError(c["file"], c["id"], key, f"{t!r} is not callable")
            if kind == "module" and not isinstance(obj, type):
                raise spec.SuiteError(c["file"], c["id"], key, f"{t!r} is not a class: `module:` constructs a "
                                                               f"class with `args`; call a function with `op:`")
    return cases


def suite_names(root: str | Path | None = None) -> list[str]:
    return sorted(p.stem for p in (Path(root) if root else spec.suites_dir()).glob("*.yaml"))


def main(argv=None, prog: str = "python -m parity.commands.suite_cli") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["import-opdiff"]:  # light: yaml only (parity.suites.opdiff)
        return opdiff.main(argv[1:], prog=f"{prog} import-opdiff")
    if argv[:1] == ["import-onnx"]:  # ONNX's backend node tests as a suite (parity.suites.onnximport)
        from parity.suites import onnximport  # lazy: onnx +0.23 s (BENCHMARKS 22); `suite import-onnx` only

        return onnximport.main(argv[1:], prog=f"{prog} import-onnx")
    if argv[:1] == ["show"]:
        return show.main(argv[1:], prog=f"{prog} show")
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.replace("python -m parity.commands.suite_cli", prog),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for cmd, hlp in (("list", "print the case ids of each suite"),
                     ("validate", "expand and resolve every target; print the first error (file, case, key)")):
        sp = sub.add_parser(cmd, help=hlp)
        sp.add_argument("suites", nargs="+" if cmd == "validate" else "*",
                        help="suite names (conf/suites/<name>.yaml) or suite file paths"
                             + (" (none: list the suites)" if cmd == "list" else ""))
        sp.add_argument("--root", default=None, help="suites folder (default: conf/suites)")
        if cmd == "list":
            sp.add_argument("--long", action="store_true", help="also print kind and op label")
    a = ap.parse_args(argv)
    if a.cmd == "list" and not a.suites:  # the suites there are, with their case counts
        for name in suite_names(a.root):
            try:
                print(f"{name}\t{len(list_cases(name, a.root))} cases")
            except spec.SuiteError as e:
                print(f"{name}\terror: {e}")
        return 0
    rc = 0
    for s in a.suites:
        try:
            cases = list_cases(s, a.root) if a.cmd == "list" else validate(s, a.root)
        except spec.SuiteError as e:
            print(f"parity suite {a.cmd}: error: {e}", file=sys.stderr)
            rc = 2
            continue
        if a.cmd == "list":
            for c in cases:
                print(f"{c['id']}\t{c['kind']}\t{c['label']}" if a.long else c["id"])
        else:
            print(f"{s}: OK, {len(cases)} cases ({len({c['label'] for c in cases})} ops/modules)")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
