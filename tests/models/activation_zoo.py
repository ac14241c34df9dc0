"""Parametric activations and clamp with tensor bounds, on odd, transposed and strided inputs.

ReLU6/hardtanh, leaky_relu, elu (alpha, scale, input_scale), selu, celu, hardswish,
hardsigmoid, silu, mish, clamp/clamp_min/clamp_max with tensor (and broadcast) bounds;
NaN, +-inf and -0.0 among the inputs.
"""
import torch
import torch.nn.functional as F

aten = torch.ops.aten


class Activations(torch.nn.Module):
    def forward(self, x, w, v, u):
        xt = w.t()                   # (7, 13), transposed
        vs = v[:, ::2]               # (3, 257), step-2 slice
        a = F.relu6(x) + F.hardtanh(xt, -0.5, 2.0) + F.leaky_relu(x, 0.2) + F.elu(xt, 0.7)
        b = aten.elu.default(x, 0.7, 1.5, 0.5) + F.selu(xt) + F.celu(x, 0.5)
        c = F.hardswish(vs) + F.hardsigmoid(vs) + F.silu(vs) + F.mish(vs) + F.relu6(vs * 4)
        lo, hi = xt * 0.1 - 0.5, x.abs()
        d = torch.clamp(x, lo, hi) + torch.clamp_min(x, xt) + torch.clamp_max(xt, x[0]) + torch.clamp(x, min=lo)
        e = F.leaky_relu(u, 0.01) + F.hardtanh(u)  # 1x1
        return a, b, c, d, e, F.hardtanh(x, 0.0, 6.0)


def model():
    return Activations()


def example_inputs():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(7, 13, generator=g) * 3
    x[0, :4] = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0])
    return (x, torch.randn(13, 7, generator=g) * 3, torch.randn(3, 514, generator=g) * 4,
            torch.tensor([[-0.25]]))
