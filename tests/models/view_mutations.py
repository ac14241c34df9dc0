"""Extern ops returning views (diagonal) of state and weights, a float16 buffer output."""
import torch


class ViewMutations(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("a", torch.arange(16.0).reshape(4, 4))
        self.register_buffer("b", torch.zeros(4))
        self.register_buffer("h", torch.arange(6.0).reshape(2, 3).half())
        self.w = torch.nn.Parameter(torch.arange(16.0).reshape(4, 4) * 2)

    def forward(self, x):
        previous = self.b * 1                  # state from the previous run
        self.b.copy_(torch.diagonal(self.a))   # the OLD diagonal of a ...
        self.a.add_(x)                         # ... before a changes
        return previous, torch.diagonal(self.w), self.h


def model():
    return ViewMutations()


def example_inputs():
    return (torch.ones(4, 4),)
