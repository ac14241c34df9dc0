"""A reduction read inside another reduction of a different length, through a reshape:
index atoms like (j / 8) must not be confused between the two loops."""
import torch


class NestedReductions(torch.nn.Module):
    def forward(self, w, p, q):
        b = w.sum((1, 2), keepdim=True)          # reduces 16 elements per row
        x = (p * q).reshape(3, 4, 8)             # a reshaped computed value
        return (b - x).sum((1, 2))               # reduces 32 elements per row


def model():
    return NestedReductions()


def example_inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(3, 2, 8, generator=g), torch.randn(3, 2, 16, generator=g),
            torch.tensor([1.0, 100.0]).reshape(1, 2, 1))
