"""Self-attention written with explicit matmuls (no SDPA): batch 2, 3 heads of 8, 17 tokens,
so torch.export gives two ``bmm`` per layer on head views of one qkv projection (``q @ k^T``
with k read transposed, ``weights @ v`` with v read in place), plus one ``mm`` of two
computed operands (5x17 @ 17x3)."""
import math

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim=24, heads=3):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = (t.view(b, n, self.heads, c // self.heads).transpose(1, 2) for t in (q, k, v))
        weights = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(c // self.heads), dim=-1)
        context = torch.matmul(weights, v).transpose(1, 2).reshape(b, n, c)
        return self.proj(context)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attention()
        self.norm = nn.LayerNorm(24)

    def forward(self, x, mix):
        y = x + self.attn(self.norm(x))
        mixed = torch.tanh(mix) @ y[0, :, :3].sin()  # [5, 17] @ [17, 3]: two runtime operands
        return y, mixed


def model():
    torch.manual_seed(0)
    return Model().eval()


def example_inputs():
    generator = torch.Generator().manual_seed(3)
    return torch.randn(2, 17, 24, generator=generator), torch.randn(5, 17, generator=generator)
