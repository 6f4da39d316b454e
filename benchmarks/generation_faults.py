"""Generation's faults on tiny_llama (issue 35, acceptance line 1), printed one line each: one layer's
`present` value rounded to fp16 on its way out of the decoder graphs (parity.pipeline.decoder.cache_fault,
an fp32 cell: FAIL from step 1, the origin that layer's cache), then at fp16 the unfaulted cell and the
last layer's down_proj x1.01 (the provider's fault option: FAIL at that layer through the own-error test,
where the logits alone pass). Real export, real onnxruntime, no DVC; ~35 s on 2 cores.

    python benchmarks/generation_faults.py
"""
import shutil
import sys
import tempfile
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from conftest import composed  # noqa: E402
from parity.pipeline import decoder  # noqa: E402
from parity.pipeline.generate import export_model, run_cell  # noqa: E402

FAULT = "{node: model.layers.1.mlp.down_proj, scale: 1.01}"


def params(dtypes: str, *extra: str) -> dict:
    return composed("models=[tiny_llama]", "generate.models=[tiny_llama]", "generate.steps=8",
                    "generate.providers=[ort_cpu]", f"generate.dtypes=[{dtypes}]", *extra)


def main() -> int:
    tmp = Path(tempfile.mkdtemp())
    try:
        p, out = params("fp32,fp16"), tmp / "export"
        export_model(p, "tiny_llama", out)
        for name in ("present.1.value", "present.0.value"):
            d = tmp / f"fault-{name}"
            shutil.copytree(out, d)
            for g in ("decoder.onnx", "decoder_layers.onnx"):
                m = onnx.load(str(d / g), load_external_data=False)
                onnx.save(decoder.cache_fault(m, name), str(d / g))
            res = run_cell(p, "tiny_llama", "fp32", "ort_cpu", d)
            o = res["origin"]
            print(f"cache fault {name} (fp32 cell): verdict {res['verdict']}, first failing step {res['first_fail']}, "
                  f"origin {o['origin']!r} at step {o['step']} (kind {o['kind']}); cause: {o['cause'][:160]}")
        for fault in (None, FAULT):
            res = run_cell(params("fp16", *([f"+providers.ort_cpu.options.fault={fault}"] if fault else [])),
                           "tiny_llama", "fp16", "ort_cpu", out)
            o, first = res.get("origin") or {}, res["steps_detail"][0]
            print(f"{'down_proj x1.01' if fault else 'unfaulted'} at fp16: verdict {res['verdict']}, first failing "
                  f"step {res['first_fail']}, origin {o.get('origin')!r} (kind {o.get('kind')}), step 0 logits excess "
                  f"{first['excess']:.3g} vs limit {first['limit']:.3g}, own failed {first.get('own_failed')}, "
                  f"own worst excess {first.get('own_worst_excess'):.4g}")
    finally:
        shutil.rmtree(tmp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
