"""The encoder of Whisper-tiny (Radford et al. 2022: two GELU Conv1d over 80 log-mel bins,
the second with stride 2, sinusoidal positions, 4 pre-norm layers of width 384 with 6 heads
and a 1536 GELU MLP) in plain torch ops, random weights; batch 1, 80x3000 (30 s of audio)
-> 1500x384 frames."""
import math

import torch
import torch.nn.functional as F
from torch import nn

__version__ = "0.1.0"

MELS, FRAMES, DIM, HEADS, MLP, LAYERS = 80, 3000, 384, 6, 1536, 4


def _sinusoids(length: int, channels: int) -> torch.Tensor:
    scale = math.log(10000) / (channels // 2 - 1)
    inv = torch.exp(-scale * torch.arange(channels // 2))
    t = torch.arange(length)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM)
        self.q = nn.Linear(DIM, DIM)
        self.k = nn.Linear(DIM, DIM, bias=False)
        self.v = nn.Linear(DIM, DIM)
        self.out = nn.Linear(DIM, DIM)
        self.ln2 = nn.LayerNorm(DIM)
        self.fc1 = nn.Linear(DIM, MLP)
        self.fc2 = nn.Linear(MLP, DIM)

    def attention(self, x):
        batch, seq, _ = x.shape
        q, k, v = (p(x).view(batch, seq, HEADS, DIM // HEADS).transpose(1, 2) for p in (self.q, self.k, self.v))
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(DIM // HEADS), dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(batch, seq, DIM))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class WhisperTinyEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(MELS, DIM, 3, padding=1)
        self.conv2 = nn.Conv1d(DIM, DIM, 3, stride=2, padding=1)
        self.register_buffer("positions", _sinusoids(FRAMES // 2, DIM))
        self.layers = nn.Sequential(*[Layer() for _ in range(LAYERS)])
        self.ln = nn.LayerNorm(DIM)

    def forward(self, mel):
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).transpose(1, 2)
        return self.ln(self.layers(x + self.positions))


def model() -> nn.Module:
    torch.manual_seed(0)
    return WhisperTinyEncoder().eval()


def example_inputs() -> tuple:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(1, MELS, FRAMES, generator=generator),)
