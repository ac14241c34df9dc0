"""A transposed (non-contiguous) input and a buffer the model mutates in place."""
import torch


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(1))
        self.weight = torch.nn.Parameter(torch.linspace(-1, 1, 6))

    def forward(self, x):
        self.calls.add_(1)
        return (x * self.weight).sum(dim=-1) + self.calls


def model():
    return Counter()


def example_inputs():
    base = torch.arange(24, dtype=torch.float32).reshape(6, 4) / 10
    return (base.t(),)  # strides (1, 4): kernels must honour them
