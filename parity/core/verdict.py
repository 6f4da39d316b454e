"""The one verdict function (core): what a model cell's or a suite case's verdict is, as a `Status`
member, and why.

`decide(capture, summary)` is the only place that turns judged values into a verdict: a model cell's
layers into PASS, FAIL, BASELINE or NOT_EXERCISED, a suite case's tensors into OK, MISMATCH,
NAN_IN_OUTPUT or NAN_IN_REFERENCE (or it passes the capture's own status through when nothing ran).
The diff stage's metrics.json (parity.pipeline.cellfiles.metrics_of) and a suite case's result
(parity.suites.diff.diff_case) take their verdict from it; both judged their values by the same
`Rule` (parity.core.tolerance: parity.config.schema.rule for a model cell, schema.suite_rule for a
suite cell). Code elsewhere reads a decided verdict (compares it with a `Status` member), never makes
one (tests/test_house.py::test_one_function_decides_a_cells_verdict).
What feeds it is computed below it, once: every layer judged against the cell's `Rule`
(parity.core.tolerance) by tolerance (parity.core.compare.compare_layer) and by the fp64 oracle
(parity.core.oracle.judge), and the cell's summary (parity.pipeline.diff.summarize:
`passed`, `drift_origin`; `baseline` and `precision` from parity.core.oracle).

The order of the rules (parity.core.status says what each verdict means):
  the capture did not run       its status (UNSUPPORTED, INFER_FAIL, ...) with the capture's reason
  a layer fails                 FAIL, with the drift origin (a failure says more than the others)
  judged against itself         BASELINE, with the evidence (oracle.baseline_self)
  precision not exercised       NOT_EXERCISED, with the evidence (oracle.precision)
  else                          PASS

A suite case (`summary["case"]` true: parity.suites.diff) is judged per tensor; its summary lists the
`problems` found, each a (kind, reason) with a kind of PROBLEMS:
  the run did not give values   its status (CRASH, EXPORT_FAIL, ...) with its reason
  a problem                     the worst kind's status (NaN in the reference before NaN in the
                                output before a mismatch), the first three reasons (and how many more)
  else                          OK, with the summary's `evidence` (NaN at the same places), if any
"""

from __future__ import annotations

from typing import NamedTuple

from parity.core.status import Status


# a suite case's problem kinds, worst first, and the status each is reported as (parity.suites.diff)
PROBLEMS = {"nan_reference": Status.NAN_IN_REFERENCE, "nan_output": Status.NAN_IN_OUTPUT,
            "mismatch": Status.MISMATCH}
SHOWN = 3  # a failed case's reason names this many problems


class Verdict(NamedTuple):
    """A cell's verdict (a `Status` member: a plain string in every artifact) and its evidence."""
    status: Status
    reason: str


def decide(capture: dict, summary: dict | None = None) -> Verdict:
    """The verdict of a cell from its capture's status.json (`capture`: status, reason) and, when the
    capture ran (status OK), the summary of its judged layers (passed, drift_origin, baseline,
    precision); for a suite case (`case` true) the run's row and its summary (problems, evidence)."""
    if capture["status"] != Status.OK:
        return Verdict(Status(capture["status"]), capture.get("reason") or "")
    summary = summary or {}
    if summary.get("case"):
        return _case(summary)
    if not summary.get("passed"):
        origin = summary.get("drift_origin")
        return Verdict(Status.FAIL, f"drift origin {origin}" if origin else "a layer fails its limit")
    if summary.get("baseline"):
        return Verdict(Status.BASELINE, summary["baseline"])
    precision = summary.get("precision") or {}
    if precision.get("exercised") is False:
        return Verdict(Status.NOT_EXERCISED, precision.get("evidence") or "")
    return Verdict(Status.PASS, "every layer within its limit")


def _case(summary: dict) -> Verdict:
    """A suite case that ran: the worst of its problems, or OK."""
    problems = summary.get("problems") or []
    if not problems:
        return Verdict(Status.OK, summary.get("evidence") or "")
    kinds = list(PROBLEMS)
    worst = min((k for k, _ in problems), key=kinds.index)
    more = f" (+{len(problems) - SHOWN} more)" if len(problems) > SHOWN else ""
    return Verdict(PROBLEMS[worst], "; ".join(r for _, r in problems[:SHOWN]) + more)
