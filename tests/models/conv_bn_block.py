"""Convolutions as CNNs use them, for the convolution template and batch-norm folding:
conv -> BN -> ReLU; conv -> BN -> + (1x1 strided downsample) -> ReLU, the residual add
shared by two convolutions; a dilated conv with bias -> sigmoid; a 7x7 stride-2 stem on
3 channels; output channels that are not a multiple of 16. Batch 2, odd spatial sizes."""
import torch
from torch import nn

__version__ = "0.1.0"


class ConvBnBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 7, 2, 3, bias=False)
        self.stem_bn = nn.BatchNorm2d(8)
        self.conv1 = nn.Conv2d(8, 20, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(20)
        self.conv2 = nn.Conv2d(20, 20, 3, 2, 1)
        self.bn2 = nn.BatchNorm2d(20)
        self.down = nn.Conv2d(8, 20, 1, 2, bias=False)
        self.dilated = nn.Conv2d(20, 5, 3, 1, 2, dilation=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem_bn(self.stem(x)))
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)) + self.down(x))
        return torch.sigmoid(self.dilated(y))


def model() -> nn.Module:
    torch.manual_seed(0)
    net = ConvBnBlock()
    for bn in (net.stem_bn, net.bn1, net.bn2):  # non-trivial statistics, so folding is checked
        bn.running_mean.uniform_(-0.2, 0.2)
        bn.running_var.uniform_(0.5, 1.5)
        bn.weight.data.uniform_(0.5, 1.5)
        bn.bias.data.uniform_(-0.1, 0.1)
    return net.eval()


def example_inputs() -> tuple:
    return (torch.randn(2, 3, 27, 25, generator=torch.Generator().manual_seed(1)),)
