"""MobileNetV3-Small (Howard et al. 2019, the torchvision layout: hardswish, squeeze-and-
excite, depthwise convs) in plain torch ops, random weights, eval mode; batch 1,
3x224x224 -> 1000 logits."""
import torch
import torch.nn.functional as F
from torch import nn

__version__ = "0.1.0"

IMAGE = 224


def _divisible(v: float, divisor: int = 8) -> int:
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


class ConvBN(nn.Sequential):
    def __init__(self, c_in, c_out, kernel, stride=1, groups=1, act=None):
        layers = [nn.Conv2d(c_in, c_out, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                  nn.BatchNorm2d(c_out)]
        if act is not None:
            layers.append(act())
        super().__init__(*layers)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        squeeze = _divisible(channels // 4)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))


class InvertedResidual(nn.Module):
    def __init__(self, c_in, kernel, expanded, c_out, use_se, act, stride):
        super().__init__()
        self.residual = stride == 1 and c_in == c_out
        layers = []
        if expanded != c_in:
            layers.append(ConvBN(c_in, expanded, 1, act=act))
        layers.append(ConvBN(expanded, expanded, kernel, stride, groups=expanded, act=act))
        if use_se:
            layers.append(SqueezeExcite(expanded))
        layers.append(ConvBN(expanded, c_out, 1))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        y = self.block(x)
        return x + y if self.residual else y


# (in, kernel, expanded, out, squeeze-excite, activation, stride): torchvision's table
SMALL = [(16, 3, 16, 16, True, nn.ReLU, 2), (16, 3, 72, 24, False, nn.ReLU, 2),
         (24, 3, 88, 24, False, nn.ReLU, 1), (24, 5, 96, 40, True, nn.Hardswish, 2),
         (40, 5, 240, 40, True, nn.Hardswish, 1), (40, 5, 240, 40, True, nn.Hardswish, 1),
         (40, 5, 120, 48, True, nn.Hardswish, 1), (48, 5, 144, 48, True, nn.Hardswish, 1),
         (48, 5, 288, 96, True, nn.Hardswish, 2), (96, 5, 576, 96, True, nn.Hardswish, 1),
         (96, 5, 576, 96, True, nn.Hardswish, 1)]


class MobileNetV3Small(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        layers = [ConvBN(3, 16, 3, 2, act=nn.Hardswish)]
        layers += [InvertedResidual(*row) for row in SMALL]
        layers.append(ConvBN(96, 576, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Linear(1024, classes))

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def model() -> nn.Module:
    torch.manual_seed(0)
    net = MobileNetV3Small()
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return net.eval()


def example_inputs() -> tuple:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(1, 3, IMAGE, IMAGE, generator=generator),)
