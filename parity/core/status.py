"""The one status vocabulary (core): what a cell, a case or a verdict can be, and the orders the
stages and the report use. Plain strings in every artifact (`Status` is a StrEnum, so its members
are those strings).

  OK                ran; the values were captured (a model cell, a suite case)
  MISMATCH          a suite case ran and differs beyond its tolerance (a model cell's is verdict FAIL)
  NAN_IN_OUTPUT     a suite case gave NaN where the reference has none
  NAN_IN_REFERENCE  the fp32 reference itself gave NaN
  INVALID           the case fails on the reference too (or cannot be built): not the provider's fault
  UNSUPPORTED       the provider does not declare this dtype (or precision mode); for an ONNX model
                    case, the runtime says it has no kernel or schema for an op, type or attribute
  UNAVAILABLE       the backend cannot run on this machine (library or device missing)
  EXPORT_FAIL       preparing the model/op for the backend failed (export, a converter that raises,
                    engine build)
  COMPILE_FAIL      a compiler (torch.compile) raised on a model/op that runs eagerly
  INFER_FAIL        running it failed, including the runtime refusing to load the graph prepared
                    for it (an ORT session on an fp16 conversion), as a suite case's session error
  CRASH / TIMEOUT   a suite worker died / ran past its limit on the case (parity.suites.pool)
  SKIPPED           a suite case skipped on this (provider, dtype) by its `skip_on` rule, with the reason
                    (or an ONNX model case the harness cannot run here: an op version newer than
                    the installed onnxruntime implements, a map value)
  NOT_RUN / MISSING no result yet (stage not run; the report's cell without metrics.json)
  PASS / FAIL       a model cell's verdict (every layer within its tolerance or oracle limit, or not)
  NOT_EXERCISED     a reduced-precision cell within its limit whose layers show no rounding of that
                    precision: the provider ran fp32 kernels (parity.core.oracle.precision); `strict:
                    true` fails it
  BASELINE          a cell whose provider is the oracle's baseline backend at that dtype (torch_cpu
                    against the torch CPU eager baseline): judged against itself, it cannot fail
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    OK = "OK"
    MISMATCH = "MISMATCH"
    NAN_IN_OUTPUT = "NAN_IN_OUTPUT"
    NAN_IN_REFERENCE = "NAN_IN_REFERENCE"
    INVALID = "INVALID"
    UNSUPPORTED = "UNSUPPORTED"
    UNAVAILABLE = "UNAVAILABLE"
    EXPORT_FAIL = "EXPORT_FAIL"
    COMPILE_FAIL = "COMPILE_FAIL"
    INFER_FAIL = "INFER_FAIL"
    CRASH = "CRASH"
    TIMEOUT = "TIMEOUT"
    SKIPPED = "SKIPPED"
    NOT_RUN = "NOT_RUN"
    MISSING = "MISSING"
    PASS = "PASS"
    FAIL = "FAIL"
    NOT_EXERCISED = "NOT_EXERCISED"
    BASELINE = "BASELINE"


def _values(*members: Status) -> tuple[str, ...]:
    return tuple(m.value for m in members)


S = Status
# what a runner's capture (and an engine build) ends with (parity.backends.capture_driver.run_capture)
RUNNER = _values(S.OK, S.UNSUPPORTED, S.UNAVAILABLE, S.EXPORT_FAIL, S.COMPILE_FAIL, S.INFER_FAIL)
# a suite case's statuses in the order the suite diff counts them
CASE_ORDER = _values(S.OK, S.MISMATCH, S.NAN_IN_OUTPUT, S.NAN_IN_REFERENCE, S.INVALID, S.EXPORT_FAIL,
                     S.COMPILE_FAIL, S.INFER_FAIL, S.CRASH, S.TIMEOUT, S.UNAVAILABLE, S.UNSUPPORTED, S.SKIPPED)
# worst first: what an op's coverage cell shows when its cases disagree
SEVERITY = _values(S.CRASH, S.TIMEOUT, S.INFER_FAIL, S.EXPORT_FAIL, S.COMPILE_FAIL, S.NAN_IN_OUTPUT, S.MISMATCH,
                   S.NAN_IN_REFERENCE, S.UNAVAILABLE, S.UNSUPPORTED, S.SKIPPED, S.INVALID, S.OK)
# a suite case the provider ran (counted in support rates)
CASE_RAN = _values(S.OK, S.MISMATCH, S.NAN_IN_OUTPUT, S.NAN_IN_REFERENCE)
# a model cell's verdicts when it ran
VERDICTS = _values(S.PASS, S.FAIL, S.NOT_EXERCISED, S.BASELINE)
# a ran cell whose verdict is no regression from PASS (a baseline cell is what PASS was before)
PASSING = _values(S.PASS, S.BASELINE)
# a ran cell that `strict: true` fails besides FAIL (the precision asked for was not computed)
STRICT_FAILS = _values(S.NOT_EXERCISED)


def layer_counts(m: dict) -> str:
    """'N layers compared, K failing' of a model cell's metrics, and the outputs that fail: a cell's layer
    count leaves its outputs out, so a fault only in the shipped graph (model.onnx: `plain_output`) used to
    read "0 failing" beside FAIL. Used by the diff log, the report's verdict line and its matrix hover."""
    outs = [label for key, label in (("output", "the output"), ("plain_output", "the shipped graph's output (model.onnx)"))
            if (m.get(key) or {}).get("passed") is False]
    return (f"{m.get('layers')} layers compared, {m.get('layers_failed')} failing"
            + (f"; {' and '.join(outs)} fail{'s' if len(outs) == 1 else ''}" if outs else ""))
