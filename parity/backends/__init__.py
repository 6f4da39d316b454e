"""Providers. Each is one module with a Runner subclass (parity.backends.runner) plus one
conf/providers/<name>.yaml naming it (`runner: package.module:Class`): the conf directory is the
registry (parity.backends.loader.load_runner reads it), so adding a backend edits nothing else. Runner
modules import their heavy library lazily (inside activate/availability)."""

from __future__ import annotations

from parity.backends.capture_driver import run_capture  # noqa: F401
from parity.backends.loader import load_runner  # noqa: F401
from parity.backends.runner import STATUSES, CaptureJob, CaptureResult, Runner  # noqa: F401
