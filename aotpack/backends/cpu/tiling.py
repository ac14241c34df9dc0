"""CPU tiling solver: up to ``MAX_TOPN`` candidate tilings per fused kernel.

A candidate is the triple ``(tiling_repr, workspace, block_dim)``:

* ``block_dim`` – parallel blocks, i.e. OpenMP threads (1 = no parallel region),
  never above the device limit;
* ``tiling_repr`` – canonical text of every knob, so equal tilings give equal text;
* ``workspace`` – scratch bytes: 0, except a split reduction's partials
  (``reduce_loops.split_workspace_bytes``, a function of the segments per row).

``kernel_key = md5(f"{tiling_repr}|{workspace}|{block_dim}")`` (``backends.base.kernel_key``).
Candidate 0 is always the heuristic default; the rest vary one knob at a time
around it, nearest first, so trimming to TopN keeps the most plausible ones.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from aotpack.backends.base import Candidate
from aotpack.config import MAX_TOPN
from aotpack.backends.cpu import softmax_store
from aotpack.backends.cpu.reduce_loops import split_workspace_bytes
from aotpack.ir.kernel import FusedKernel, column_access, flat_reductions, online_softmax_pairs

#: Below this many elements per kernel a parallel region costs more than it saves
#: (an empty 2-thread OpenMP region costs ~0.8 us on a 2-core host).
PARALLEL_MIN_ELEMENTS = 16384

#: Largest column block of a column reduction (accumulators on the stack: 32 KiB of double).
MAX_COL_BLOCK = 4096
#: A reduction of fewer rows than threads is split when its rows are at least this long.
SPLIT_MIN_COLS = 65536
#: Rows longer than this (float32: 256 KiB, a quarter of a 1 MiB L2) get the online softmax
#: as the default candidate: a second sweep would read them from memory again.
ONLINE_FIRST_COLS = 65536


@dataclass(frozen=True)
class Tiling(Candidate):
    """Knobs of one CPU static kernel.

    block_dim: OpenMP threads. inner_tile: elements of the innermost dimension per
    work item (pointwise kernels only; rows are never split when a kernel reduces).
    simdlen: ``omp simd simdlen`` (0 = compiler's choice). chunk: work items per
    ``schedule(static, chunk)`` slice (0 = one contiguous slice per thread).
    row_block: rows per work item, swept column tile by column tile — the loop order
    for transposing access (0 = one row per work item). online: 1 = softmax's max and
    sum of exp in one sweep over the row (running max, rescaled sum), 0 = one sweep each,
    2 = that sweep also stores ``exp(x - running max)`` into a softmax output, rescaled
    per chunk after it (``softmax_store``: exp once per element).
    col_block: a column reduction (``x.sum(0)``) sweeps rows across blocks of this many
    outputs (``reduce_loops``; 0 = the row form). split: segments each row is cut into
    for a reduction of few long rows, partials in the workspace (0 = whole rows).
    stream: 1 = the stored-exp softmax (``online=2``) buffers a row's exp and writes the
    output with non-temporal stores (``softmax_store.streams``: large outputs only).
    """

    block_dim: int
    inner_tile: int
    simdlen: int
    chunk: int
    row_block: int = 0
    workspace: int = 0
    online: int = 0
    col_block: int = 0
    split: int = 0
    stream: int = 0

    @property
    def tiling_repr(self) -> str:
        """``tiling_repr``: every knob, canonical (equal tilings give equal text)."""
        text = (f"cpu;block_dim={self.block_dim};inner_tile={self.inner_tile};"
                f"simdlen={self.simdlen};chunk={self.chunk}")
        text += f";row_block={self.row_block}" if self.row_block else ""
        text += f";online={self.online}" if self.online else ""
        text += f";col_block={self.col_block}" if self.col_block else ""
        text += f";split={self.split}" if self.split else ""
        return text + (f";stream={self.stream}" if self.stream else "")


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
    if flat_reductions(kernel) and column_access(kernel):
        return _column_options(kernel, device_limit)[:min(count, MAX_TOPN)]
    if flat_reductions(kernel) and _splits(kernel, device_limit):
        return _split_options(kernel, device_limit)[:min(count, MAX_TOPN)]
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
    if online_softmax_pairs(kernel.exprs):  # long rows leave L2 between sweeps: online first
        online = dataclasses.replace(default, online=1)
        options = [online, default] if cols > ONLINE_FIRST_COLS else [default, online]
        if softmax_store.applies(kernel):  # softmax itself: one read of x, one exp per element
            options.insert(0, dataclasses.replace(default, online=2))
        if softmax_store.streams(kernel):  # too big for the caches: no read of the output lines
            options.insert(0, dataclasses.replace(default, online=2, stream=1))
        default = options[0]
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


def _column_options(kernel: FusedKernel, device_limit: int) -> list[Tiling]:
    """Column reductions: blocks of outputs swept across the reduced rows, default first.

    The default gives each thread one block (its columns, rounded up to whole 8-float
    vectors, at most ``MAX_COL_BLOCK``); neighbours are narrower blocks (more items,
    smaller accumulator vectors) and the other thread counts.
    """
    outer = tuple(kernel.outer_shape)
    width, prefix_rows = outer[-1], math.prod(outer[:-1])
    numel = math.prod(outer) * kernel.inner_size
    block = _default_block_dim(numel, prefix_rows * -(-width // 8), device_limit)
    per_prefix = max(1, -(-block // prefix_rows))  # blocks per leading row so every thread has one
    default_cb = min(MAX_COL_BLOCK, -(-(-(-width // per_prefix)) // 8) * 8)
    cols = kernel.inner_size
    options = [Tiling(block, cols, 0, 0, col_block=default_cb)]
    options += [Tiling(block, cols, 0, 0, col_block=cb) for cb in (1024, 256, 64) if cb < default_cb]
    options += [Tiling(b, cols, 0, 0, col_block=min(MAX_COL_BLOCK, -(-width // 8) * 8 if b == 1 else default_cb))
                for b in (1, device_limit) if b != block]
    options.append(Tiling(block, cols, 0, 0))  # the row form, for PGO to compare
    return _unique(options)


def _splits(kernel: FusedKernel, device_limit: int) -> bool:
    rows = math.prod(kernel.outer_shape)
    return device_limit > 1 and rows < device_limit and kernel.inner_size >= SPLIT_MIN_COLS


def _split_options(kernel: FusedKernel, device_limit: int) -> list[Tiling]:
    """Few long rows: each row cut into segments across the threads, default first.

    Default: ``ceil(device_limit / rows)`` segments per row (one per thread); then four
    times that (balance on a busy host), then the whole-row form on one thread.
    """
    rows, cols = math.prod(kernel.outer_shape), kernel.inner_size
    base = -(-device_limit // rows)
    options = [Tiling(device_limit, cols, 0, 0, split=s, workspace=split_workspace_bytes(kernel, s))
               for s in (base, 4 * base)]
    options.append(Tiling(1, cols, 0, 0))
    return _unique(options)


def _unique(options: list[Tiling]) -> list[Tiling]:
    unique, seen = [], set()
    for option in options:
        if option.tiling_repr not in seen:
            seen.add(option.tiling_repr)
            unique.append(option)
    return unique
