"""ViT-S/16 at full depth (Dosovitskiy et al. 2020; 12 encoder layers, width 384, 6 heads,
MLP 1536), the layers of vit_s16.py; random weights; batch 1, 3x224x224 -> 1000 logits."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vit_s16 import IMAGE, ViT  # noqa: E402

__version__ = "0.1.0"


def model() -> nn.Module:
    torch.manual_seed(0)
    return ViT(layers=12).eval()


def example_inputs() -> tuple:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(1, 3, IMAGE, IMAGE, generator=generator),)
