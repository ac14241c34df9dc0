"""Sample model: Linear -> GELU -> LayerNorm -> Linear (batch 32, 512 -> 2048 -> 512).

Build it with `aotpack build samples/mlp.py -o dist/`.
"""
import torch
from torch import nn

__version__ = "0.1.0"


class MLP(nn.Module):
    def __init__(self, d_in: int = 512, d_hidden: int = 2048, d_out: int = 512):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.act = nn.GELU()
        self.norm = nn.LayerNorm(d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.norm(self.act(self.fc1(x))))


def model() -> nn.Module:
    torch.manual_seed(0)
    return MLP().eval()


def example_inputs() -> tuple:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(32, 512, generator=generator),)
