"""The CPU GEMM template: tilings (TopN solver) and rendering of ``kernel_ir.GemmKernel``.

The kernel (``templates/cpu_gemm.cpp.j2``) is the classic register-blocked GEMM of
BLIS/GotoBLAS: a register tile of ``mr`` rows x one weight panel (16 columns) of
accumulators, fed by one broadcast of ``a`` and one or two vector loads of the packed
weight per k; around it, k blocks of ``kc`` (the panel's k block stays in L1 while
the rows of a group reuse it) and row groups of ``mc`` rows (their k block of ``a``
stays in L2 across the panels). Work items are (row group, panel, tile), split
statically over ``block_dim`` OpenMP threads. The weight is packed at build time, so
a launch only streams ``a`` and the panels.

Knobs (the tiling): ``mr`` (6: 12 accumulator vectors + 2 weight vectors + 1 broadcast
fill the 16 AVX2 registers; 4 leaves room), ``kc``, ``mc``, ``block_dim``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from aotpack.backends.base import Candidate
from aotpack.config import MAX_TOPN
from aotpack.kernel_ir import GemmKernel
from aotpack.render import render

#: Bytes of one vector register the template computes in where the target has AVX (the
#: template falls back to 16, SSE, without it).
VECTOR_BYTES = 32
#: Bytes of a panel's k block below which the whole K is one block. Measured here (Zen 3,
#: 32 KiB L1d, 512 KiB L2): 32x512x2048 with kc = 512 (32 KiB) ran 6-16% faster than 256 in
#: one interleaved comparison and within the noise of it in another; 32x2048x512 was
#: fastest with the whole K. The block streams from L2 well; PGO has the other kc too.
L1_BLOCK_BYTES = 64 * 1024
#: The k block of a longer K (a 32 KiB panel block).
LONG_K_BLOCK = 512
#: L2 bytes a row group's k block of ``a`` may take (a quarter of a 512 KiB-1 MiB L2).
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
    """The whole K when a panel's K x 16 floats fit ``L1_BLOCK_BYTES``, else ``LONG_K_BLOCK``."""
    return kernel.k if kernel.k * kernel.panel * 4 <= L1_BLOCK_BYTES else LONG_K_BLOCK


def _default_mc(kernel: GemmKernel, kc: int, mr: int) -> int:
    """All rows when their k block fits ``L2_BLOCK_BYTES``, else the most tiles that fit."""
    rows = max(mr, L2_BLOCK_BYTES // (kc * 4) // mr * mr)
    return min(rows, -(-kernel.m // mr) * mr)


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


def estimate_us(kernel: GemmKernel, tiling: GemmTiling, gflops: float = 65.0) -> float:
    """Guess in us: flops at ``gflops`` per thread (what the template ran at on one thread
    here, `benchmarks/gemm_template.py`: 65 GFLOPS at 32x512x2048), the register tile's
    wasted rows counted, plus ~2 us per parallel region."""
    tiles = math.ceil(kernel.m / tiling.mr) * tiling.mr / kernel.m
    compute = kernel.flops * tiles / (gflops * 1e3 * tiling.block_dim)
    return compute + (2.0 if tiling.block_dim > 1 else 0.0)


_EPILOGUE_CPP = {
    "none": "y",
    "add": "y",  # the residual is added to y as it is read
    "relu": "ap_relu(y)",
    "gelu": "(y * 0.5f) * (ap::erf(y * 0.70710678118654752f) + 1.0f)",
    "tanh": "ap::tanh(y)",
    "sigmoid": "ap_sigmoid(y)",
    "swish": "y * ap_sigmoid(y)",
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
