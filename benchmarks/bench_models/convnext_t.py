"""ConvNeXt-T (Liu et al. 2022; stages 3-3-9-3 at widths 96-192-384-768, 7x7 depthwise
convolutions, LayerNorm over channels, a 4x GELU MLP and layer scale) in plain torch ops,
random weights, eval mode; batch 1, 3x224x224 -> 1000 logits."""
import torch
import torch.nn.functional as F
from torch import nn

__version__ = "0.1.0"

IMAGE = 224


class ChannelNorm(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.1))

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.gamma * self.fc2(F.gelu(self.fc1(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


class ConvNeXtT(nn.Module):
    def __init__(self, classes: int = 1000, depths=(3, 3, 9, 3), dims=(96, 192, 384, 768)):
        super().__init__()
        layers = [nn.Conv2d(3, dims[0], 4, 4), ChannelNorm(dims[0], eps=1e-6)]
        for i, (depth, dim) in enumerate(zip(depths, dims)):
            if i > 0:
                layers += [ChannelNorm(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], dim, 2, 2)]
            layers += [Block(dim) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x):
        x = self.features(x).mean(dim=(2, 3))
        return self.head(self.norm(x))


def model() -> nn.Module:
    torch.manual_seed(0)
    return ConvNeXtT().eval()


def example_inputs() -> tuple:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(1, 3, IMAGE, IMAGE, generator=generator),)
