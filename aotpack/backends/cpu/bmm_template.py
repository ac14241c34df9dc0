"""The CPU batched GEMM template: tilings (TopN solver) and rendering of ``template_kernels.BmmKernel``.

The kernel (``templates/cpu_bmm.cpp.j2``) is the register-blocked GEMM of the linear
template (``gemm_template``: up to ``mr`` rows x one panel of 16 columns of accumulators,
one broadcast of ``a`` and one or two vector loads of ``b`` per k, M split into tiles of
balanced heights) for two runtime operands. ``b`` cannot be packed at build time, so a
work item (batch, row group, panel) either packs its panel of ``b`` into the thread's
workspace slot (``[K][16]`` floats, ``pack_b``), or, where ``b``'s rows are contiguous
along N (``weights @ v``), reads a whole panel in place, its k rows ``b_strides[-2]``
apart. ``q @ k^T`` reads ``k`` along K: it is always packed (a transposing read). The
whole K is one block: attention's K (the head dimension, or the sequence) keeps a panel
in L1-L2. ``block_dim`` OpenMP threads take chunks of items as they come free.

Knobs (the tiling): ``block_dim``, ``mr`` (6 or 4), ``mc`` (rows per row group),
``pack_b``; ``workspace`` is ``block_dim`` slots of ``K x 16`` floats (64-byte aligned)
where any panel is packed, else 0.
"""
from __future__ import annotations

from dataclasses import dataclass

from aotpack.backends.base import Candidate
from aotpack.backends.cpu.gemm_template import (L2_BLOCK_BYTES, PARALLEL_MIN_FLOPS,
                                                VECTOR_BYTES, latency_rows, row_choices, tile_width, wide_speedup,
                                                wide_suffix)
from aotpack.config import MAX_TOPN
from aotpack.ir.template_kernels import BmmKernel
from aotpack.backends.cpu.templating import render

#: Bytes a thread's panel slot is rounded up to (the workspace alignment).
SLOT_ALIGN = 64


@dataclass(frozen=True)
class BmmTiling(Candidate):
    """Knobs of one batched GEMM template static kernel (see the module docstring)."""

    block_dim: int
    mr: int
    mc: int
    pack_b: bool
    workspace: int = 0
    vector_bytes: int = 32

    @property
    def tiling_repr(self) -> str:
        """``tiling_repr``: every knob, canonical."""
        return (f"cpu_bmm;block_dim={self.block_dim};mr={self.mr};mc={self.mc};"
                f"b={'packed' if self.pack_b else 'direct'}{wide_suffix(self.vector_bytes)}")


