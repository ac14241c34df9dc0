"""A MobileNetV3/SSDLite-like block: conv-BN-hardswish stem, inverted residual with
depthwise conv-BN-ReLU6, squeeze-excite (hardsigmoid gate) and an SSDLite-style head
(depthwise + pointwise, ReLU6). Odd spatial size (13x13)."""
import torch
from torch import nn


def conv_bn(cin, cout, k=1, stride=1, groups=1, act=nn.ReLU6):
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), act())


class SqueezeExcite(nn.Module):
    def __init__(self, c, r=4):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, c // r, 1), nn.Conv2d(c // r, c, 1)

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        return x * nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = conv_bn(3, 16, 3, 2, act=nn.Hardswish)
        self.expand = conv_bn(16, 48, act=nn.Hardswish)
        self.depthwise = conv_bn(48, 48, 3, groups=48)
        self.se = SqueezeExcite(48)
        self.project = nn.Sequential(nn.Conv2d(48, 16, 1, bias=False), nn.BatchNorm2d(16))
        self.head = nn.Sequential(conv_bn(16, 16, 3, groups=16), nn.Conv2d(16, 24, 1))

    def forward(self, x):
        x = self.stem(x)
        y = self.project(self.se(self.depthwise(self.expand(x))))
        return self.head(x + y)


def model():
    torch.manual_seed(0)
    net = Block().eval()
    with torch.no_grad():  # non-trivial BN statistics
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return net


def example_inputs():
    return (torch.randn(1, 3, 26, 26, generator=torch.Generator().manual_seed(1)),)
