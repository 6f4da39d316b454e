"""Cause labels on synthetic pairs: each label fires on the pattern it names, with its evidence."""

from __future__ import annotations

import json

import numpy as np
import pytest

from parity.analysis.causes import classify, classify_samples
from parity.core import dtypes


@pytest.fixture
def conv():
    """A conv-like activation (N, C, H, W) = (1, 8, 14, 14), fp32 values."""
    return np.random.default_rng(0).normal(size=(1, 8, 14, 14)).astype(np.float32)


def check(cause, label):
    assert cause.label == label, cause.summary
    json.dumps(cause.as_dict(), allow_nan=False)  # evidence is JSON-safe, for metrics.json
    assert cause.summary.startswith(label + ":")
    return cause.evidence


def test_layout_hw_transpose(conv):
    ev = check(classify(conv.transpose(0, 1, 3, 2), conv, "fp32"), "layout")
    assert ev["perm"] == [0, 1, 3, 2] and ev["name"] == "H<->W"
    assert ev["rel_l2_before"] > 0.5 and ev["rel_l2_after"] == 0.0
    assert not ev["reinterpreted"]


def test_layout_nchw_to_nhwc_other_shape(conv):
    ev = check(classify(conv.transpose(0, 2, 3, 1), conv, "fp32"), "layout")
    assert ev["perm"] == [0, 2, 3, 1] and ev["name"] == "NCHW->NHWC"
    assert ev["actual_shape"] == [1, 14, 14, 8] and ev["rel_l2_before"] is None


def test_layout_nhwc_buffer_labelled_nchw(conv):
    """NHWC data read back with the NCHW shape: same shape, the buffer is in the other layout."""
    wrong = np.ascontiguousarray(conv.transpose(0, 2, 3, 1)).reshape(conv.shape)
    ev = check(classify(wrong, conv, "fp32"), "layout")
    assert ev["perm"] == [0, 2, 3, 1] and ev["reinterpreted"]


def test_layout_sequence_channels_swapped_under_fp16_noise():
    b = np.random.default_rng(1).normal(size=(2, 8, 16))
    a = b.transpose(0, 2, 1).astype(np.float16)
    ev = check(classify(a, b, "fp16"), "layout")
    assert ev["perm"] == [0, 2, 1] and ev["rel_l2_after"] < 1e-3


def test_one_channel_x1_1_is_channel_not_scale(conv):
    a = conv.copy()
    a[:, 3] *= 1.1
    ev = check(classify(a, conv, "fp32"), "channel")
    assert ev["axis"] == 1 and ev["channels"] == [3] and ev["of"] == 8
    assert ev["error_share"] > 0.99 and ev["scales"][0] == pytest.approx(1.1, rel=1e-6)


def test_channel_on_last_axis():
    b = np.random.default_rng(2).normal(size=(2, 16, 24))  # (B, T, C)
    a = b.copy()
    a[..., 5] += 0.5
    ev = check(classify(a, b, "fp32"), "channel")
    assert ev["axis"] == 2 and ev["channels"] == [5]


def test_channel_holding_most_signal_is_not_blamed():
    """Uniform relative noise where channel 0 carries nearly all the energy: no channel label."""
    rng = np.random.default_rng(3)
    b = rng.normal(size=(1, 16, 8, 8))
    b[:, 0] *= 100
    a = b * (1 + 1e-3 * rng.normal(size=b.shape))
    assert classify(a, b, "fp32").label == "unknown"


def test_scale(conv):
    ev = check(classify(conv * np.float32(1.05), conv, "fp32"), "scale")
    assert ev["s"] == pytest.approx(1.05, rel=1e-6) and ev["residual_rel_l2"] < 1e-6


def test_offset(conv):
    ev = check(classify(conv + np.float32(1e-3), conv, "fp32"), "offset")
    assert ev["c"] == pytest.approx(1e-3, rel=1e-3)


