"""var/std/std_mean (correction, dims, keepdim) and bool/integer sum and prod (int64
accumulation, as eager), on odd, transposed, step-sliced and 1x1 inputs; data with a
large mean (var's deviations are taken from the row mean). ``var`` over a leading dim
stays an extern call (only trailing-dim reductions fuse)."""
import torch


class Stats(torch.nn.Module):
    def forward(self, x, w, v, z, n):
        xt = w.t()                   # (7, 13), transposed
        vs = v[:, ::2]               # (3, 257), step-2 slice
        stats = (torch.var(x, -1), torch.var(xt, -1, correction=0, keepdim=True), torch.std(vs, -1),
                 torch.var(x), torch.std(x, dim=(0, 1), correction=2), *torch.std_mean(vs, -1, keepdim=True),
                 torch.var(z), torch.var(z, correction=0), torch.var(x + 1000.0, -1),
                 torch.var(x[:2], -1, correction=13), torch.var(x, 0))
        counts = ((x > 0).sum(-1), (xt > 0).sum(), (vs > -3).prod(-1), n.sum(-1), n.int().sum(-1),
                  (n % 3 == 0).sum(-1, keepdim=True), n.prod(-1))
        return stats + counts


def model():
    return Stats()


def example_inputs():
    g = torch.Generator().manual_seed(7)
    return (torch.randn(7, 13, generator=g) * 2 + 3, torch.randn(13, 7, generator=g),
            torch.randn(3, 514, generator=g), torch.tensor([[1.5]]), torch.randint(-3, 4, (5, 9), generator=g))
