"""The one verdict function (core): what a model cell's verdict is, as a `Status` member, and why.

`decide(capture, summary)` is the only place that turns a cell's judged layers into PASS, FAIL,
BASELINE or NOT_EXERCISED (or passes the capture's own status through when the cell did not run):
the diff stage's metrics.json (parity.pipeline.cellfiles.metrics_of) takes its `verdict` from it.
What feeds it is computed below it, once: every layer judged against the cell's `Rule`
(parity.core.tolerance) by tolerance (parity.core.compare.compare_layer) and by the fp64 oracle
(parity.analysis.oracle.judge), and the cell's summary (parity.pipeline.diffcell.summarize:
`passed`, `drift_origin`; `baseline` and `precision` from parity.analysis.oracle).

The order of the rules (parity.core.status says what each verdict means):
  the capture did not run       its status (UNSUPPORTED, INFER_FAIL, ...) with the capture's reason
  a layer fails                 FAIL, with the drift origin (a failure says more than the others)
  judged against itself         BASELINE, with the evidence (oracle.baseline_self)
  precision not exercised       NOT_EXERCISED, with the evidence (oracle.precision)
  else                          PASS
"""

from __future__ import annotations

from typing import NamedTuple

from parity.core.status import Status


class Verdict(NamedTuple):
    """A cell's verdict (a `Status` member: a plain string in every artifact) and its evidence."""
    status: Status
    reason: str


def decide(capture: dict, summary: dict | None = None) -> Verdict:
    """The verdict of a cell from its capture's status.json (`capture`: status, reason) and, when the
    capture ran (status OK), the summary of its judged layers (passed, drift_origin, baseline,
    precision)."""
    if capture["status"] != Status.OK:
        return Verdict(Status(capture["status"]), capture.get("reason") or "")
    summary = summary or {}
    if not summary.get("passed"):
        origin = summary.get("drift_origin")
        return Verdict(Status.FAIL, f"drift origin {origin}" if origin else "a layer fails its limit")
    if summary.get("baseline"):
        return Verdict(Status.BASELINE, summary["baseline"])
    precision = summary.get("precision") or {}
    if precision.get("exercised") is False:
        return Verdict(Status.NOT_EXERCISED, precision.get("evidence") or "")
    return Verdict(Status.PASS, "every layer within its limit")
