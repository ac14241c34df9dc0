"""Data-dependent control flow (torch.cond), which aotpack does not lower yet."""
import torch


class Branchy(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))


def model():
    return Branchy()


def example_inputs():
    return (torch.randn(4, 4),)
