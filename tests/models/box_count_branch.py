"""Detection-style post-processing: branch on a data-dependent box count."""
import torch


class Postprocess(torch.nn.Module):
    def forward(self, boxes, scores):
        kept = boxes[scores > 0.5]
        if kept.shape[0] == 0:
            return boxes[:1] * 0
        return kept * 2


def model():
    return Postprocess()


def example_inputs():
    return (torch.randn(16, 4), torch.rand(16))
