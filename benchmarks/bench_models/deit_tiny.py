"""DeiT-Tiny (Touvron et al. 2021: the ViT layout at width 192, 3 heads, MLP 768, 12 layers,
16x16 patches), the layers of vit_s16.py, without the distillation token; random weights;
batch 1, 3x224x224 -> 1000 logits."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vit_s16 import IMAGE, ViT  # noqa: E402

__version__ = "0.1.0"


def model() -> nn.Module:
    torch.manual_seed(0)
    return ViT(dim=192, heads=3, mlp=768, layers=12).eval()


def example_inputs() -> tuple:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(1, 3, IMAGE, IMAGE, generator=generator),)
