"""Sample model: a pre-norm transformer block written with plain torch ops.

Self-attention (4 heads) and a GELU MLP, each behind a LayerNorm and a residual;
batch 4, sequence 128, d_model 256. Build it with
`aotpack build samples/transformer_block.py --topn 3 -o dist/`.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

__version__ = "0.1.0"


class TransformerBlock(nn.Module):
    def __init__(self, d_model: int = 256, n_heads: int = 4, d_ff: int = 1024):
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        head_dim = d_model // self.n_heads
        q, k, v = self.qkv(x).split(d_model, dim=-1)
        q, k, v = (t.view(batch, seq, self.n_heads, head_dim).transpose(1, 2) for t in (q, k, v))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(head_dim)
        weights = torch.softmax(scores, dim=-1)
        context = torch.matmul(weights, v).transpose(1, 2).reshape(batch, seq, d_model)
        return self.proj(context)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def model() -> nn.Module:
    torch.manual_seed(0)
    return TransformerBlock().eval()


def example_inputs() -> tuple:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(4, 128, 256, generator=generator),)
