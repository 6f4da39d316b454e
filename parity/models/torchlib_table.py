"""torch's dynamo exporter builds its operator table from onnxscript's torchlib on every
`torch.onnx.export` call (ONNXRegistry.from_torchlib, through onnxscript's get_torchlib_ops). That lists
557 functions and, for each, asks its `function_ir` for the domain: onnxscript re-reads the function's
source file, parses it and translates its signature, 1.2 s of CPU per export call (2 s with the
listing) out of a tiny model's ~7 s export process, paid again by every suite case exported with dynamo.

`install()` replaces onnxscript's get_torchlib_ops, in this process only, with one that gives the same
list (same functions, names, complex flags, in the same order) with each domain read from the function's
opset (`function.domain`, the value function_ir.domain holds: tests/test_torchlib_table.py compares the
two lists on the pinned onnxscript), built once per process and copied on each call. Only for the
onnxscript version pinned in pyproject.toml (PINNED); any other leaves onnxscript as it is. The exported
graphs are byte-identical either way (the table's contents are the same).
"""

from __future__ import annotations

PINNED = "0.7.2"  # pyproject.toml's onnxscript pin


def install() -> bool:
    """Put the listing in place (idempotent); False, changing nothing, with another onnxscript."""
    import onnxscript  # lazy: ort_cpu imports this module, and an ORT capture never loads the exporter
    from onnxscript._framework_apis import torch_2_5 as apis  # lazy: as above

    if getattr(apis.get_torchlib_ops, "parity_listing", False):
        return True
    if onnxscript.__version__ != PINNED:
        return False
    built: list = []

    def get_torchlib_ops() -> list:
        if not built:
            built.extend(listing(apis))
        return list(built)

    get_torchlib_ops.parity_listing = True
    get_torchlib_ops.upstream = apis.get_torchlib_ops
    apis.get_torchlib_ops = get_torchlib_ops
    return True


def listing(apis) -> list:
    """onnxscript's torchlib functions as its get_torchlib_ops lists them, domains from each opset."""
    from onnxscript.function_libs.torch_lib import ops, registration  # lazy: as above; ops registers them

    del ops
    metas = []
    for name, funcs in registration.default_registry.items():
        if name.startswith("internal::"):
            continue
        for func, is_complex in [(f, False) for f in funcs.overloads] + [(f, True) for f in funcs.complex]:
            metas.append(apis._OnnxFunctionMeta(qualified_name=name, function=func, domain=func.domain,
                                                name=func.name, is_complex=is_complex))
    return metas
