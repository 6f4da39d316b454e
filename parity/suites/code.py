"""The code a suite names, for its stages' dependencies: the env stage writes
artifacts/code/suite-<name>.json for every selected suite (parity.suites.features.suite_code), a
dependency of suite_run@<name>-*. Light (yaml, hashlib): never imports the suite's code.
"""

from __future__ import annotations

from pathlib import Path

from parity.suites import features, spec


def suites_code(p: dict, root: Path | None = None) -> dict[str, dict]:
    """{suite: what its run stages depend on (suite_code)} for every suite selected in params `p`;
    written by the env stage to artifacts/code/suite-<name>.json (a dep of suite_run@<name>-*)."""
    root = Path.cwd() if root is None else root
    out = {}
    for name, sec in sorted((p.get("suites") or {}).items()):
        try:
            cases = spec.expand(name, sec)
        except spec.SuiteError as e:
            out[name] = {"source": "suite", "error": str(e)}
            continue
        out[name] = features.suite_code(cases, root)
    return out
