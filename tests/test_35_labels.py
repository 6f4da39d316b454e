"""A cause never contradicts its verdict (issue 35, item 4): whatever the numbers, a layer the verdict
failed gets no cause that says its error is within the limit ("precision: rel_l2 2.98e-06 <= limit" on a
FAIL), including errors far inside the dtype's limit that a tighter verdict (a tolerance, the oracle's
per-layer floor) still fails. Synthetic pairs, one per pattern the causes know, at fp32 and fp16; and the
same pairs unfailed keep `precision` where they are within the limit (the check is the verdict's, not a
blanket ban)."""

from __future__ import annotations

import numpy as np
import pytest

from parity.analysis.causes import classify

RNG = np.random.default_rng(35)
B = RNG.normal(size=(1, 32, 64))


def one_element(b, e):
    a = b.copy()
    a[0, 7, 3] += e
    return a


def token(b, e, t=10):
    a = b.copy()
    a[0, t:t + 1] *= 1 + e
    return a


def channel(b, e, c=5):
    a = b.copy()
    a[..., c] *= 1 + 30 * e
    return a


PAIRS = {  # name -> actual(e) for a relative size e of the fault
    "scale": lambda e: B * (1 + e),
    "offset": lambda e: B + e,
    "one element": lambda e: one_element(B, 30 * e),
    "token": lambda e: token(B, 30 * e),
    "channel": lambda e: channel(B, e),
    "row scales": lambda e: B * (1 + e * RNG.uniform(0, 1, size=(1, 32, 1))),
    "noise": lambda e: B * (1 + e * RNG.uniform(-1, 1, size=B.shape)),
    "bit-identical": lambda e: B.copy(),
}
NAMES = ("model.layers.0.mlp.down_proj", "between:model.layers.0.self_attn.o_proj", "model.norm", None)


def contradicts(summary: str) -> bool:
    return summary.startswith("precision") or "<= limit" in summary or "within limit" in summary


@pytest.mark.parametrize("dtype,e", [("fp32", 1e-7), ("fp32", 1e-5), ("fp16", 1e-4), ("fp16", 3e-3)])
@pytest.mark.parametrize("pattern", list(PAIRS))
def test_a_failed_layer_never_gets_a_within_limit_cause(pattern, dtype, e):
    a = PAIRS[pattern](e)
    for name in NAMES:
        for limit in (None, 1e-2):  # the default 8 u, and a limit far above every error here
            c = classify(a, B, dtype, limit=limit, failed=True, name=name)
            assert c.label != "precision" and not contradicts(c.summary), (pattern, dtype, e, name, c.summary)
            if c.label == "unknown" and c.evidence.get("within_limit") is not None:
                assert "verdict fails it" in c.summary  # it says why the numbers alone explain nothing


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_the_same_pairs_unfailed_are_precision_within_the_limit(dtype):
    for pattern, make in PAIRS.items():
        c = classify(make(1e-9), B, dtype, limit=1e-2, name="model.layers.0.mlp.down_proj")
        assert c.label == "precision" and "<= limit" in c.summary, (pattern, c.summary)
