"""A model file that forgets example_inputs()."""
import torch


def model():
    return torch.nn.Linear(4, 4)
