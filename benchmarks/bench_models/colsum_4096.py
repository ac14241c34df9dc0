"""Micro-model: column sum of a 4096x4096 float32 matrix (a reduction over dim 0, the
strided direction: 64 MiB in, 16 KiB out)."""
import torch
from torch import nn

__version__ = "0.1.0"
MEMORY_BOUND = True


class ColumnSum(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=0)


def model() -> nn.Module:
    return ColumnSum().eval()


def example_inputs() -> tuple:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(4096, 4096, generator=generator),)
