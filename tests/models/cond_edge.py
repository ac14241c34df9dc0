"""torch.cond with a float predicate (any one-element tensor counts: nonzero = true),
a branch returning an expanded view, and a float16 extern with a Python scalar."""
import torch


class CondEdge(torch.nn.Module):
    def forward(self, x, p):
        def then(a):
            return (a.sum(0, keepdim=True).expand(3, 4) * 2,)

        def otherwise(a):
            return (a - 1,)

        (y,) = torch.cond(p.sum(), then, otherwise, (x,))
        half = (x.half() * 2).float()                       # extern mul.Tensor(half, 2)
        return y + half


def model():
    return CondEdge()


def example_inputs():
    return torch.arange(12.0).reshape(3, 4) / 10, torch.tensor([0.25, 0.25])   # sum 0.5: true
