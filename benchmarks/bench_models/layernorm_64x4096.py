"""Micro-model: layer_norm over the last dim of a 64x4096 float32 matrix, with an affine
weight and bias (1 MiB in, 1 MiB out: cache-resident, so it can beat streaming bandwidth)."""
import torch
from torch import nn

__version__ = "0.1.0"
MEMORY_BOUND = True


def model() -> nn.Module:
    torch.manual_seed(0)
    norm = nn.LayerNorm(4096)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    return norm.eval()


def example_inputs() -> tuple:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(64, 4096, generator=generator),)
