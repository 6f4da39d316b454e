"""PyTorch eager on CPU at fp32 / fp16 / bf16: the model is cast with `.to(dtype)`, floating inputs
too; captured values are upcast to float32 (exact) for storage."""

from __future__ import annotations

import numpy as np

from parity.backends.base import Runner


class TorchRunner(Runner):
    device = "cpu"

    def activate(self) -> None:
        import torch

        from parity.models import build
        from parity.models.layers import LayerRecorder

        if self.job.threads:
            torch.set_num_threads(self.job.threads)
        self.torch = torch
        self.dtype = getattr(torch, self.job.dtype_cfg["torch"])
        model = build(self.job.model_cfg["arch"], self.job.seed).to(device=self.device, dtype=self.dtype)
        self.rec = LayerRecorder(model).eval()
        self.input_names = [s["name"] for s in self.job.model_cfg["input"]]

    def _tensors(self, feeds):
        t = self.torch
        out = []
        for n in self.input_names:
            x = t.from_numpy(np.ascontiguousarray(feeds[n])).to(self.device)
            out.append(x.to(self.dtype) if x.is_floating_point() else x)
        return out

    def infer(self, feeds):
        with self.torch.no_grad():
            self.rec.recording = True
            outs = self.rec(*self._tensors(feeds))
        return [(n, self._np(v)) for n, v in zip(self.rec.names, outs)]

    def _np(self, v):
        v = v.detach().to("cpu")
        if v.dtype in (self.torch.float16, self.torch.bfloat16):
            v = v.float()
        return v.numpy()

    def infer_plain(self, feeds):
        from parity.models.layers import flatten, output_names

        with self.torch.no_grad():
            self.rec.recording = False
            out = self.rec(*self._tensors(feeds))
        return [(n, self._np(v)) for n, v in zip(output_names(out), flatten(out))]

    def deactivate(self) -> None:
        self.rec = None


class TorchCpuRunner(TorchRunner):
    pass
