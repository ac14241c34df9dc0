"""Depthwise convolutions (groups == channels) with a bias and the activation right after
them, as MobileNets have once batch norm is folded: 3x3 and 5x5, stride 1 and 2, odd
sizes (13x13, 7x7, 1x5, 2x2), each epilogue the depthwise template fuses (none, relu,
hardswish, hardsigmoid, sigmoid, SiLU), no bias, a dilated filter and a non-contiguous
input (a column slice of the input)."""
import torch
import torch.nn.functional as F
from torch import nn


class DepthwiseZoo(nn.Module):
    def __init__(self):
        super().__init__()
        c = 12
        self.dw3 = nn.Conv2d(c, c, 3, 1, 1, groups=c)
        self.dw5s2 = nn.Conv2d(c, c, 5, 2, 2, groups=c)
        self.dw3s2 = nn.Conv2d(c, c, 3, 2, 1, groups=c)
        self.dw5 = nn.Conv2d(c, c, 5, 1, 2, groups=c)
        self.dw3_nobias = nn.Conv2d(c, c, 3, 1, 1, groups=c, bias=False)
        self.dw3_dilated = nn.Conv2d(c, c, 3, 1, 2, dilation=2, groups=c)
        self.small = nn.Conv2d(3, 3, 3, 2, 1, groups=3)
        self.tiny = nn.Conv2d(3, 3, 5, 1, 2, groups=3)

    def forward(self, x, small, tiny):
        a = F.relu(self.dw3(x))                             # 13x13, stride 1
        b = F.hardswish(self.dw5s2(a))                      # 13x13 -> 7x7
        c = F.hardsigmoid(self.dw3s2(x[:, :, :, 2:]))       # a column slice: 13x11 -> 7x6
        d = torch.sigmoid(self.dw5(b))                      # 7x7
        e = F.silu(self.dw3_nobias(a))
        f = self.dw3_dilated(e)                             # dilation 2, no epilogue
        return b + d, c, f, F.relu(self.small(small)), F.hardswish(self.tiny(tiny))


def model():
    torch.manual_seed(0)
    return DepthwiseZoo().eval()


def example_inputs():
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(1, 12, 13, 13, generator=generator), torch.randn(2, 3, 1, 5, generator=generator),
            torch.randn(1, 3, 2, 2, generator=generator))