def test_fp16_rounding_is_precision_at_fp16_only():
    b = np.random.default_rng(4).normal(size=(4, 64, 32))
    a = b.astype(np.float16)
    ev = check(classify(a, b, "fp16"), "precision")
    assert ev["u"] == 2.0 ** -11 and ev["rel_l2"] < 8 * 2.0 ** -11
    assert classify(a, b, "fp32").label == "narrow_format"  # far beyond fp32: rounded to fp16 there
    assert classify(a, b, "fp32", limit=1e-3).label == "precision"  # the caller's limit decides


def test_inf_is_overflow(conv):
    a = conv.copy()
    a[0, 2, 5, 5] = np.inf
    ev = check(classify(a, conv, "fp32"), "overflow")
    assert ev["inf_actual"] == 1 and ev["nan_actual"] == 0


def test_reference_beyond_fp16_range_is_overflow(conv):
    b = conv.astype(np.float64)
    b[0, 0, 0, 0] = 7e4
    with np.errstate(over="ignore"):
        a = b.astype(np.float16)  # inf there
    ev = check(classify(a, b, "fp16"), "overflow")
    assert ev["beyond_max"] == 1 and ev["dtype_max"] == 65504.0 and ev["max_abs_expected"] == 7e4


def test_random_is_unknown(conv):
    other = np.random.default_rng(5).normal(size=conv.shape)
    ev = check(classify(other, conv, "fp32"), "unknown")
    assert ev["rel_l2"] > 1 and abs(ev["cosine"]) < 0.1


def test_shapes_that_no_permutation_explains():
    ev = check(classify(np.zeros((2, 3)), np.ones((3, 3)), "fp32"), "unknown")
    assert ev["problem"] == "sizes differ"


def test_unknown_dtype_names_the_choices():
    with pytest.raises(ValueError, match="fp16"):
        classify(np.ones(3), np.ones(3), "fp12")


def test_samples_are_classified_together(conv):
    """Two samples of one layer (as the diff stage holds them): concatenated on the batch axis."""
    other = np.random.default_rng(6).normal(size=conv.shape).astype(np.float32)
    pairs = [(0, conv.transpose(0, 1, 3, 2), conv), (1, other.transpose(0, 1, 3, 2), other)]
    ev = check(classify_samples(pairs, dtypes.FP32), "layout")
    assert ev["perm"] == [0, 1, 3, 2] and ev["expected_shape"] == [2, 8, 14, 14]


def test_all_zero_reference_and_single_elements_are_not_fitted():
    assert classify(np.ones((2, 3)), np.zeros((2, 3)), "fp32").evidence["problem"] == "reference all zero"
    assert classify(np.float32(1.0), np.float64(1.1), "fp32").label == "unknown"  # s or c would fit exactly


def test_int8_saturation_comes_from_the_cells_settings_not_the_numbers():
    """Only a capture that recorded saturation risk (u8 x s8, reduce_range off, x86 without VNNI) gets
    the int8-saturation cause; its evidence names the CPU's int8 flags and the key that set it."""
    from parity.analysis.causes import SATURATION, int8_saturation

    settings = {"reduce_range": False, "reduce_range_from": "set <providers.ort_int8.options.reduce_range=false>",
                "cpu_vnni": False, "cpu_int8_flags": ["avx2", "sse4_1"], "u8s8": True, "saturation_risk": True}
    layer = {"name": "fc1", "rel_l2": 0.28, "tol_ratio": 3.1, "max_abs": 0.9}
    c = int8_saturation(settings, layer, {"label": "unknown", "summary": "unknown: rel_l2 0.28", "evidence": {}})
    json.dumps(c.as_dict(), allow_nan=False)
    assert c.label == "int8_saturation" and c.summary.startswith(SATURATION + ": ")
    assert "providers.ort_int8.options.reduce_range=false" in c.summary and "avx2, sse4_1" in c.summary
    assert c.evidence["rel_l2"] == 0.28 and c.evidence["numeric"]["label"] == "unknown"
    assert int8_saturation({**settings, "saturation_risk": False}, layer) is None
    assert int8_saturation(None, layer) is None and int8_saturation({}, layer) is None
