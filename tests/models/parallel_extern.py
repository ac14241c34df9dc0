"""An extern ATen call large enough for ATen's intra-op threads (a sort of 64 rows of 16384
values): what pins a model's OpenMP team, not only its fused kernels, is tested with it."""
import torch


class SortRows(torch.nn.Module):
    def forward(self, x):
        return torch.sort(x * 2.0, dim=1).values + 1.0


def model():
    return SortRows().eval()


def example_inputs():
    g = torch.Generator().manual_seed(7)
    return (torch.randn(64, 16384, generator=g),)
