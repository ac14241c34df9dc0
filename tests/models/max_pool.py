"""Max pooling lowered to fused kernels (``aotpack/lower/pooling.py``): ResNet's 3x3 stride-2
pool with padding of a ReLU, no padding, dilation with ceil_mode (windows cut at the
end), a 3-D input, a stride along the rows only (one pass, read in place), NaN and -inf
in the windows; a pool whose indices are read stays an ATen call."""
import torch
import torch.nn.functional as F


class MaxPool(torch.nn.Module):
    def forward(self, x):
        values, indices = F.max_pool2d(x, 2, return_indices=True)
        return (F.max_pool2d(torch.relu(x), 3, 2, 1), F.max_pool2d(x, 2),
                F.max_pool2d(x, 3, 2, 1, dilation=2, ceil_mode=True), F.max_pool2d(x[0], (2, 3), (1, 2), (1, 1)),
                F.max_pool2d(x, (3, 2), (2, 1)), values + 1, indices)


def model():
    return MaxPool()


def example_inputs():
    x = torch.randn(1, 4, 13, 12, generator=torch.Generator().manual_seed(0))
    x[0, 0, 0, 0] = float("nan")
    x[0, 1, 5, 5] = float("-inf")
    x[0, 2, 6:9, 6:9] = float("-inf")  # a whole window of -inf
    return (x,)
