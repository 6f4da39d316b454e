"""Native TensorRT (10.x Python API). The `engine@model-dtype-trt` stage (stages/engine.py) builds
serialized engines with `build()`; `capture_engine@cell` runs them with TrtRunner.

Two engines per cell, both reported (build.json says which number comes from which):
  plain.plan   from model.onnx (only the model outputs): the engine under test. Its output is what
               the report compares as `plain:output`, and what latency is measured on.
  layers.plan  from layers.onnx, where every leaf layer is a network output. Marking a tensor as an
               output stops TensorRT fusing it away, so this engine is NOT the one under test: the
               per-layer values come from it. build.json lists, for the plain engine, which layer
               outputs survived as tensors and which were fused away (engine inspector, DETAILED).
Builder: network from the ONNX parser, builder config with a workspace limit, precision flags by
precision mode (fp32: none, with TF32 disabled; fp16; bf16; int8 with calibration from the inputs
stage's calibration samples; fp8), optional strongly-typed network, and a timing cache that is read
before and written after each build (kept as a DVC `persist` artifact so rebuilds are fast).

Never imports torch. Device buffers use cuda-python (`cuda.bindings.runtime`, or the older
`cuda.cudart`). Not executed on the machines this was written on (no TensorRT, no GPU): only
availability and everything around the build (config, stage wiring, UNAVAILABLE) is tested.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from parity.backends.runner import Runner, Unavailable
from parity.config import schema
from parity.core.io import write_bytes

PLAIN, LAYERS, BUILD = "plain.plan", "layers.plan", "build.json"


def _cudart():
    try:
        from cuda.bindings import runtime as cudart  # optional: cuda-python >= 12.6
    except ImportError:
        from cuda import cudart  # optional: older cuda-python
    return cudart


def _check(ret):
    err, *rest = ret if isinstance(ret, tuple) else (ret,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA runtime error {err}")
    return rest[0] if len(rest) == 1 else rest


def availability() -> str | None:
    """None if TensorRT 10 can build and run engines here, else why not (cheap: no device work)."""
    try:
        import tensorrt as trt  # optional: a missing TensorRT is an UNAVAILABLE status
    except ImportError as e:
        return f"TensorRT is not installed (import tensorrt: {e})"
    major = int(str(trt.__version__).split(".")[0])
    if major < 10:
        return f"TensorRT {trt.__version__} found; parity's builder uses the TensorRT 10 API"
    try:
        _cudart()
    except ImportError as e:
        return f"cuda-python is not installed (device buffers for TensorRT): {e}"
    if not Path("/proc/driver/nvidia/version").exists():
        return "no NVIDIA driver (/proc/driver/nvidia/version is missing)"
    return None


def precision(dtype_cfg: dict) -> str:
    """fp32 | fp16 | bf16 | int8 | fp8: the builder precision a dtype option asks for."""
    mode = schema.mode(dtype_cfg)
    if mode == "int8_static":
        return "int8"
    if mode == "fp8":
        return "fp8"
    return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(dtype_cfg["torch"], "fp32")


def _calibrator(trt, feeds: list[dict], input_names: list[str], cache: Path):
    """INT8 entropy calibrator over the inputs stage's calibration samples (deprecated in TensorRT
    10.x in favour of explicit Q/DQ quantization, still supported: see docs/providers.md)."""
    cudart = _cudart()

    class Calibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self):
            super().__init__()
            self.i = 0
            self.buf = {n: _check(cudart.cudaMalloc(feeds[0][n].nbytes)) for n in input_names}

        def get_batch_size(self):
            return 1  # each sample is a full batch of the model's declared input shape

        def get_batch(self, names):
            if self.i >= len(feeds):
                return None
            for n in names:
                a = np.ascontiguousarray(feeds[self.i][n])
                _check(cudart.cudaMemcpy(self.buf[n], a.ctypes.data, a.nbytes,
                                         cudart.cudaMemcpyKind.cudaMemcpyHostToDevice))
            self.i += 1
            return [int(self.buf[n]) for n in names]

        def read_calibration_cache(self):
            return cache.read_bytes() if cache.exists() else None

        def write_calibration_cache(self, data):
            write_bytes(cache, bytes(data))

    return Calibrator()


def _build_one(trt, logger, onnx_path: Path, prec: str, opts: dict, timing_cache: bytes,
               calib_feeds: list[dict] | None, calib_cache: Path):
    builder = trt.Builder(logger)
    flags = 0
    if opts.get("strongly_typed", False):
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)  # explicit batch is the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_path.read_bytes(), str(onnx_path)):  # the path: weights.bin beside it
        errs = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT ONNX parser rejected {onnx_path.name}: {errs}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(opts.get("workspace_mb", 1024)) << 20)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED  # layer info for the fusion report
    if not opts.get("strongly_typed", False):  # a strongly typed network takes types from the graph
        if prec == "fp32":
            config.clear_flag(trt.BuilderFlag.TF32)  # fp32 means IEEE fp32 (TF32 is on by default)
        elif prec == "fp16":
            config.set_flag(trt.BuilderFlag.FP16)
        elif prec == "bf16":
            config.set_flag(trt.BuilderFlag.BF16)
        elif prec == "int8":
            config.set_flag(trt.BuilderFlag.INT8)
            config.set_flag(trt.BuilderFlag.FP16)  # layers without int8 kernels fall back to fp16
            names = [network.get_input(i).name for i in range(network.num_inputs)]
            config.int8_calibrator = _calibrator(trt, calib_feeds or [], names, calib_cache)
        elif prec == "fp8":
            # FP8 kernels run only where the graph has Q/DQ nodes (explicit quantization); without
            # them TensorRT keeps those layers in higher precision.
            config.set_flag(trt.BuilderFlag.FP8)
            config.set_flag(trt.BuilderFlag.FP16)
    cache = config.create_timing_cache(timing_cache)
    config.set_timing_cache(cache, ignore_mismatch=False)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeError(f"TensorRT could not build an engine from {onnx_path.name} at {prec}")
    outputs = [network.get_output(i).name for i in range(network.num_outputs)]
    return bytes(plan), bytes(config.get_timing_cache().serialize()), outputs


def _layer_info(trt, logger, plan: bytes) -> list[dict]:
    engine = trt.Runtime(logger).deserialize_cuda_engine(plan)
    info = json.loads(engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON))
    return [layer if isinstance(layer, dict) else {"Name": layer} for layer in info.get("Layers", [])]


def build(model_dir: Path, dtype_cfg: dict, opts: dict, calib_feeds: list[dict] | None, out: Path,
          timing_cache: Path, layer_names: list[str]) -> dict:
    """Build plain.plan and layers.plan under `out`; read/update `timing_cache`. Returns build info."""
    import tensorrt as trt  # optional: TensorRT is no dependency (TensorRT machines only)

    logger = trt.Logger(trt.Logger.WARNING)
    prec = precision(dtype_cfg)
    tc = timing_cache.read_bytes() if timing_cache.exists() else b""
    out.mkdir(parents=True, exist_ok=True)
    info = {"status": "OK", "tensorrt": trt.__version__, "precision": prec,
            "strongly_typed": bool(opts.get("strongly_typed", False)),
            "workspace_mb": int(opts.get("workspace_mb", 1024)), "engines": {}}
    for plan_name, onnx_name in ((PLAIN, "model.onnx"), (LAYERS, "layers.onnx")):
        plan, tc, outputs = _build_one(trt, logger, model_dir / onnx_name, prec, opts, tc, calib_feeds,
                                       out / "calibration.cache")
        write_bytes(out / plan_name, plan)  # atomic: a killed build never leaves a partial engine
        info["engines"][plan_name] = {"from": onnx_name, "outputs": outputs}
        if plan_name == PLAIN:
            layers = _layer_info(trt, logger, plan)
            made = {t.get("Name", t) if isinstance(t, dict) else t for layer in layers
                    for t in layer.get("Outputs", [])}
            info["plain_engine_layers"] = [layer.get("Name") for layer in layers]
            info["fused_away_in_plain"] = [n for n in layer_names if n not in made]
    if tc:
        write_bytes(timing_cache, tc)
    info["per_layer_values_from"] = f"{LAYERS} (every layer marked as an output; fusion differs from {PLAIN})"
    info["plain_output_and_latency_from"] = PLAIN
    return info


class _Engine:
    """One deserialized engine with its execution context and device buffers (TensorRT 10 tensor API)."""

    def __init__(self, trt, runtime, plan: bytes):
        self.cudart = _cudart()
        self.engine = runtime.deserialize_cuda_engine(plan)
        if self.engine is None:
            raise RuntimeError("TensorRT could not deserialize the engine (built by another version?)")
        self.ctx = self.engine.create_execution_context()
        self.stream = _check(self.cudart.cudaStreamCreate())
        self.io = {}
        for i in range(self.engine.num_io_tensors):
            name = self.engine.get_tensor_name(i)
            shape = tuple(self.engine.get_tensor_shape(name))
            dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype(name)))
            is_in = self.engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            host = np.empty(shape, dtype)
            dev = _check(self.cudart.cudaMalloc(max(host.nbytes, 1)))
            self.ctx.set_tensor_address(name, int(dev))
            self.io[name] = (is_in, host, dev)

    def run(self, feeds: dict, names: list[str]) -> list[tuple[str, np.ndarray]]:
        cr = self.cudart
        for name, (is_in, host, dev) in self.io.items():
            if is_in:
                a = np.ascontiguousarray(feeds[name], dtype=host.dtype)
                _check(cr.cudaMemcpyAsync(dev, a.ctypes.data, a.nbytes,
                                          cr.cudaMemcpyKind.cudaMemcpyHostToDevice, self.stream))
        if not self.ctx.execute_async_v3(self.stream):
            raise RuntimeError("TensorRT execute_async_v3 failed")
        for name in names:
            _, host, dev = self.io[name]
            _check(cr.cudaMemcpyAsync(host.ctypes.data, dev, host.nbytes,
                                      cr.cudaMemcpyKind.cudaMemcpyDeviceToHost, self.stream))
        _check(cr.cudaStreamSynchronize(self.stream))
        return [(n, self.io[n][1].astype(np.float32, copy=True)) for n in names]

    def close(self):
        for _, _, dev in self.io.values():
            self.cudart.cudaFree(dev)
        self.cudart.cudaStreamDestroy(self.stream)


class TrtRunner(Runner):
    engine_build = True
    options_schema = {"workspace_mb": "positive_int", "strongly_typed": "bool"}
    precision_modes = ("cast", "int8_static", "fp8")

    @classmethod
    def engine_availability(cls) -> str | None:
        return availability()

    @classmethod
    def engine_precision(cls, dtype_cfg: dict) -> str:
        return precision(dtype_cfg)

    @classmethod
    def build_engine(cls, model_dir, dtype_cfg, options, calibration, out, timing_cache, layer_names):
        return build(model_dir, dtype_cfg, options, calibration, out, timing_cache, layer_names)

    @classmethod
    def availability(cls, job):
        why = availability()
        if why:
            return why
        if job.engine_dir is None or not (Path(job.engine_dir) / BUILD).exists():
            return "no engine: the engine@model-dtype-provider stage output is missing (--engine-dir)"
        b = json.loads((Path(job.engine_dir) / BUILD).read_text())
        if b.get("status") == "UNAVAILABLE":
            return b.get("reason")
        return None

    def activate(self) -> None:
        import tensorrt as trt  # optional: TensorRT is no dependency (TensorRT machines only)

        d = Path(self.job.engine_dir)
        b = json.loads((d / BUILD).read_text())
        if b.get("status") != "OK":
            raise RuntimeError(f"engine build: {b.get('status')}: {b.get('reason')}")
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.plain = _Engine(trt, runtime, (d / PLAIN).read_bytes())
        self.layers = _Engine(trt, runtime, (d / LAYERS).read_bytes())
        self.plain_names = b["engines"][PLAIN]["outputs"]
        self.layer_names = b["engines"][LAYERS]["outputs"]  # ONNX output order: outputs, then layers

    def infer(self, feeds):
        return self.layers.run(feeds, self.layer_names)

    def infer_plain(self, feeds):
        return self.plain.run(feeds, self.plain_names)

    def deactivate(self) -> None:
        for e in (getattr(self, "plain", None), getattr(self, "layers", None)):
            if e is not None:
                e.close()
        self.plain = self.layers = None


__all__ = ["TrtRunner", "Unavailable", "availability", "build", "precision"]
