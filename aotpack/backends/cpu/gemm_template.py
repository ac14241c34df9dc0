"""The CPU GEMM template: tilings (TopN solver) and rendering of ``kernel_ir.GemmKernel``.

The kernel (``templates/cpu_gemm.cpp.j2``) is the classic register-blocked GEMM of
BLIS/GotoBLAS: a register tile of up to ``mr`` rows x one weight panel (16 columns) of
accumulators, fed by one broadcast of ``a`` and one or two vector loads of the packed
weight per k; around it, k blocks of ``kc`` (the panel's k block stays in L1-L2 while
the rows of a group reuse it) and row groups of ``mc`` rows (their k block of ``a``
stays in L2 across the panels). The M rows are split into ``ceil(M / mr)`` tiles of
balanced heights (``tile_heights``), so no short tail tile waits on the FMA latency.
Work items are (row group, panel, tile); ``block_dim`` OpenMP threads take chunks of
whole panels as they come free. The weight is packed at build time, so a launch only
streams ``a`` and the panels.

Knobs (the tiling): ``mr`` (6: 12 accumulator vectors + 2 weight vectors + 1 broadcast
fill the 16 AVX2 registers; 4 leaves room), ``kc``, ``mc``, ``block_dim``.
"""
from __future__ import annotations

from dataclasses import dataclass

from aotpack.backends.base import Candidate
from aotpack.config import MAX_TOPN
from aotpack.kernel_ir import GemmKernel
from aotpack.render import render

#: Bytes of one vector register the template computes in where the target has AVX (the
#: template falls back to 16, SSE, without it).
VECTOR_BYTES = 32
#: Bytes of a panel's k block up to which the whole K is one block. Measured here (Zen 3,
#: 32 KiB L1d, 512 KiB L2, one thread, interleaved): the whole K was fastest at every shape
#: tried, the block streaming from L2 well: 32x2048x512 2% / 11% ahead of kc 512 / 256,
#: 128x1024x256 2% / 3%, 512x1024x256 2% / 3%. PGO has a shorter kc too.
WHOLE_K_BLOCK_BYTES = 128 * 1024
#: The k block of a longer K (a 32 KiB panel block).
LONG_K_BLOCK = 512
#: L2 bytes a row group's k block of ``a`` may take (half of a 512 KiB L2; the group size
#: mattered within 1% at 512x256x768, one group of 32 rows x 2048 ran 4.5% ahead of two).
L2_BLOCK_BYTES = 256 * 1024
#: Below this many flops one thread is the default (a parallel region costs ~1-2 us).
PARALLEL_MIN_FLOPS = 2_000_000


@dataclass(frozen=True)
class GemmTiling(Candidate):
    """Knobs of one GEMM template static kernel (see the module docstring)."""

    block_dim: int
    mr: int
    kc: int
    mc: int
    workspace: int = 0

    @property
    def tiling_repr(self) -> str:
        """``tiling_repr``: every knob, canonical."""
        return f"cpu_gemm;block_dim={self.block_dim};mr={self.mr};kc={self.kc};mc={self.mc}"


def _default_kc(kernel: GemmKernel) -> int:
    """The whole K when a panel's K x 16 floats fit ``WHOLE_K_BLOCK_BYTES``, else ``LONG_K_BLOCK``."""
    return kernel.k if kernel.k * kernel.panel * 4 <= WHOLE_K_BLOCK_BYTES else LONG_K_BLOCK


