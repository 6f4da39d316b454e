"""torchvision 0.28's PyPI wheel is CUDA-built; on CPU torch 2.13 `import torchvision` fails with
"operator torchvision::nms does not exist" (pytorch/vision#9085): its _meta_registrations module
registers fake kernels for torchvision::nms and ::qnms, whose schemas come from the C++ extension
that cannot load. Defining those two schemas before the import lets the model classes work; the
detection ops themselves stay unusable (calling them raises), which parity never does.
"""

from __future__ import annotations

import sys

_LIB = None


def import_torchvision():
    global _LIB
    import torch  # lazy: torch +1.84 s (BENCHMARKS 22); parity.models imports this module in ORT stages too

    try:
        # lazy: only through this workaround; torchvision +3.85 s (BENCHMARKS 22)
        import torchvision  # noqa: F401  (fine where the extension loads, e.g. a CUDA machine)

        return torchvision
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise

    for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
        del sys.modules[k]
    if _LIB is None:
        _LIB = torch.library.Library("torchvision", "FRAGMENT")
        for op in ("nms", "qnms"):
            try:
                _LIB.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            except RuntimeError:
                pass  # already defined
    import torchvision  # lazy: only through this workaround; torchvision +3.85 s (BENCHMARKS 22)

    return torchvision
