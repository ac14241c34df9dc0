"""Whole-tensor reductions to 0-d outputs, and a 0-d input."""
import torch


class ScalarReduce(torch.nn.Module):
    def forward(self, x, scale):
        total = (x * scale).sum()
        return total, x.amax(), (x - x.mean()).abs().mean()


def model():
    return ScalarReduce()


def example_inputs():
    g = torch.Generator().manual_seed(5)
    return (torch.randn(7, 33, generator=g), torch.tensor(0.5))
