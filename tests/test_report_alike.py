"""The report names cells whose outputs match to the last bit at precisions of different formats: on an
H200, torch 2.11's Inductor cache gave amp_bf16 cells amp_fp16's graph and the verdict passed them
(fp16's error is within bf16's limit); only the equal numbers told (docs/gpu-verification.md)."""

from __future__ import annotations

from parity.pipeline.report import alike_sections, computed_alike

P = {"dtypes": {"fp16": {"torch": "float16", "mode": "cast"}, "amp_fp16": {"torch": "float16", "mode": "autocast"},
                "amp_bf16": {"torch": "bfloat16", "mode": "autocast"}, "fp32": {"torch": "float32", "mode": "cast"},
                "tf32": {"torch": "float32", "mode": "tf32"}}}
FP16_OUT = {"rel_l2": 5.343809426360132e-04, "max_abs": 0.0047, "mean_abs": 9.5e-4, "cosine": 0.99999987}


def cell(dtype, out, provider="torch_compile_cuda", model="mlp"):
    return {"key": f"{model}-{dtype}-{provider}", "model": model, "dtype": dtype, "provider": provider,
            "metrics": {"output": dict(out)}}


def test_a_bf16_cell_with_fp16_numbers_is_named():
    cells = [cell("fp16", FP16_OUT), cell("amp_fp16", FP16_OUT), cell("amp_bf16", FP16_OUT)]
    lines = computed_alike(P, cells)
    assert lines == ["mlp-fp16-torch_compile_cuda, mlp-amp_fp16-torch_compile_cuda, mlp-amp_bf16-torch_compile_cuda: "
                     "the same output to the last bit at precisions of different formats (fp16, amp_fp16, amp_bf16): "
                     "a precision mode was not applied"]
    md, page = alike_sections(lines)
    assert md.startswith("## Precision modes that computed alike") and "<li>mlp-fp16" in page


def test_tf32_equal_to_fp32_is_named_but_one_format_agreeing_is_not():
    fp32 = {"rel_l2": 3.39e-07, "max_abs": 1e-6, "mean_abs": 2e-7, "cosine": 1.0}
    assert computed_alike(P, [cell("fp32", fp32), cell("tf32", fp32)])  # TF32 not engaged
    # amp_fp16 = fp16 is legitimate (autocast kept nothing in fp32 that mattered); other providers,
    # other models and exact (rel_l2 0) outputs are never grouped
    assert computed_alike(P, [cell("fp16", FP16_OUT), cell("amp_fp16", FP16_OUT)]) == []
    assert computed_alike(P, [cell("fp16", FP16_OUT), cell("amp_bf16", FP16_OUT, provider="torch_cuda")]) == []
    zero = {"rel_l2": 0.0, "max_abs": 0.0, "mean_abs": 0.0, "cosine": 1.0}
    assert computed_alike(P, [cell("fp32", zero), cell("tf32", zero)]) == []
    assert alike_sections([]) == ("", "")
