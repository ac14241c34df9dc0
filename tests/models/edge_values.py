"""Edge values and dtypes: integer max/min, NaN propagation, predicates, integer pow,
negative slices of computed values, and tensors with no elements."""
import torch


class EdgeValues(torch.nn.Module):
    def forward(self, ints, floats, empty):
        return (
            ints.amax(-1), ints.amin(-1),            # integer reductions have no infinity
            ints ** 35,                              # exact integer power (wraps like torch)
            floats.amax(-1), floats.amin(-1),        # NaN propagates through max/min
            torch.isnan(floats), ~(floats > 0),      # predicates on floats; ~ on bool
            torch.relu(floats * 1.0), torch.sign(floats * 1.0),
            (floats * 2)[-100:] + 1,                 # negative start past the beginning
            empty * 2 + 1,                           # no elements: nothing to compute
        )


def model():
    return EdgeValues()


def example_inputs():
    ints = torch.tensor([[-3, -5, -7], [4, 9, 2]], dtype=torch.int64)
    floats = torch.tensor([[1.0, float("nan"), 2.0, 0.5], [3.0, -1.0, 0.0, 1.0]])
    return ints, floats, torch.ones(4, 0)
