"""Providers. Each is one module with a Runner subclass plus one conf/providers/<name>.yaml naming it
(`runner: package.module:Class`): the conf directory is the registry, so adding a backend edits
nothing else. Runner modules import their heavy library lazily (inside activate/availability)."""

from __future__ import annotations

import importlib

from parity.backends.base import STATUSES, CaptureJob, CaptureResult, Runner, run_capture  # noqa: F401
from parity.config import imports as code


def load_runner(path: str, imports=None) -> type[Runner]:
    """The Runner class `path` ('package.module:Class') names. Only parity.backends.* is imported
    unless `imports` (the provider's `import:`) declares the module as code to run; parity.config.params
    checked the same rule at compose, without importing."""
    if not path.startswith(code.RUNNER_NAMESPACE) and not any(
            path.partition(":")[0] == d or path.startswith(d + ".") for d in code.declared(imports, "import")):
        raise ValueError(f"runner '{path}' is not a parity backend ({code.RUNNER_NAMESPACE}*) and the provider "
                         "declares no `import:` for it: not imported")
    mod, _, cls = path.partition(":")
    try:
        obj = getattr(importlib.import_module(mod), cls)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"runner '{path}' cannot be imported: {e}") from e
    if not (isinstance(obj, type) and issubclass(obj, Runner)):
        raise ValueError(f"runner '{path}' is not a parity.backends.base.Runner subclass")
    return obj
