"""The cause labels that name a mechanism (parity.analysis.cause_patterns), each on a synthetic pair:
a layer rounded to fp16 or bf16, two channels swapped, an op substituted for another, a softmax with a
temperature; and the patterns they must not claim."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from parity.analysis.causes import classify, classify_samples
from parity.core import dtypes

U16 = 2.0 ** -11


def check(cause, label):
    assert cause.label == label, cause.summary
    json.dumps(cause.as_dict(), allow_nan=False)  # JSON-safe evidence, for metrics.json
    assert cause.summary.startswith(label + ":")
    return cause.evidence


@pytest.fixture
def ref():
    """A conv-like fp64 reference (N, C, H, W) = (2, 16, 12, 12)."""
    return np.random.default_rng(0).normal(size=(2, 16, 12, 12))


def fp32_noise(b, seed=1):
    """The reference as an fp32 provider computes it: a few ulps off."""
    return (b * (1 + 2e-7 * np.random.default_rng(seed).normal(size=b.shape))).astype(np.float32)


def test_rounded_to_fp16_at_this_layer(ref):
    a = fp32_noise(ref).astype(np.float16).astype(np.float32)
    ev = check(classify(a, ref, "fp32"), "narrow_format")
    assert ev["format"] == "fp16" and ev["rounded"] and ev["representable"] == ev["nonzero"]
    assert 0.2 < ev["rel_l2_u"] < 0.7  # one rounding: about 0.4 u_fp16
    assert ev["rel_l2_vs_rounded_reference"] * 10 < ev["rel_l2"]
    assert "rounded to fp16 at this layer" in classify(a, ref, "fp32").summary


def test_rounded_to_bf16_in_an_fp32_and_an_fp16_cell(ref):
    from parity.analysis.cause_patterns import round_to

    a = round_to(ref, "bf16")
    assert check(classify(a, ref, "fp32"), "narrow_format")["format"] == "bf16"
    assert classify(a, ref, "fp16").label == "precision"  # 0.4 u_bf16 is within 8 u_fp16, the default limit
    assert check(classify(a, ref, "fp16", limit=2 * U16), "narrow_format")["format"] == "bf16"  # the oracle's
    assert classify(ref.astype(np.float16), ref, "fp16").label == "precision"  # an fp16 cell's own format


def test_computed_in_fp16_is_not_one_rounding(ref):
    """fp16 numbers further from the reference than one rounding: computed (not only stored) in fp16."""
    a = (ref * (1 + 3 * U16 * np.random.default_rng(2).normal(size=ref.shape))).astype(np.float16)
    ev = check(classify(a, ref, "fp32"), "narrow_format")
    assert not ev["rounded"] and ev["rel_l2_u"] > 2


def test_fp32_values_are_not_a_narrow_format(ref):
    a = fp32_noise(ref) * np.float32(1.0 + 3e-4)
    assert classify(a, ref, "fp32").label == "scale"
    counts = np.round(10 * np.abs(ref)) + 1  # small integers are fp16 numbers, but no evidence of fp16
    wrong = counts.copy()
    wrong.ravel()[::50] += 1
    assert classify(wrong, counts, "fp32").label != "narrow_format"


def test_two_channels_swapped(ref):
    a = fp32_noise(ref)[:, [0, 1, 2, 7, 4, 5, 6, 3, 8, 9, 10, 11, 12, 13, 14, 15]]
    c = classify(a, ref, "fp32")
    ev = check(c, "channel_permutation")
    assert "channels 3 and 7 swapped" in c.summary
    assert ev["axis"] == 1 and ev["cycles"] == [[3, 7]] and ev["rel_l2_after"] < 1e-6


def test_channels_permuted_on_the_last_axis():
    b = np.random.default_rng(3).normal(size=(2, 10, 32))  # (B, T, C)
    perm = np.arange(32)
    perm[[4, 9, 20]] = [9, 20, 4]  # a 3-cycle
    c = classify(b[..., perm], b, "fp32")
    ev = check(c, "channel_permutation")
    assert ev["axis"] == 2 and ev["moved"] == [[4, 9], [9, 20], [20, 4]]
    assert "4<-9, 9<-20, 20<-4" in c.summary


def test_one_scaled_channel_is_still_channel(ref):
    a = ref.copy()
    a[:, 5] *= 1.2
    assert classify(a, ref, "fp32").label == "channel"


@pytest.mark.parametrize("got,want,f", [
    ("Sigmoid", "HardSigmoid(alpha=1/6)", lambda x: 1 / (1 + np.exp(-x))),
    ("LeakyRelu(alpha=0.01)", "Relu", lambda x: np.where(x < 0, 0.01 * x, x)),
    ("Gelu(tanh)", "Gelu(erf)",
     lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))),
])
def test_op_substitution_on_the_layers_input(ref, got, want, f):
    from parity.analysis.cause_patterns import OPS

    x = 2 * ref
    b = {"Relu": lambda v: np.maximum(v, 0), **OPS}[want](x)
    a = f(x.astype(np.float32)).astype(np.float32)
    c = classify(a, b, "fp32", inputs=x)
    ev = check(c, "op_substitution")
    assert ev["op"] == got and ev["reference_op"] == want
    assert f"the layer computes {got} where the reference computes {want}" in c.summary
    assert ev["rel_l2_op"] < 1e-6
    assert classify(a, b, "fp32").label != "op_substitution"  # without the input: not claimed


def test_same_op_on_the_input_is_not_a_substitution(ref):
    x = 2 * ref
    b = 1 / (1 + np.exp(-x))
    assert classify(b.astype(np.float16), b, "fp32", inputs=x).label == "narrow_format"
    assert classify(b * 1.01, b, "fp32", inputs=x).label == "scale"


def test_softmax_temperature():
    logits = 3 * np.random.default_rng(4).normal(size=(2, 4, 9, 9))

    def softmax(z):
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    c = classify(softmax(logits * 1.0005).astype(np.float32), softmax(logits), "fp32")
    ev = check(c, "softmax_temperature")
    assert ev["t"] == pytest.approx(1.0005, rel=1e-5) and ev["axis"] == 3
    assert "t = 1.0005" in c.summary
    assert classify(softmax(logits) * 1.001, softmax(logits), "fp32").label == "scale"  # rows sum to 1.001


def test_samples_carry_their_inputs(ref):
    """classify_samples hands each sample's input along with its values (as the diff does)."""
    x = 2 * ref
    pairs = [(1 / (1 + np.exp(-x[i:i + 1])), np.clip(x[i:i + 1] / 6 + 0.5, 0, 1)) for i in range(2)]
    ev = check(classify_samples(pairs, dtypes.FP32, inputs=[x[:1], x[1:]]), "op_substitution")
    assert ev["op"] == "Sigmoid"


