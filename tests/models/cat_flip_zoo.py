"""torch.cat and torch.flip as index arithmetic inside the consumer's kernel.

cat along the inner, a middle and the outer dimension; of lazy values, buffers,
transposed and step-sliced inputs, a broadcast input, the same tensor twice, a 1-D
empty tensor, int64 next to float32 (promoted), a cat of cats, a cat of softmaxes (a
reduction read at shifted rows), a single-input cat and a negative dim; flip along one,
several and negative dims, of a lazy value and of a transposed input, also the inner
dimension; cats read by a row softmax, a column sum and a long row's sum; an inner cat
reshaped so each of its pieces is whole rows; a wide inner cat cut into column tiles. Odd sizes
throughout (7, 13, 3, 5).
"""
import torch


class CatFlip(torch.nn.Module):
    def forward(self, x, w, v, k):
        xt = w.t()                                             # (7, 13), transposed
        inner = torch.cat([x * 2.0, xt, x[:, :3]], dim=1)      # (7, 29)
        outer = torch.cat([x, xt.relu(), x[::3]], dim=0)       # (17, 13)
        middle = torch.cat([v, v[:, :2] - 1.0, v.flip(1)], dim=1)  # (3, 12, 5)
        twice = torch.cat([x, x], dim=-1) + 1.0                # (7, 26), same tensor twice
        mixed = torch.cat([k, x], dim=0) * 0.5                 # int64 and float32 -> float32
        empty = torch.cat([x, x.flatten()[:0], xt], dim=0).exp()  # a 1-D empty tensor
        nested = torch.cat([torch.cat([x, xt], dim=1), x.flip(-1)], dim=1).tanh()  # (7, 39)
        soft = torch.cat([x.softmax(-1), xt.softmax(-1)], dim=0) * 3.0  # (14, 13)
        single = torch.cat([x.sigmoid()], dim=0)
        broadcast = torch.cat([x, (x[0] * 0.0 + 1.0).expand(2, 13)], dim=0)  # (9, 13)
        flips = v.flip(0, 2) + v.permute(0, 2, 1).flip(-2).permute(0, 2, 1)
        flipped_t = xt.flip(1) - 1.0
        # a cat read by reductions: a row softmax (online/stored-exp forms), a column sum
        # (column loop order), a long row's sum (split reduction)
        row_soft = torch.cat([x, xt.flip(0)], dim=-1).softmax(-1)
        col_sum = torch.cat([x, xt * 2.0], dim=0).sum(0)
        long_sum = torch.cat([x.reshape(-1), w.reshape(-1).exp()] * 20).sum()
        # an inner cat whose rows are reshaped into the outer dimensions: the piece is row-invariant
        rows_of_pieces = torch.cat([x, xt * 3.0, x.flip(0)], dim=1).reshape(7, 3, 13).permute(1, 0, 2).relu()
        # a wide inner cat (182 columns, cut at 91 and split into column tiles by some tilings)
        wide = torch.cat([w.reshape(1, -1).expand(3, -1), x.reshape(1, -1).expand(3, -1) * 0.5], dim=1) + 1.0
        return (inner, outer, middle, twice, mixed, empty, nested, soft, single, broadcast, flips, flipped_t,
                row_soft, col_sum, long_sum, rows_of_pieces, wide)


def model():
    return CatFlip()


def example_inputs():
    g = torch.Generator().manual_seed(5)
    return (torch.randn(7, 13, generator=g), torch.randn(13, 7, generator=g),
            torch.randn(3, 5, 5, generator=g), torch.randint(-5, 5, (2, 13), generator=g))
