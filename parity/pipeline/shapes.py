"""Capture of a model with several input shapes (`models.<m>.shapes`, parity.config.inputspec): one run
over every sample set, as for one shape; when it fails, each shape's samples are run alone, so the
failure is attributed to the shape(s) it happens at and the other shapes still give their values.

The per-shape runs measure no own error: run_capture's own-error pass pairs every input sample with
the fp64 reference's, and a shape alone is a subset of them.
"""

from __future__ import annotations

from pathlib import Path

from parity.backends import load_runner
from parity.backends.capture_driver import latency_stats, onnx_file_unsupported, run_capture
from parity.backends.runner import CaptureJob, CaptureResult, Runner
from parity.config import imports
from parity.core import modelfiles
from parity.pipeline.inputs import load

SPLIT = ("INFER_FAIL", "COMPILE_FAIL")  # failures that can depend on the input shape


def run_cell(job: CaptureJob, plan, inputs: Path, sink, timing: tuple[int, int], unavailable: str | None):
    """The provider's runner (`job.provider_cfg`) on every input shape of the model's InputPlan `plan`
    (its samples read from `inputs`), each at `timing` (warmup, repeats): (CaptureResult, runner
    settings, status by shape or None, latency stats). `unavailable`: why no node of the cluster offers
    the provider (fingerprint.cluster_unavailable), else None."""
    pc = job.provider_cfg
    if not unavailable and torch_runner_on_onnx_file(job, pc):  # decided without importing the runner (torch)
        res = CaptureResult("UNSUPPORTED", onnx_file_unsupported(job))
        return res, {}, None if plan.labels == [None] else {lab: {"status": res.status, "reason": res.reason}
                                                            for lab in plan.labels}, {}
    try:
        cls = load_runner(pc["runner"], pc.get("import"))
    except ValueError as e:
        return CaptureResult("UNAVAILABLE", f"{e} <providers.{job.provider}.runner>"), {}, None, {}
    if unavailable:
        res, by_shape = CaptureResult("UNAVAILABLE", unavailable), None
    else:  # several input shapes: a failure says which
        res, by_shape = capture_by_shape(cls, job, load(inputs), plan.sample_sets, *timing, plan.shown.__getitem__, sink)
    settings = cls.settings(job) if res.status != "UNSUPPORTED" and not unavailable else {}
    return res, settings, by_shape, latency_stats(res.latency_ms)


def torch_runner_on_onnx_file(job: CaptureJob, pc: dict) -> bool:
    """An ONNX-file model on a runner that takes torch models only, read from the runner's source (its
    class attributes onnx_based and engine_build, as Python would find them; never imported): the
    cell is UNSUPPORTED without loading torch (run_capture says the same after an import). False
    when the source cannot tell."""
    if not modelfiles.is_onnx_file(job.model_cfg):
        return False
    mod, _, name = str(pc.get("runner", "")).partition(":")
    found = [imports.class_value(mod, name, a) for a in ("onnx_based", "engine_build")] if name else [None]
    return found == [False, False]


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
