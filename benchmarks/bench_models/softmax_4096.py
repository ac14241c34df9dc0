"""Micro-model: row softmax of a 4096x4096 float32 matrix (64 MiB in, 64 MiB out)."""
import torch
from torch import nn

__version__ = "0.1.0"
MEMORY_BOUND = True


class RowSoftmax(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def model() -> nn.Module:
    return RowSoftmax().eval()


def example_inputs() -> tuple:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(4096, 4096, generator=generator),)
