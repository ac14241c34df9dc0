"""ResNet-18 (He et al. 2015, the torchvision layout) in plain torch ops, random weights
and BatchNorm statistics, eval mode; batch 1, 3x224x224 -> 1000 logits."""
import torch
from torch import nn

__version__ = "0.1.0"

IMAGE = 224


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.down = None
        if stride != 1 or c_in != c_out:
            self.down = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        blocks, c_in = [], 64
        for c_out, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(c_in, c_out, stride), BasicBlock(c_out, c_out, 1)]
            c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(x.mean(dim=(2, 3), keepdim=True), 1))


def _randomize_batchnorm(module: nn.Module) -> None:
    """Non-trivial running statistics, so folding BatchNorm is actually checked."""
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.1, 0.1)


def model() -> nn.Module:
    torch.manual_seed(0)
    net = ResNet18()
    _randomize_batchnorm(net)
    return net.eval()


def example_inputs() -> tuple:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(1, 3, IMAGE, IMAGE, generator=generator),)
