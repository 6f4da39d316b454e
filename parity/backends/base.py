"""Compatibility names: what parity.backends.base held before the split (issue 37).

The Runner interface is parity.backends.runner, the capture driver parity.backends.capture_driver,
the loaders (the runner a conf names, calibration samples, the fp64 reference) parity.backends.loader.
Project code imports those; this module keeps `from parity.backends.base import X` working for code
written against the old layout (a user's own runner, tests). New code should not import it.
"""

from __future__ import annotations

from parity.backends.capture_driver import (CaptureSink, KeepSink, latency_stats, onnx_file_unsupported,  # noqa: F401
                                            run_capture, write_own)
from parity.backends.loader import (WHOLE_MAX_MB, calibration_feeds, gold_rows, gold_samples,  # noqa: F401
                                    lazy_gold_samples, load_runner, reference_samples)
from parity.backends.runner import (STATUSES, CaptureJob, CaptureResult, CompileError, OpJob,  # noqa: F401
                                    OpSkip, Runner, SessionError, Unavailable, error_reason, interleave)
