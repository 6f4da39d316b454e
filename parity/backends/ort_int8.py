"""ONNX Runtime CPU on INT8-quantized graphs (onnxruntime.quantization), two precision modes
(conf/dtypes `mode:`):
  int8_dynamic  quantize_dynamic: int8 weights, activations quantized per call from their runtime
                range (MatMul/Gemm -> MatMulInteger/DynamicQuantizeLinear; convolutions -> ConvInteger)
  int8_static   quantize_static, QDQ format: int8 weights and activation scales fixed by
                calibration on the inputs stage's calibration samples (`inputs.calibration`, drawn
                with seeds distinct from the evaluated samples, so the model is never calibrated on
                what it is judged on)
Graph inputs and outputs stay float32 (the quantizer puts DequantizeLinear before each graph output,
which keeps its name), so every layer compares against the fp32 reference by the same name.
The per-layer graph (layers.onnx) and the plain graph (model.onnx) are quantized separately with the
same settings and calibration data; the plain graph's output is compared as `plain:output` too.
Options: per_channel, reduce_range (auto | true | false), weight_type / activation_type (QInt8 |
QUInt8), calibrate_method (MinMax | Entropy | Percentile), plus the ORT options of ort_cpu. Never
imports torch.

reduce_range (7-bit weights). On x86 CPUs without VNNI, ONNX Runtime's u8 x s8 GEMM kernels add pairs
of products in int16 with saturation, so full-range int8 weights can saturate (measured on the
runner-contract mlp under an AVX2-only CPU: fc1 rel_l2 0.28 instead of 0.008); 7-bit weights cannot,
and then give the same integers as the VNNI kernels. `auto` (the default) resolves to true on an x86
CPU without VNNI and false otherwise (parity.backends.fingerprint.int8_kernels, which reads the same
/proc/cpuinfo or $PARITY_CPUINFO fixture as the `cpu` fingerprint this provider's cells depend on).
The resolved value, where it came from and the CPU's int8 features go to the capture's status.json
(`settings`, see `settings()`). u8 x s8 is int8_dynamic (its activations are u8) and int8_static with
activation_type QUInt8, both with weight_type QInt8; s8 x s8 static QDQ and u8 weights did not
saturate there (docs/providers.md).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import onnx
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static
from onnxruntime.quantization.calibrate import CalibrationDataReader

from parity.backends import fault, fingerprint
from parity.backends.loader import calibration_feeds
from parity.backends.ort_cpu import OrtRunner
from parity.models.onnx_weights import load_with_data, with_data
from parity.config import schema

INT8_MODES = ("int8_dynamic", "int8_static")


def int8_settings(provider: str, mode: str, opts: dict, kernels: dict) -> dict:
    """The int8 settings a cell runs with (its status.json `settings`): reduce_range resolved from
    `opts` (auto: true on an x86 CPU without VNNI) and the config key that decided it, the CPU's
    int8 kernel features (fingerprint.int8_kernels), whether the GEMMs are u8 x s8, and
    `saturation_risk`: u8 x s8 on a CPU without VNNI with full-range weights."""
    want = opts.get("reduce_range", "auto")
    key = f"<providers.{provider}.options.reduce_range={str(want).lower()}>"
    vnni, flags = kernels.get("vnni"), kernels.get("flags") or []
    cpu = (f"CPU {'with' if vnni else 'without'} VNNI (int8 flags: {', '.join(flags) or 'none'})"
           if vnni is not None else f"VNNI unknown ({kernels.get('reason', 'CPU not read')})")
    if want == "auto":
        rr, why = vnni is False, f"auto {key}: {cpu}"
    else:
        rr, why = bool(want), f"set {key}"
    u8s8 = opts.get("weight_type", "QInt8") == "QInt8" and (
        mode == "int8_dynamic" or opts.get("activation_type", "QInt8") == "QUInt8")
    return {"reduce_range": rr, "reduce_range_from": why, "cpu_vnni": vnni, "cpu_int8_flags": flags,
            "u8s8": u8s8, "saturation_risk": bool(vnni is False and u8s8 and not rr)}


class _DropMessage(logging.Filter):
    """Drops root-logger records containing `text` (onnxruntime.quantization's pre-processing hint,
    logged twice per call: a plan quantizes once per candidate layer)."""

    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record) -> bool:
        return self.text not in record.getMessage()


class _Reader:
    """onnxruntime.quantization.CalibrationDataReader over a list of feeds."""

    def __init__(self, feeds):
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)

    def rewind(self):  # pragma: no cover - not used by the MinMax path
        pass


class OrtInt8Runner(OrtRunner):
    ep = "CPUExecutionProvider"
    precision_modes = INT8_MODES
    options_schema = {**OrtRunner.options_schema, "per_channel": "bool", "weight_type": ("QInt8", "QUInt8"),
                      "reduce_range": "auto_bool", "activation_type": ("QInt8", "QUInt8"),
                      "calibrate_method": ("MinMax", "Entropy", "Percentile")}

    def _opts(self) -> dict:
        return self.job.provider_cfg.get("options") or {}

    @classmethod
    def settings(cls, job) -> dict:
        mode = schema.mode(job.dtype_cfg)
        if mode not in INT8_MODES:
            return {}
        return int8_settings(job.provider, mode, job.provider_cfg.get("options") or {},
                             fingerprint.int8_kernels())

    def _prepare(self) -> None:
        """Check the precision mode and load the calibration samples (int8_static); once."""
        if getattr(self, "mode_", None):
            return
        mode = schema.mode(self.job.dtype_cfg)
        if mode not in INT8_MODES:
            raise ValueError(f"{type(self).__name__} runs precision modes {INT8_MODES}, not '{mode}' "
                             f"(dtypes.{self.job.dtype}.mode)")
        if mode == "int8_static":
            if self.job.calibration is None or not Path(self.job.calibration).exists():
                raise ValueError("int8_static needs calibration samples (capture --calibration, written "
                                 "by the inputs stage: inputs.calibration)")
            self.calib = calibration_feeds(self.job.calibration)
            if not self.calib:
                raise ValueError("int8_static: the calibration file has no samples (set inputs.calibration >= 1)")
        self.settings_ = self.settings(self.job)
        self.mode_ = mode

    def activate(self) -> None:
        self._prepare()
        super().activate()

    def _convert(self, path):
        """(the quantized graph serialised, None: no external data): onnxruntime's quantizer takes a whole model, so the
        weights are read in (onnx.load resolves weights.bin beside the graph): int8 is for models
        whose fp32 weights fit a protobuf (under 2 GiB)."""
        # The dynamo exporter records value_info for initializers; the quantizer rewrites some
        # weights (e.g. transposes Gemm's B) and strict shape inference then fails on the stale
        # entries. Drop value_info: the quantizer infers shapes again.

        src = load_with_data(path)  # weights.bin read in (hard-linked by DVC's cache: onnx's loader refuses it)
        if self._fault():  # options.fault (parity.backends.fault): before quantizing, as ort_int4 does
            src = fault.inject(src, self._fault(), Path(path).parent)
        del src.graph.value_info[:]
        m = self._quantize(src)
        self._check_io(src, m, Path(path).name)
        return m.SerializeToString(), None

    def quantized(self, path):
        """(the graph at `path` as this cell runs it: fault applied, quantized; None: weights inline):
        what the quantised oracle compares its own quantisation with (parity.pipeline.quant_reference.
        static_check). Call deactivate() after."""
        self._prepare()
        data, _ = self._convert(path)
        return onnx.ModelProto.FromString(data), None

    def _quantize(self, src, exclude=None, calibration_cache=None):
        """`src` (a ModelProto) quantized as this cell quantizes; `exclude`: node names left in float32
        (the quantizer's nodes_to_exclude); `calibration_cache`: a JSON file of calibrated tensor
        ranges, written by the first call and read by the next (onnxruntime's calibration_cache_path)."""
        o = self._opts()
        common = {"per_channel": bool(o.get("per_channel", False)),
                  "reduce_range": self.settings_["reduce_range"],
                  "weight_type": getattr(QuantType, o.get("weight_type", "QInt8")),
                  "nodes_to_exclude": sorted(exclude or [])}
        with tempfile.TemporaryDirectory(prefix="parity-int8-") as d:
            inp, out = Path(d) / "in.onnx", Path(d) / "q.onnx"
            onnx.save(src, str(inp))
            if self.mode_ == "int8_dynamic":
                quantize_dynamic(str(inp), str(out), **common)
            else:
                reader = type("Reader", (_Reader, CalibrationDataReader), {})(self.calib)
                cache = {} if calibration_cache is None else {"calibration_cache_path": str(calibration_cache)}
                quantize_static(str(inp), str(out), reader, quant_format=QuantFormat.QDQ,
                                activation_type=getattr(QuantType, o.get("activation_type", "QInt8")),
                                calibrate_method=getattr(CalibrationMethod, o.get("calibrate_method", "MinMax")),
                                **common, **cache)
            return onnx.load(str(out))

    def _mixed_model(self, m, fp32_nodes):
        """Runner.mixed for int8: (quantized as the cell is, with `fp32_nodes` excluded, None); `m`'s
        weights are read in (the quantizer takes a whole model). Calibration runs once per runner
        (its ranges are cached for the next calls)."""
        self._prepare()
        m = with_data(m, self.job.model_dir)
        if getattr(self, "_cal_dir", None) is None:
            self._cal_dir = tempfile.TemporaryDirectory(prefix="parity-int8-cal-")
        del m.graph.value_info[:]  # as _convert: the quantizer infers shapes itself
        hint = _DropMessage("pre-processing before quantization")  # 2 lines a call, once per plan is plenty
        logging.getLogger().addFilter(hint)
        try:
            q = self._quantize(m, fp32_nodes, Path(self._cal_dir.name) / "calibration.json")
        finally:
            logging.getLogger().removeFilter(hint)
        self._check_io(m, q, "model.onnx")
        return q, None

    def deactivate(self) -> None:
        super().deactivate()
        if getattr(self, "_cal_dir", None) is not None:
            self._cal_dir.cleanup()
            self._cal_dir = None

    @staticmethod
    def _check_io(src, q, where: str) -> None:
        """The quantized graph must keep the fp32 graph's output names and float32 outputs."""
        want = [(o.name, o.type.tensor_type.elem_type) for o in src.graph.output]
        got = [(o.name, o.type.tensor_type.elem_type) for o in q.graph.output]
        if got != want:
            missing = sorted({n for n, _ in want} - {n for n, _ in got})
            retyped = [n for (n, t), (n2, t2) in zip(want, got) if n == n2 and t != t2]
            raise ValueError(f"quantizing {where} changed its outputs (missing {missing[:5]}, "
                             f"retyped {retyped[:5]})")
