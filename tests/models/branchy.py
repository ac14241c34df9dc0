"""torch.cond: both branches fuse and call ATen; the example inputs take one branch."""
import torch


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x, y):
        def positive(a, b):
            return (a.sin() @ self.w + b,)

        def negative(a, b):
            return (a.cos() * 2 - b,)

        (z,) = torch.cond(x.sum() > 0, positive, negative, (x, y))
        return z + 1


def model():
    return Branchy()


def example_inputs():
    g = torch.Generator().manual_seed(3)
    return (-torch.rand(4, 4, generator=g), torch.randn(4, 4, generator=g))  # negative branch
