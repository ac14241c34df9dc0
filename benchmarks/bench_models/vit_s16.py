"""ViT-S/16 (Dosovitskiy et al. 2020; width 384, 6 heads, MLP 1536, 16x16 patches) in
plain torch ops, random weights, with 4 of the 12 encoder layers to keep builds short;
batch 1, 3x224x224 (196 patches + class token) -> 1000 logits."""
import math

import torch
import torch.nn.functional as F
from torch import nn

__version__ = "0.1.0"

IMAGE, PATCH, DIM, HEADS, MLP, LAYERS = 224, 16, 384, 6, 1536, 4


class EncoderLayer(nn.Module):
    def __init__(self, dim: int = DIM, heads: int = HEADS, mlp: int = MLP):
        super().__init__()
        self.dim, self.heads = dim, heads
        self.ln1 = nn.LayerNorm(dim, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, mlp)
        self.fc2 = nn.Linear(mlp, dim)

    def attention(self, x):
        batch, seq, _ = x.shape
        head = self.dim // self.heads
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, head).permute(2, 0, 3, 1, 4)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(head), dim=-1)
        return self.proj((weights @ v).transpose(1, 2).reshape(batch, seq, self.dim))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class ViT(nn.Module):
    """A ViT of ``layers`` encoder layers of width ``dim`` (defaults: this file's ViT-S/16)."""

    def __init__(self, classes: int = 1000, dim: int = DIM, heads: int = HEADS, mlp: int = MLP,
                 layers: int = LAYERS):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, PATCH, PATCH)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (IMAGE // PATCH) ** 2 + 1, dim) * 0.02)
        self.layers = nn.Sequential(*[EncoderLayer(dim, heads, mlp) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        x = self.ln(self.layers(x))
        return self.head(x[:, 0])


def model() -> nn.Module:
    torch.manual_seed(0)
    return ViT().eval()


def example_inputs() -> tuple:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(1, 3, IMAGE, IMAGE, generator=generator),)
