"""Compatibility names: the report's SVG charts moved to parity.core.svg (issue 37: below the report
assembly and the generation-drift report, parity.analysis.generate_report, which both draw with them).
Project code imports parity.core.svg; this module keeps the old import path working."""

from __future__ import annotations

from parity.core.svg import *  # noqa: F401,F403
from parity.core.svg import _log_range, _xlabels  # noqa: F401
