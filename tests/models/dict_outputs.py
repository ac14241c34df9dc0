"""forward returns a dict holding a tuple: outputs are named by their keys."""
import torch


class DictOutputs(torch.nn.Module):
    def forward(self, x):
        return {"logits": x * 2, "aux": (x + 1, x.sum())}


def model():
    return DictOutputs()


def example_inputs():
    return (torch.linspace(-1, 1, 6),)
