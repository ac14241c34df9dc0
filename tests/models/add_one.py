"""x + 1 on a 4x4 float32 tensor: a model whose run is all call overhead (the loader's
call-path tests and ``benchmarks/call_overhead.py``)."""
import torch
from torch import nn

__version__ = "0.1.0"


class AddOne(nn.Module):
    def forward(self, x):
        return x + 1


def model():
    return AddOne().eval()


def example_inputs():
    return (torch.randn(4, 4, generator=torch.Generator().manual_seed(0)),)
