"""Capture of a model with several input shapes (`models.<m>.shapes`, parity.config.inputspec): one run
over every sample set, as for one shape; when it fails, each shape's samples are run alone, so the
failure is attributed to the shape(s) it happens at and the other shapes still give their values.

The per-shape runs measure no own error: run_capture's own-error pass pairs every input sample with
the fp64 reference's, and a shape alone is a subset of them.
"""

from __future__ import annotations

from parity.backends.capture_driver import run_capture
from parity.backends.runner import CaptureJob, CaptureResult, Runner

SPLIT = ("INFER_FAIL", "COMPILE_FAIL")  # failures that can depend on the input shape


def capture_by_shape(cls: type[Runner], job: CaptureJob, feeds: list, sets: list, warmup: int, repeats: int,
                     describe, sink=None) -> tuple[CaptureResult, dict | None]:
    """(result, {label: {status, reason}} or None for a model without shapes). `sets`: (label, range)
    per sample set (parity.config.inputspec.sample_sets); `describe(label)` names a shape in a reason. The
    values go to `sink` (run_capture) unless the cell falls back to one run per shape: then the sink
    is aborted and the values are in result.samples, where a sample of a shape that failed is an
    empty list (sample numbers stay global)."""
    res = run_capture(cls, job, feeds, warmup, repeats, sink)
    if sets[0][0] is None:
        return res, None
    if res.status not in SPLIT:
        return res, {lab: {"status": res.status, "reason": res.reason} for lab, _ in sets}
    if sink is not None:
        sink.abort()
    whole = res
    shapes, samples, latency, failed = {}, [], [], []
    for lab, idx in sets:
        r = run_capture(cls, job, [feeds[k] for k in idx], warmup, repeats)
        reason = f"at shape {describe(lab)}: {r.reason}" if r.status != "OK" else ""
        shapes[lab] = {"status": r.status, "reason": reason}
        samples += r.samples if r.status == "OK" else [[] for _ in idx]
        latency = latency or (r.latency_ms if r.status == "OK" else [])
        if r.status != "OK":
            failed.append((lab, r))
    if not failed:  # every shape runs alone: the failure needs them together (e.g. a shape-caching backend)
        reason = f"fails only when the shapes run in one session ({', '.join(shapes)}): {whole.reason}"
        return CaptureResult(whole.status, reason), {lab: {"status": whole.status, "reason": reason} for lab in shapes}
    first = failed[0][1]
    ok = [lab for lab, s in shapes.items() if s["status"] == "OK"]
    reason = "; ".join(shapes[lab]["reason"] for lab, _ in failed) + (f" (OK at {', '.join(ok)})" if ok else "")
    res = CaptureResult(first.status, reason, samples, latency, warmup if latency else 0)
    res.own_reason = "not measured: the shapes ran separately after a shape-specific failure"
    return res, shapes