def test_evidence_is_the_same_bytes_every_time(ref):
    a = fp32_noise(ref)[:, [0, 1, 2, 7, 4, 5, 6, 3, 8, 9, 10, 11, 12, 13, 14, 15]]
    x = 2 * ref
    sig = 1 / (1 + np.exp(-x))
    for args in ((a, ref), (sig, np.clip(x / 6 + 0.5, 0, 1))):
        once = json.dumps(classify(*args, "fp32", inputs=x).as_dict())
        assert all(json.dumps(classify(*args, "fp32", inputs=x).as_dict()) == once for _ in range(2))


def test_the_diff_hands_the_layers_recorded_input(ref):
    """origin_cause gives classify the fp64 reference's pre:<call> of a leaf call, per sample, and nothing
    for a between: region, a model output or a layer without a recorded input."""
    from parity.analysis.causes import _inputs
    from parity.core.store import Tensor

    gold = {(s, n): Tensor(s, n, 0, ref[s:s + 1]) for s in range(2) for n in ("pre:act", "act", "output")}
    got = _inputs(gold, "act", [0, 1])
    assert len(got) == 2 and np.array_equal(got[1], ref[1:2])
    assert _inputs(gold, "between:act", [0, 1]) is None and _inputs(gold, "output", [0, 1]) is None
    assert _inputs(gold, "plain:output", [0]) is None and _inputs(gold, "fc", [0]) is None
    assert _inputs(None, "act", [0]) is None and _inputs(gold, "act", [0, 2]) is None
