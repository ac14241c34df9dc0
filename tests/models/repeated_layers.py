"""Three identical linear + tanh layers (each with its own weights) and a head of another
shape: the layers' GEMM steps are twins, timed once per input set (aotpack.tune.autotune)."""
import torch
from torch import nn


class Repeated(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))
        self.head = nn.Linear(16, 8)

    def forward(self, x):
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x)


def model():
    torch.manual_seed(0)
    return Repeated().eval()


def example_inputs():
    torch.manual_seed(1)
    return (torch.randn(4, 16),)


def calibration_inputs():
    torch.manual_seed(2)
    return [(torch.randn(4, 16),)]
