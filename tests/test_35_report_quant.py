"""Issue 35 item 3: the report shows a quantised cell's cost per layer apart from its verdict. The
verdict comes from the quantised oracle (parity's own fp64 quantisation of the same weights); what the
quantisation costs against the fp32 reference is expected, not judged, and the report says so."""

from __future__ import annotations

from parity.pipeline.report import quant_costs, quant_sections


def _cell(key, verdict, quant=None, costs=()):
    layers = [{"name": n, "oracle": {"excess": 0.1, "quant_cost": c}} for n, c in costs]
    layers.append({"name": "plain:output", "oracle": None})  # a value the oracle did not cost
    return {"key": key, "metrics": {"verdict": verdict, **({"quant": quant} if quant else {})}, "layers": layers}


def test_35_the_report_shows_each_quantised_cells_cost_per_layer_apart_from_the_verdict():
    cells = [
        _cell("tiny_llama-fp32-ort_cpu", "PASS"),
        _cell("tiny_llama-int4_weight-ort_int4", "PASS",
              {"scheme": "int4_weight", "cost_output": 0.165, "weights_differ": []},
              [("model.layers.0.mlp.up_proj", 0.07), ("model.layers.1.mlp.down_proj", 0.25),
               ("lm_head", 0.165), ("model.layers.0.self_attn.q_proj", 0.09)]),
        _cell("tiny_llama-int8_dynamic-ort_int8", "FAIL",
              {"scheme": "int8_dynamic", "cost_output": 0.041, "weights_differ": ["model.layers.0.mlp.up_proj"]},
              [("model.layers.0.mlp.up_proj", 0.065)]),
    ]
    lines = quant_costs(cells, top=2)
    assert lines == [
        "tiny_llama-int4_weight-ort_int4 (int4_weight, PASS): output rel_l2 0.165 vs fp32; most costly of 4 "
        "layers: model.layers.1.mlp.down_proj 0.25, lm_head 0.165; packed weights equal parity's quantisation",
        "tiny_llama-int8_dynamic-ort_int8 (int8_dynamic, FAIL): output rel_l2 0.041 vs fp32; most costly of 1 "
        "layers: model.layers.0.mlp.up_proj 0.065; packed weights differ from parity's quantisation at "
        "model.layers.0.mlp.up_proj"]
    md, page = quant_sections(lines)
    assert md.startswith("## Quantisation cost (expected, not judged)\n") and "not judged" in page
    assert all(x in md for x in lines) and "<li>tiny_llama-int4_weight-ort_int4 (int4_weight, PASS)" in page


def test_35_no_quantised_cell_no_section():
    assert quant_costs([_cell("mlp-fp16-ort_cpu", "PASS")]) == []
    assert quant_sections([]) == ("", "")
