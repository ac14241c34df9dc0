"""Sums over a million elements per row: accumulation precision (double accumulators)."""
import torch


class LongRows(torch.nn.Module):
    def forward(self, x):
        return x.sum(-1), x.mean(-1)


def model():
    return LongRows()


def example_inputs():
    return (torch.rand(2, 1_000_000, generator=torch.Generator().manual_seed(0)) + 100.0,)
