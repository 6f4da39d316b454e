"""ONNX Runtime on a GPU: the CUDA and TensorRT execution providers (onnxruntime-gpu), with their
provider options in conf (`options.provider_options`). Same graphs and conversions as ort_cpu; the
session must really run on the EP (onnxruntime silently falls back to CPU otherwise: that is
reported as UNAVAILABLE). Not executed here (CPU-only onnxruntime, no GPU): see
docs/gpu-verification.md. Never imports torch."""

from __future__ import annotations

from parity.backends.ort_cpu import OrtRunner


class OrtCudaRunner(OrtRunner):
    ep = "CUDAExecutionProvider"


class OrtTrtRunner(OrtRunner):
    """TensorRT EP. fp32 runs the fp32 graph; fp16 sets trt_fp16_enable on the same fp32 graph
    (TensorRT picks fp16 kernels itself), rather than converting the graph."""

    ep = "TensorrtExecutionProvider"
    plan_items = None  # precision is TensorRT's choice here (trt_fp16_enable): no per-node plan

    def provider_options(self) -> dict:
        po = super().provider_options()
        if self.job.dtype_cfg.get("torch") == "float16":
            po["trt_fp16_enable"] = "true"
        elif self.job.dtype_cfg.get("torch") == "bfloat16":
            po["trt_bf16_enable"] = "true"
        return po

    def _convert(self, path):
        return str(path)  # precision is a provider option here: the file as it is, by path
