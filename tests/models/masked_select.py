"""Data-dependent output shape: boolean mask select."""
import torch


class Masked(torch.nn.Module):
    def forward(self, x):
        kept = x[x > 0]
        return kept * 2


def model():
    return Masked()


def example_inputs():
    return (torch.randn(4, 8),)
