"""torch's type promotion in comparisons (bool vs int scalar, float32 vs 0-d float64),
integer fmod and rounding beyond 2**53, and pow's special exponents on inf and -0."""
import torch


class PromotionAndSpecials(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("t", torch.tensor(0.1, dtype=torch.float64))

    def forward(self, x, big, ten, specials):
        positive = x > 0
        return (positive == 2, positive < 2, x <= self.t, x == self.t,
                torch.fmod(big, ten), torch.ceil(big), torch.trunc(big), torch.round(big),
                specials ** 0.5, specials ** -0.5, specials ** 2, specials ** -1)


def model():
    return PromotionAndSpecials()


def example_inputs():
    return (torch.tensor([0.1, 0.2, 0.05, -1.0]),
            torch.tensor([2**60 + 7, -(2**55) - 3]), torch.tensor([10, 10]),
            torch.tensor([float("-inf"), 4.0, -0.0, 2.0]))
