"""Views of computed (lazy) values: permute, transpose, slice, select, split, unbind, expand."""
import torch


class LazyViews(torch.nn.Module):
    def forward(self, x):
        y = torch.tanh(x) * 2                          # lazy, then viewed
        a, b = y.split([3, 5], dim=1)                  # split of a lazy value
        c = a.permute(0, 2, 1).reshape(4, -1)          # permute + reshape (div/mod index)
        d = b[:, 1:4, ::2].transpose(1, 2)             # strided slice + transpose
        e = y.unbind(0)[2].unsqueeze(0).expand(3, 8, 6)
        f = y.select(2, -1)
        return c + 1, d * 3, e - 1, f.t()


def model():
    return LazyViews()


def example_inputs():
    return (torch.randn(4, 8, 6, generator=torch.Generator().manual_seed(6)),)
