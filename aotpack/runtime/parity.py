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


#: Elements compared at a time: the float64 temporaries of a chunk (512 KB each) stay in
#: L2, where a full-size float64 copy per step went to memory.
CHUNK_ELEMENTS = 1 << 16


@dataclass
class _FloatCheck:
    """Running totals of one float output's comparison, chunk by chunk."""

    max_abs_error: float = 0.0
    nan_mismatch: bool = False
    bad: int = 0


def _check_float_chunk(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float, into: _FloatCheck) -> None:
    """Fold one chunk (flat, same dtype) of ours ``a`` and eager ``b`` into ``into``."""
    nan_a, nan_b = a.isnan(), b.isnan()
    if not torch.equal(nan_a, nan_b):
        into.nan_mismatch = True
        return
    a64, b64 = a.double(), b.double()
    # equal values (both +-inf included) and NaN in both count as no error; inf against a
    # finite value or -inf stays inf
    error = torch.where((a64 == b64) | nan_b, 0.0, (a64 - b64).abs())
    if error.numel():
        into.max_abs_error = max(into.max_abs_error, error.max().item())
    # an infinite error is off even where eager is infinite (where the tolerance is too)
    into.bad += int(((error > atol + rtol * b64.abs()) | (error == float("inf"))).sum())


def compare(ours: list[torch.Tensor], reference: list[torch.Tensor],
            atol: float = ATOL, rtol: float = RTOL) -> Parity:
    """Compare output lists (same order); never raises on a mismatch, reports it.

    Float outputs are compared ``CHUNK_ELEMENTS`` at a time in float64, so the
    temporaries stay in cache: a 4096x4096 float32 output takes 0.17-0.31 s, where whole-tensor
    float64 copies took 0.98-1.28 s (and a build compares twice: Python mode, native run).
    """
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
        check = _FloatCheck()
        flat_a, flat_b = a.reshape(-1), b.reshape(-1)
        for start in range(0, flat_b.numel(), CHUNK_ELEMENTS):
            _check_float_chunk(flat_a[start:start + CHUNK_ELEMENTS], flat_b[start:start + CHUNK_ELEMENTS],
                               atol, rtol, check)
            if check.nan_mismatch:
                break
        if check.nan_mismatch:
            result.problems.append(f"output {i}: NaN at different positions")
            continue
        result.max_abs_error = max(result.max_abs_error, check.max_abs_error)
        if check.bad:
            result.problems.append(f"output {i}: {check.bad} elements off, max abs error "
                                   f"{check.max_abs_error:.3g} (tolerance {atol:g} + {rtol:g}*|eager|)")
    return result
