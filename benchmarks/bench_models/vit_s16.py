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
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM, eps=1e-6)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.ln2 = nn.LayerNorm(DIM, eps=1e-6)
        self.fc1 = nn.Linear(DIM, MLP)
        self.fc2 = nn.Linear(MLP, DIM)

    def attention(self, x):
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(DIM // HEADS), dim=-1)
        return self.proj((weights @ v).transpose(1, 2).reshape(batch, seq, DIM))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class ViT(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        self.patch = nn.Conv2d(3, DIM, PATCH, PATCH)
        self.cls = nn.Parameter(torch.randn(1, 1, DIM) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (IMAGE // PATCH) ** 2 + 1, DIM) * 0.02)
        self.layers = nn.Sequential(*[EncoderLayer() for _ in range(LAYERS)])
        self.ln = nn.LayerNorm(DIM, eps=1e-6)
        self.head = nn.Linear(DIM, classes)

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
