"""A dynamo export's weights go from the exported program's memory into weights.bin once (issue 38:
torch's ONNXProgram.save wrote every byte to a temp file that pack then copied, 45% of llama_1b's export
CPU). The graph and weights.bin must be the bytes the saved-then-copied path gives, for tensors under
onnx_ir's 256-byte inline threshold, between it and pack's 1024-byte one, and above both."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from parity.models import onnx_weights
from parity.pipeline.layer_export import constant_outputs_as_nodes, export_layers, strip_paths


class Mixed(torch.nn.Module):
    """Parameters of 16 B (inline everywhere), 512 B (external in the save, inline after pack) and 16 KiB."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.small = torch.nn.Linear(8, 8, bias=True)    # weight 256 B, bias 32 B
        self.mid = torch.nn.Linear(8, 16, bias=True)     # weight 512 B, bias 64 B
        self.big = torch.nn.Linear(16, 256, bias=True)   # weight 16 KiB, bias 1 KiB

    def forward(self, x):
        return self.big(torch.relu(self.mid(torch.relu(self.small(x)))))


def _packed(d, graph, memory=None):
    full = constant_outputs_as_nodes(strip_paths(graph))
    onnx_weights.pack(full, d, d / "weights.bin", memory=memory)
    return full.SerializeToString(), (d / "weights.bin").read_bytes()


def test_weights_written_from_memory_are_the_bytes_the_saved_export_packs(tmp_path):
    net, x = Mixed().eval(), (torch.randn(2, 8, generator=torch.Generator().manual_seed(1)),)
    saved, held = tmp_path / "saved", tmp_path / "held"
    saved.mkdir(), held.mkdir()
    names = export_layers(net, x, ["input"], saved / "layers.onnx", "dynamo", 18)
    unsaved: dict = {}
    assert export_layers(net, x, ["input"], held / "layers.onnx", "dynamo", 18, unsaved=unsaved) == names
    assert not (held / "layers.onnx").exists()  # nothing written: the program came back unsaved
    graph, memory = onnx_weights.unsaved_graph(unsaved["program"])
    # over 256 bytes (onnx_ir's inline threshold), held until pack: mid.weight, big.weight, big.bias
    assert sorted(t.nbytes for t in memory) == [512, 1024, 16384]
    assert _packed(held, graph, memory) == _packed(saved, onnx_weights.load_graph(saved / "layers.onnx"))
    inline = [t for t in onnx_weights.initializers(onnx_weights.load_graph(saved / "layers.onnx")) if t.HasField("raw_data")]
    assert {len(t.raw_data) for t in inline} >= {32, 64, 256}  # saved inline (small.*, mid.bias): covered too


def test_folded_transposes_are_written_as_the_saved_export_packs_them(tmp_path):
    """With a 3-D input a Linear exports as MatMul on its transposed weight, which the exporter's
    optimizer folds into a numpy view that is not C-contiguous: pack writes it in chunks (numpy's tofile
    writes such an array one element per call), and the bytes must be the saved path's."""
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16)).eval()
    x = (torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(2)),)
    saved, held = tmp_path / "saved", tmp_path / "held"
    saved.mkdir(), held.mkdir()
    export_layers(net, x, ["input"], saved / "layers.onnx", "dynamo", 18)
    unsaved: dict = {}
    export_layers(net, x, ["input"], held / "layers.onnx", "dynamo", 18, unsaved=unsaved)
    graph, memory = onnx_weights.unsaved_graph(unsaved["program"])
    views = [t for t in memory if isinstance(getattr(t, "raw", None), np.ndarray) and not t.raw.flags.c_contiguous]
    assert views, "no folded transpose in the program: the chunked path is not exercised"
    assert _packed(held, graph, memory) == _packed(saved, onnx_weights.load_graph(saved / "layers.onnx"))


@pytest.mark.parametrize("dtype", ["FLOAT", "FLOAT16", "BFLOAT16", "INT64", "INT8", "INT4"])
def test_a_view_is_written_as_its_tensor_serialises(tmp_path, dtype):
    """_write_tensor against onnx_ir's own bytes for a transposed view, CHUNK boundaries inside it; the
    4-bit type (packed two per byte by onnx_ir) goes through onnx_ir's own tofile."""
    import onnx_ir as ir

    kind = ir.DataType[dtype]
    base = np.arange(5 * 7 * 3, dtype=np.int64).reshape(5, 7, 3) % 7
    array = base.astype(kind.numpy()).transpose(1, 0, 2)  # (7, 5, 3), not C-contiguous
    tensor = ir.Tensor(array, dtype=kind)
    out = tmp_path / "w.bin"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(onnx_weights, "CHUNK", 2 * array[0].nbytes + 1)  # 2 rows a chunk: 4 chunks
        with open(out, "wb") as f:
            f.write(b"x")
            onnx_weights._write_tensor(tensor, f)
    assert out.read_bytes() == b"x" + tensor.tobytes()


def test_a_view_is_written_the_same_without_torch_loaded(tmp_path, monkeypatch):
    """The numpy path (a stage without torch) and the torch one give the same bytes."""
    import sys

    import onnx_ir as ir

    array = (np.arange(6 * 9, dtype=np.float32).reshape(6, 9) / 7).T
    tensor = ir.Tensor(array)
    monkeypatch.setattr(onnx_weights, "CHUNK", 3 * array[0].nbytes)
    outs = []
    for loaded in (True, False):
        if not loaded:
            monkeypatch.delitem(sys.modules, "torch")
        with open(tmp_path / f"{loaded}.bin", "wb") as f:
            onnx_weights._write_tensor(tensor, f)
        outs.append((tmp_path / f"{loaded}.bin").read_bytes())
    assert outs[0] == outs[1] == tensor.tobytes()
