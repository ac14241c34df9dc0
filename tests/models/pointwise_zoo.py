"""Every fused pointwise op and innermost reduction of issue #2 in one model."""
import torch
import torch.nn.functional as F


class Zoo(torch.nn.Module):
    def forward(self, x, y):
        pos = x.abs() + 0.5
        a = (x + y) * (x - y) / (y.abs() + 1.0)
        b = -F.relu(a) + F.gelu(x) + torch.sigmoid(y) + torch.tanh(x)
        c = torch.exp(x.clamp(max=3.0)) + torch.log(pos) + torch.sqrt(pos) + torch.rsqrt(pos)
        d = torch.pow(pos, 1.5) + torch.pow(pos, y.abs())
        e = torch.where(x > y, torch.maximum(x, y), torch.minimum(x, y)).clamp(-1.0, 1.0)
        mask = (x >= 0) & (y < 0.5) | (x == y) | (x != 0.25) & (y <= 1)
        f = mask.float() + x.to(torch.float64).to(torch.float32) + (x * 4).to(torch.int64).to(torch.float32)
        out = a + b + c + d + e + f
        s = out.sum(dim=-1, keepdim=True)
        m = out.mean(dim=-1)
        mx = out.amax(dim=-1, keepdim=True)
        return out - mx + s / 100, m, torch.softmax(out, dim=-1)


def model():
    return Zoo()


def example_inputs():
    g = torch.Generator().manual_seed(3)
    return (torch.randn(8, 3, 40, generator=g), torch.randn(3, 40, generator=g))