def slot_bytes(kernel: BmmKernel) -> int:
    """Bytes of one thread's panel slot: ``K x panel`` floats, rounded up to ``SLOT_ALIGN``."""
    return -(-kernel.k * kernel.panel * 4 // SLOT_ALIGN) * SLOT_ALIGN


def direct_b(kernel: BmmKernel) -> bool:
    """Whether ``b``'s panels can be read in place (unit stride along N)."""
    return kernel.b_strides[-1] == 1


def _mc(kernel: BmmKernel, mr: int) -> int:
    """Rows per row group, a multiple of ``mr``: the fewest groups whose rows of ``a``
    (the whole K) fit ``L2_BLOCK_BYTES``, the row tiles split evenly among them."""
    tiles = -(-kernel.m // mr)
    rows_that_fit = max(mr, L2_BLOCK_BYTES // (kernel.k * 4))
    groups = -(-kernel.m // rows_that_fit)
    return -(-tiles // groups) * mr


def tiling(kernel: BmmKernel, block_dim: int, mr: int, pack_b: bool, vector_bytes: int = VECTOR_BYTES) -> BmmTiling:
    """The tiling with these knobs, ``mc`` from ``_mc`` and the workspace it needs.

    Raises:
        ValueError: ``pack_b`` False where ``b`` is not unit-stride along N.
    """
    if not (pack_b or direct_b(kernel)):
        raise ValueError(f"{kernel.name}: b (strides {list(kernel.b_strides)}) cannot be read in place")
    packs = pack_b or kernel.n % kernel.panel != 0
    return BmmTiling(block_dim=block_dim, mr=mr, mc=_mc(kernel, mr), pack_b=pack_b,
                     workspace=block_dim * slot_bytes(kernel) if packs else 0, vector_bytes=vector_bytes)


def solve(kernel: BmmKernel, device_limit: int, count: int = MAX_TOPN,
          vector_bytes: int = VECTOR_BYTES) -> list[BmmTiling]:
    """Candidate tilings of ``kernel``, the heuristic default first, at most ``count``.

    The default: ``mr`` from ``row_choices`` (6 AVX2, 14 AVX-512 at ``vector_bytes`` 64),
    ``b`` read in place where it can be, all ``device_limit`` threads unless the GEMM is
    under ``PARALLEL_MIN_FLOPS``. Then one knob at a time: the other thread count, ``b``
    packed, the other ``mr``.
    """
    threads = 1 if kernel.flops < PARALLEL_MIN_FLOPS else max(1, device_limit)
    pack = not direct_b(kernel)
    vector_bytes = tile_width(vector_bytes)
    mr, other_mr = row_choices(vector_bytes)
    options = [tiling(kernel, threads, mr, pack, vector_bytes)]
    if device_limit > 1:
        options.append(tiling(kernel, device_limit if threads == 1 else 1, mr, pack, vector_bytes))
    if not pack:
        options.append(tiling(kernel, threads, mr, True, vector_bytes))
    options.append(tiling(kernel, threads, other_mr, pack, vector_bytes))
    unique = list(dict.fromkeys(options))
    return unique[:min(count, MAX_TOPN)]


def estimate_us(kernel: BmmKernel, candidate: BmmTiling, gflops: float = 90.0) -> float:
    """Guess in us, as ``gemm_template.estimate_us``: flops at ``gflops`` per thread, a
    tile under the latency bound (``latency_rows``) costing as many, ~2 us per parallel region."""
    rows = latency_rows(kernel.m, candidate.mr, candidate.vector_bytes)
    compute = kernel.flops * rows / (gflops * wide_speedup(candidate.vector_bytes) * 1e3 * candidate.block_dim)
    return compute + (2.0 if candidate.block_dim > 1 else 0.0)


def _batch_expr(shape: tuple, strides: tuple) -> str:
    """C++ offset of batch index ``bi`` (row-major over ``shape``) at ``strides``."""
    if len(shape) == 1:
        return f"bi * {strides[0]}"
    inner = shape[1]
    return f"(bi / {inner}) * {strides[0]} + (bi % {inner}) * {strides[1]}"


def render_kernel(kernel: BmmKernel, candidate: BmmTiling) -> str:
    """C++ source of ``kernel`` compiled with ``candidate``."""
    return render("cpu_bmm.cpp.j2", tiling_repr=candidate.tiling_repr, batch_shape=kernel.batch_shape,
                  batch=kernel.batch, m=kernel.m, n=kernel.n, k=kernel.k, panel=kernel.panel,
                  panels=kernel.panels, vector_bytes=candidate.vector_bytes, mr=candidate.mr, mc=candidate.mc,
                  block_dim=candidate.block_dim, pack_b=candidate.pack_b, workspace=candidate.workspace,
                  slot_floats=slot_bytes(kernel) // 4, a_offset=kernel.a_offset, a_strides=kernel.a_strides,
                  b_offset=kernel.b_offset, b_strides=kernel.b_strides, b_input=kernel.b_input,
                  outputs_arg=len(kernel.inputs),
                  a_batch_expr=_batch_expr(kernel.batch_shape, kernel.a_strides[:-2]),
                  b_batch_expr=_batch_expr(kernel.batch_shape, kernel.b_strides[:-2]))