def _default_mc(kernel: GemmKernel, kc: int, mr: int) -> int:
    """Rows per row group, a multiple of ``mr``: the fewest groups whose k block of ``a``
    fits ``L2_BLOCK_BYTES``, their ``ceil(M / mr)`` row tiles split evenly among them (512
    rows at kc 256: two groups of 43 tiles, not 42 + 42 + 2)."""
    tiles = -(-kernel.m // mr)
    rows_that_fit = max(mr, L2_BLOCK_BYTES // (kc * 4))
    groups = -(-kernel.m // rows_that_fit)
    return -(-tiles // groups) * mr


def _tiling(kernel: GemmKernel, block_dim: int, mr: int, kc: int) -> GemmTiling:
    return GemmTiling(block_dim=block_dim, mr=mr, kc=kc, mc=_default_mc(kernel, kc, mr))


def solve(kernel: GemmKernel, device_limit: int, count: int = MAX_TOPN) -> list[GemmTiling]:
    """Candidate tilings of ``kernel``, the heuristic default first, at most ``count``.

    The default: ``mr`` 6, ``kc`` from ``_default_kc``, ``mc`` from ``_default_mc``, all
    ``device_limit`` threads unless the GEMM is under ``PARALLEL_MIN_FLOPS``. Then one
    knob at a time: the other thread count, ``mr`` 4, the whole K or a shorter k block.
    """
    threads = 1 if kernel.flops < PARALLEL_MIN_FLOPS else max(1, device_limit)
    kc = _default_kc(kernel)
    options = [_tiling(kernel, threads, 6, kc)]
    if device_limit > 1:
        options.append(_tiling(kernel, device_limit if threads == 1 else 1, 6, kc))
    options.append(_tiling(kernel, threads, 4, kc))
    other_kc = kernel.k if kc < kernel.k else (kc // 2 if kc >= 128 else 0)
    if other_kc:
        options.append(_tiling(kernel, threads, 6, other_kc))
    unique = list(dict.fromkeys(options))
    return unique[:min(count, MAX_TOPN)]


#: Rows below which a register tile is bound by the FMA latency, not the FMA ports: a row
#: takes two FMAs per k (two vectors of the panel) and two ports x 4 cycles keep 8 FMAs in
#: flight (Zen 3, Haswell on).
LATENCY_BOUND_ROWS = 4


def tile_heights(m: int, mr: int) -> list[int]:
    """Rows of each register tile the template splits ``m`` rows into: ``ceil(m / mr)``
    tiles whose heights differ by at most one, the taller first (the template's
    ``kTiles``/``kRows``/``kTallTiles``)."""
    tiles = -(-m // mr)
    rows, tall = divmod(m, tiles)
    return [rows + 1] * tall + [rows] * (tiles - tall)


def estimate_us(kernel: GemmKernel, tiling: GemmTiling, gflops: float = 90.0) -> float:
    """Guess in us: flops at ``gflops`` per thread (what the template ran at on one thread
    here, `benchmarks/gemm_template.py` and an interleaved C++ harness: 90-99 GFLOPS at the
    sample shapes, Zen 3 at 104 GFLOPS peak), a tile under ``LATENCY_BOUND_ROWS`` rows
    costing as many, plus ~2 us per parallel region."""
    rows = sum(max(h, LATENCY_BOUND_ROWS) for h in tile_heights(kernel.m, tiling.mr)) / kernel.m
    compute = kernel.flops * rows / (gflops * 1e3 * tiling.block_dim)
    return compute + (2.0 if tiling.block_dim > 1 else 0.0)


_EPILOGUE_CPP = {
    "none": "y",
    "add": "y",  # the residual is added to y as it is read
    "relu": "ap_relu(y)",
    "gelu": "(y * 0.5f) * (gemm_erf(y * 0.70710678118654752f) + 1.0f)",  # the template's inline erf
    "tanh": "ap::tanh(y)",
    "sigmoid": "ap_sigmoid(y)",
    "swish": "y * ap_sigmoid(y)",
    # clamp(y + 3, 0, 6) as eager decomposes it (NaN stays NaN)
    "hardswish": "y * ap_min(ap_max(y + 3.0f, 0.0f), 6.0f) / 6.0f",
    "hardsigmoid": "ap_min(ap_max(y + 3.0f, 0.0f), 6.0f) / 6.0f",
}


def render_kernel(kernel: GemmKernel, tiling: GemmTiling) -> str:
    """C++ source of ``kernel`` compiled with ``tiling``."""
    return render("cpu_gemm.cpp.j2", tiling_repr=tiling.tiling_repr, m=kernel.m, n=kernel.n, k=kernel.k,
                  panel=kernel.panel, panels=kernel.panels, vector_bytes=VECTOR_BYTES, mr=tiling.mr,
                  kc=min(tiling.kc, kernel.k), mc=tiling.mc, block_dim=tiling.block_dim,
                  a_offset=kernel.a_offset, a_row_stride=kernel.a_row_stride, has_bias=kernel.has_bias,
                  has_residual=kernel.epilogue == "add", residual_offset=kernel.residual_offset,
                  residual_row_stride=kernel.residual_row_stride, epilogue=kernel.epilogue,
                  epilogue_expr=_EPILOGUE_CPP[kernel.epilogue],
                  epilogue_text=f"{kernel.epilogue}(a @ W^T{' + bias' if kernel.has_bias else ''})",
                  optional_helpers=[])
