"""CPU tiling solver: up to ``MAX_TOPN`` candidate tilings per fused kernel.

A candidate is the triple ``(tiling_repr, workspace, block_dim)``:

* ``block_dim`` – parallel blocks, i.e. OpenMP threads (1 = no parallel region),
  never above the device limit;
* ``tiling_repr`` – canonical text of every knob, so equal tilings give equal text;
* ``workspace`` – scratch bytes; CPU kernels keep partial results in registers, so 0.

``kernel_key = md5(f"{tiling_repr}|{workspace}|{block_dim}")`` (``backends.base.kernel_key``).
Candidate 0 is always the heuristic default; the rest vary one knob at a time
around it, nearest first, so trimming to TopN keeps the most plausible ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from aotpack.backends.base import Candidate
from aotpack.config import MAX_TOPN
from aotpack.kernel_ir import FusedKernel

#: Below this many elements per kernel a parallel region costs more than it saves
#: (an empty 2-thread OpenMP region costs ~0.8 us on a 2-core host).
PARALLEL_MIN_ELEMENTS = 16384


@dataclass(frozen=True)
class Tiling(Candidate):
    """Knobs of one CPU static kernel.

    block_dim: OpenMP threads. inner_tile: elements of the innermost dimension per
    work item (pointwise kernels only; rows are never split when a kernel reduces).
    simdlen: ``omp simd simdlen`` (0 = compiler's choice). chunk: work items per
    ``schedule(static, chunk)`` slice (0 = one contiguous slice per thread).
    row_block: rows per work item, swept column tile by column tile — the loop order
    for transposing access (0 = one row per work item).
    """

    block_dim: int
    inner_tile: int
    simdlen: int
    chunk: int
    row_block: int = 0
    workspace: int = 0

    @property
    def tiling_repr(self) -> str:
        """``tiling_repr``: every knob, canonical (equal tilings give equal text)."""
        text = (f"cpu;block_dim={self.block_dim};inner_tile={self.inner_tile};"
                f"simdlen={self.simdlen};chunk={self.chunk}")
        return text + (f";row_block={self.row_block}" if self.row_block else "")


def _default_block_dim(numel: int, parallel_items: int, device_limit: int) -> int:
    if numel < PARALLEL_MIN_ELEMENTS:
        return 1
    return max(1, min(device_limit, parallel_items))


def solve(kernel: FusedKernel, device_limit: int, count: int = MAX_TOPN) -> list[Tiling]:
    """Candidate tilings for ``kernel``, default first, at most ``count``.

    Args:
        kernel: the fused kernel (its domain is ``outer_shape x inner_size``); rows stay
            whole when it computes a reduction.
        device_limit: cores available to kernels; every block_dim <= it.
    """
    reduces = kernel.has_reduction
    rows = math.prod(kernel.outer_shape)
    cols = kernel.inner_size
    numel = rows * cols
    full = cols
    default_tile = full if reduces or cols <= 4096 else 4096
    items = rows * -(-cols // default_tile)
    block = _default_block_dim(numel, items, device_limit)
    default = Tiling(block, default_tile, 0, 0)
    transposing = kernel.access.strided and not reduces and rows >= 16 and cols >= 16
    if transposing:  # blocked loop order: strided reads reuse cache lines across rows
        default = Tiling(block, min(cols, 32), 0, 0, row_block=16)
    options = [default]
    if transposing:
        options += [Tiling(block, min(cols, 64), 0, 0, row_block=32), Tiling(block, default_tile, 0, 0)]
    # Nearest neighbours of the default first: thread count, then vector width,
    # then work split (tile or interleaved rows).
    other_blocks = [b for b in (1, device_limit) if b != block and b <= max(1, items)]
    options += [Tiling(b, default_tile, 0, 0) for b in other_blocks]
    options += [Tiling(block, default_tile, s, 0) for s in (16, 8)]
    if not reduces and cols > 256:
        options += [Tiling(block, t, 0, 0) for t in (1024, 256) if t < cols]
    if block > 1 and rows >= 4 * block:
        options += [Tiling(block, default_tile, 0, c) for c in (1, 8) if c < rows]
    options += [Tiling(b, default_tile, 16, 0) for b in other_blocks]
    unique, seen = [], set()
    for option in options:
        if option.tiling_repr not in seen:
            seen.add(option.tiling_repr)
            unique.append(option)
    return unique[:min(count, MAX_TOPN)]
