"""A model whose forward raises."""
import torch


class Broken(torch.nn.Module):
    def forward(self, x):
        raise ValueError("forward is broken on purpose")


def model():
    return Broken()


def example_inputs():
    return (torch.randn(2, 3),)
