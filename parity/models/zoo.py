"""parity's own small models (arch.source: parity). Add one: a builder here + a conf/models file."""

from __future__ import annotations

from torch import nn
from torch.nn import functional as F


class MLP(nn.Module):
    """The seed MLP: Linear -> GELU -> Linear."""

    def __init__(self, in_features: int = 768, hidden: int = 3072, out_features: int = 768):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + out(attn(ln1(x))); x + fc2(gelu(fc1(ln2(x)))). Every op a leaf module
    except SDPA, so each step is a named layer."""

    def __init__(self, d_model: int = 256, n_heads: int = 4, d_ff: int = 1024):
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, d_ff)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        heads = lambda z: z.reshape(b, t, self.n_heads, d // self.n_heads).transpose(1, 2)  # noqa: E731
        a = F.scaled_dot_product_attention(heads(q), heads(k), heads(v))
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


BUILDERS = {"mlp": MLP, "transformer_block": TransformerBlock}
