"""parity.core.dtypes: the one table of dtype facts, from numpy.finfo / ml_dtypes (in-process, no pipeline)."""

import pytest

from parity.core import dtypes


def test_facts_are_the_formats_ieee_values():
    # the values the hand-written tables held before (bit-identical metrics depend on them)
    want = {"fp64": (2.0 ** -53, 1.7976931348623157e308, 2.2250738585072014e-308),
            "fp32": (2.0 ** -24, 3.4028234663852886e38, 1.1754943508222875e-38),
            "tf32": (2.0 ** -11, 3.4028234663852886e38, 1.1754943508222875e-38),
            "fp16": (2.0 ** -11, 65504.0, 6.103515625e-05),
            "bf16": (2.0 ** -8, 3.3895313892515355e38, 1.1754943508222875e-38),
            "fp8_e4m3": (2.0 ** -4, 448.0, 2.0 ** -6),
            "int8": (2.0 ** -8, 3.4028234663852886e38, 1.1754943508222875e-38),
            "int4": (2.0 ** -4, 3.4028234663852886e38, 1.1754943508222875e-38)}
    assert {n: (f.u, f.max, f.tiny) for n, f in dtypes.FORMATS.items()} == want


def test_aliases_and_reduced_formats():
    assert dtypes.facts("float16") is dtypes.facts("half") is dtypes.FP16
    assert dtypes.facts("amp_bf16").name == "bf16" and dtypes.facts("int8_static").name == "int8"
    assert [dtypes.reduced(n) for n in ("float32", "float64", "nope")] == [None, None, None]
    assert dtypes.reduced("bfloat16").name == "bf16" and dtypes.reduced("tf32").u == 2.0 ** -11
    assert dtypes.find("nope") is None
    with pytest.raises(ValueError, match="unknown dtype 'nope'.*fp16"):
        dtypes.facts("nope")
