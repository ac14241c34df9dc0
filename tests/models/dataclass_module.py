"""A model file using dataclasses with postponed annotations (needs sys.modules)."""
from __future__ import annotations

import typing
from dataclasses import dataclass

import torch


@dataclass
class Config:
    scale: typing.ClassVar[float] = 2.0
    width: int = 4


class Scale(torch.nn.Module):
    def forward(self, x):
        return x * Config.scale


def model():
    return Scale()


def example_inputs():
    return (torch.ones(Config().width),)
