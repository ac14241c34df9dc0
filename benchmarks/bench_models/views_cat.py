"""Micro-model: a view/slice/cat-heavy graph on small tensors (a few KiB), where the cost is
per-op overhead and data movement, not arithmetic: split, transpose, strided slices,
reshapes and concatenations, with a little elementwise work between them."""
import torch
from torch import nn

__version__ = "0.1.0"
MEMORY_BOUND = True


class ViewsCat(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=-1)                                     # [8, 16, 32] each
        z = torch.cat([b, a * 2.0], dim=-1)                           # rotate halves
        z = z.transpose(0, 1).reshape(16, 8 * 64)                     # [16, 512]
        evens, odds = z[:, ::2], z[:, 1::2]
        w = torch.cat([evens + odds, evens - odds, y], dim=1)         # [16, 768]
        w = w.view(16, 12, 64).permute(1, 0, 2)                       # [12, 16, 64]
        head, tail = w[:4], w[4:].flip(0)
        return torch.cat([tail, head * y[:, :64].unsqueeze(0)], dim=0).reshape(12, 1024).relu()


def model() -> nn.Module:
    return ViewsCat().eval()


def example_inputs() -> tuple:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(8, 16, 64, generator=generator), torch.randn(16, 256, generator=generator))
