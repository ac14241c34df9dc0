"""EfficientNet-B0 (Tan & Le 2019; MBConv blocks with depthwise convolutions,
squeeze-and-excite and SiLU, the torchvision layout) in plain torch ops, random weights and
BatchNorm statistics, eval mode; batch 1, 3x224x224 -> 1000 logits."""
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resnet18 import IMAGE, _randomize_batchnorm  # noqa: E402

__version__ = "0.1.0"


def _conv_bn(c_in, c_out, kernel, stride=1, groups=1, act=True):
    layers = [nn.Conv2d(c_in, c_out, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
              nn.BatchNorm2d(c_out)]
    return nn.Sequential(*layers, nn.SiLU()) if act else nn.Sequential(*layers)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeeze: int):
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.fc2(F.silu(self.fc1(s))))


class MBConv(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, expand: int):
        super().__init__()
        hidden = c_in * expand
        self.residual = stride == 1 and c_in == c_out
        layers = [] if expand == 1 else [_conv_bn(c_in, hidden, 1)]
        layers += [_conv_bn(hidden, hidden, kernel, stride, groups=hidden),
                   SqueezeExcite(hidden, max(1, c_in // 4)), _conv_bn(hidden, c_out, 1, act=False)]
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        y = self.block(x)
        return x + y if self.residual else y


# (expand, kernel, stride, out channels, repeats): the B0 table
STAGES = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
          (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]


class EfficientNetB0(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        layers, c_in = [_conv_bn(3, 32, 3, 2)], 32
        for expand, kernel, stride, c_out, repeats in STAGES:
            for i in range(repeats):
                layers.append(MBConv(c_in, c_out, kernel, stride if i == 0 else 1, expand))
                c_in = c_out
        layers.append(_conv_bn(c_in, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, classes)

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def model() -> nn.Module:
    torch.manual_seed(0)
    net = EfficientNetB0()
    _randomize_batchnorm(net)
    return net.eval()


def example_inputs() -> tuple:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(1, 3, IMAGE, IMAGE, generator=generator),)
