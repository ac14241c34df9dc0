"""Numerical parity of aotpack's outputs with eager PyTorch.

Tolerances (float outputs): ``|ours - eager| <= ATOL + RTOL * |eager|`` elementwise,
with NaN where eager has NaN; integer and bool outputs must be equal. Fused kernels
reassociate sums and use libmvec transcendentals (<= 4 ulp), hence not bit equality.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

ATOL = 1e-4
RTOL = 1e-4


@dataclass
class Parity:
    """Result of a comparison: worst absolute error of float outputs, and problems."""

    max_abs_error: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No problem found."""
        return not self.problems


def compare(ours: list[torch.Tensor], reference: list[torch.Tensor],
            atol: float = ATOL, rtol: float = RTOL) -> Parity:
    """Compare output lists (same order); never raises on a mismatch, reports it."""
    result = Parity()
    if len(ours) != len(reference):
        result.problems.append(f"{len(ours)} outputs, eager has {len(reference)}")
        return result
    for i, (a, b) in enumerate(zip(ours, reference)):
        if a.shape != b.shape or a.dtype != b.dtype:
            result.problems.append(f"output {i}: {a.dtype}{list(a.shape)}, eager {b.dtype}{list(b.shape)}")
            continue
        if not b.dtype.is_floating_point:
            if not torch.equal(a, b):
                result.problems.append(f"output {i}: {int((a != b).sum())} elements differ")
            continue
        if not torch.equal(a.isnan(), b.isnan()):
            result.problems.append(f"output {i}: NaN at different positions")
            continue
        finite = ~b.isnan()
        a64, b64 = a.double()[finite], b.double()[finite]
        if a64.numel() == 0:
            continue
        same_inf = (a64 == b64)  # +-inf compare equal to themselves only
        error = torch.where(same_inf, torch.zeros_like(a64), (a64 - b64).abs())
        result.max_abs_error = max(result.max_abs_error, error.max().item())
        bad = error > atol + rtol * b64.abs()
        if bad.any():
            result.problems.append(f"output {i}: {int(bad.sum())} elements off, max abs error "
                                   f"{error.max().item():.3g} (tolerance {atol:g} + {rtol:g}*|eager|)")
    return result
