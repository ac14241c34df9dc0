"""div with rounding_mode, floor_divide and remainder: float (zeros, inf, NaN, -0.0 among the
operands) and int64 (negative dividends and divisors, INT64_MIN // -1), odd sizes, a
transposed and a step-sliced input. ``n // m`` (integer tensor divisor) stays an extern call:
ATen raises on an integer division by zero, which a fused kernel cannot. Also hardtanh,
ReLU6 and clamp with tensor bounds on int64."""
import torch
import torch.nn.functional as F


class Division(torch.nn.Module):
    def forward(self, a, b, n, m):
        bt = b.t()                   # (7, 13), transposed, some zeros
        floats = (torch.div(a, bt, rounding_mode="floor"), torch.div(a, bt, rounding_mode="trunc"),
                  torch.remainder(a, bt), torch.floor_divide(a, -2.5), torch.remainder(a, -1.5))
        ms = m[:, ::2]               # (2, 9) step-2 slice of int64
        ints = (n // 3, n // -4, torch.div(n, -5, rounding_mode="trunc"), n % 3, n % -4, n // -1,
                torch.remainder(n, -1), ms // -2, ms % 5, n // 2.5, n % 2.5)
        flat = m.flatten()
        clamps = (F.hardtanh(n, -7, 9) * 100 + F.relu6(n), torch.clamp(n[:36], flat * -3, flat.abs() * 5))
        return floats + ints + clamps + (n[:36] // flat,)


def model():
    return Division()


def example_inputs():
    g = torch.Generator().manual_seed(5)
    a = torch.randn(7, 13, generator=g) * 10
    a[0, :5] = torch.tensor([0.0, -0.0, float("inf"), float("nan"), 5.0])
    b = torch.randn(13, 7, generator=g) * 3
    b[:5, 0] = torch.tensor([0.0, 2.0, 3.0, 1.0, float("inf")])
    b[5:8, 1] = 0.0
    n = torch.randint(-50, 50, (257,), generator=g)
    n[:3] = torch.tensor([-2**63, 2**63 - 1, 0])
    m = torch.randint(1, 9, (2, 18), generator=g) * torch.tensor([1, -1]).repeat(9)
    return (a, b, n, m)
