"""Outputs that are views of the input (a slice, a transpose) next to a computed one: run
in-process, they alias the caller's tensor, which shows the input was not copied."""
import torch


class InputViews(torch.nn.Module):
    def forward(self, x):
        return x[1:].t(), x * 2


def model():
    return InputViews()


def example_inputs():
    return (torch.randn(4, 6, generator=torch.Generator().manual_seed(3)),)
