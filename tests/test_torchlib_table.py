"""The exporter's operator table listed once per process, each domain read from the function's opset
(parity.models.torchlib_table; issue 38): the same list onnxscript gives, so the same registry and the
same exported bytes."""

from __future__ import annotations

from parity.models import torchlib_table


def _upstream(apis):
    return getattr(apis.get_torchlib_ops, "upstream", apis.get_torchlib_ops)


def test_the_listing_is_onnxscripts_own():
    from onnxscript._framework_apis import torch_2_5 as apis

    ours, theirs = torchlib_table.listing(apis), _upstream(apis)()
    assert len(ours) > 500 and ours == theirs  # names, functions, domains, complex flags, order


def test_installed_the_registry_is_the_same_and_the_listing_is_built_once():
    from onnxscript._framework_apis import torch_2_5 as apis
    from torch.onnx._internal.exporter import _registration

    def table():
        reg = _registration.ONNXRegistry.from_torchlib()
        return {str(k): [(d.onnx_function, d.is_complex, d.is_custom) for d in v] for k, v in reg.functions.items()}

    upstream = _upstream(apis)
    saved = apis.get_torchlib_ops
    apis.get_torchlib_ops = upstream
    try:
        before = table()
        assert torchlib_table.install()
        first = apis.get_torchlib_ops()
        assert table() == before
        again = apis.get_torchlib_ops()
        assert again == first and again is not first and all(a is b for a, b in zip(again, first))
        assert torchlib_table.install() and apis.get_torchlib_ops.upstream is upstream  # idempotent
    finally:
        apis.get_torchlib_ops = saved


def test_another_onnxscript_is_left_alone(monkeypatch):
    import onnxscript
    from onnxscript._framework_apis import torch_2_5 as apis

    monkeypatch.setattr(apis, "get_torchlib_ops", _upstream(apis))
    monkeypatch.setattr(onnxscript, "__version__", "0.0.1")
    assert torchlib_table.install() is False
    assert not getattr(apis.get_torchlib_ops, "parity_listing", False)


def test_pinned_is_the_projects_pin():
    """A bump of pyproject.toml's onnxscript pin without PINNED would silently turn the listing off."""
    import re
    from pathlib import Path

    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert re.search(r'"onnxscript==([^"]+)"', pyproject).group(1) == torchlib_table.PINNED
