"""Build-time constants that share a source but not their values: two linears on different
slices of one bias, and one batch norm after two convolutions with their own biases (its
folded bias differs per convolution). Each must get its own packed bias."""
import torch
import torch.nn.functional as F
from torch import nn


class SharedConstants(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(16, 16))
        self.w2 = nn.Parameter(torch.randn(16, 16))
        self.b = nn.Parameter(torch.randn(32) * 10)
        self.c1 = nn.Conv2d(4, 8, 3, padding=1)
        self.c2 = nn.Conv2d(4, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            self.c1.bias.fill_(5.0)
            self.c2.bias.fill_(-5.0)

    def forward(self, x, image):
        return (F.linear(x, self.w1, self.b[:16]), F.linear(x, self.w2, self.b[16:]),
                self.bn(self.c1(image)), self.bn(self.c2(image)))


def model():
    torch.manual_seed(0)
    return SharedConstants().eval()


def example_inputs():
    torch.manual_seed(1)
    return (torch.randn(4, 16), torch.randn(1, 4, 8, 8))
