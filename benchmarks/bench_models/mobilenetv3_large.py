"""MobileNetV3-Large (Howard et al. 2019, the torchvision layout), the blocks of
mobilenetv3_small.py with the Large table; random weights, eval mode; batch 1, 3x224x224 ->
1000 logits."""
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mobilenetv3_small import IMAGE, ConvBN, InvertedResidual  # noqa: E402
from resnet18 import _randomize_batchnorm  # noqa: E402

__version__ = "0.1.0"

# (in, kernel, expanded, out, squeeze-excite, activation, stride): torchvision's table
LARGE = [(16, 3, 16, 16, False, nn.ReLU, 1), (16, 3, 64, 24, False, nn.ReLU, 2),
         (24, 3, 72, 24, False, nn.ReLU, 1), (24, 5, 72, 40, True, nn.ReLU, 2),
         (40, 5, 120, 40, True, nn.ReLU, 1), (40, 5, 120, 40, True, nn.ReLU, 1),
         (40, 3, 240, 80, False, nn.Hardswish, 2), (80, 3, 200, 80, False, nn.Hardswish, 1),
         (80, 3, 184, 80, False, nn.Hardswish, 1), (80, 3, 184, 80, False, nn.Hardswish, 1),
         (80, 3, 480, 112, True, nn.Hardswish, 1), (112, 3, 672, 112, True, nn.Hardswish, 1),
         (112, 5, 672, 160, True, nn.Hardswish, 2), (160, 5, 960, 160, True, nn.Hardswish, 1),
         (160, 5, 960, 160, True, nn.Hardswish, 1)]


class MobileNetV3Large(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        layers = [ConvBN(3, 16, 3, 2, act=nn.Hardswish)]
        layers += [InvertedResidual(*row) for row in LARGE]
        layers.append(ConvBN(160, 960, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(960, 1280), nn.Hardswish(), nn.Linear(1280, classes))

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def model() -> nn.Module:
    torch.manual_seed(0)
    net = MobileNetV3Large()
    _randomize_batchnorm(net)
    return net.eval()


def example_inputs() -> tuple:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(1, 3, IMAGE, IMAGE, generator=generator),)
