"""A dynamo export's weights go from the exported program's memory into weights.bin once (issue 38:
torch's ONNXProgram.save wrote every byte to a temp file that pack then copied, 45% of llama_1b's export
CPU). The graph and weights.bin must be the bytes the saved-then-copied path gives, for tensors under
onnx_ir's 256-byte inline threshold, between it and pack's 1024-byte one, and above both."""

from __future__ import annotations

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
