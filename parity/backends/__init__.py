"""Providers. Each is one module with a Runner subclass plus one conf/providers/<name>.yaml naming it
(`runner: package.module:Class`): the conf directory is the registry, so adding a backend edits
nothing else. Runner modules import their heavy library lazily (inside activate/availability)."""

from __future__ import annotations

import importlib

from parity.backends.base import STATUSES, CaptureJob, CaptureResult, Runner, run_capture  # noqa: F401


def load_runner(path: str) -> type[Runner]:
    mod, _, cls = path.partition(":")
    try:
        obj = getattr(importlib.import_module(mod), cls)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"runner '{path}' cannot be imported: {e}") from e
    if not (isinstance(obj, type) and issubclass(obj, Runner)):
        raise ValueError(f"runner '{path}' is not a parity.backends.base.Runner subclass")
    return obj
