"""Compatibility names: the ONNX-file model source moved to parity.models.onnx_source (issue 37: a model
source lives with the models, below the pipeline, analysis and suites that read ONNX files through it).
Project code imports parity.models.onnx_source; this module keeps the old import path working."""

from __future__ import annotations

from parity.models.onnx_source import *  # noqa: F401,F403
from parity.models.onnx_source import _probe  # noqa: F401
