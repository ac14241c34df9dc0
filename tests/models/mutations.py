"""In-place updates: a buffer read before its update, a two-slot history (a <- b, b <- x),
an updated input, and a weight returned as an output."""
import torch


class Mutations(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(4))
        self.register_buffer("b", torch.full((4,), 7.0))
        self.register_buffer("a", torch.zeros(4))
        self.w = torch.nn.Parameter(torch.arange(4.0))

    def forward(self, x, y):
        before = x + self.count          # reads the old buffer
        self.count.add_(1.0)
        old = self.b.clone()
        self.b.copy_(x)
        self.a.copy_(old)
        y.add_(1.0)                      # the caller's input
        return before * 2, self.a + self.b, y * 2, self.w


def model():
    return Mutations()


def example_inputs():
    return torch.ones(4), torch.arange(4.0)
