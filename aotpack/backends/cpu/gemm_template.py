"""The CPU GEMM template: tilings (TopN solver) and rendering of ``template_kernels.GemmKernel``.

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
from aotpack.ir.template_kernels import GemmKernel
from aotpack.backends.cpu.epilogue import GEMM_FORMS, scalar
from aotpack.backends.cpu.templating import render
from aotpack.ir.epilogues import GEMM_EPILOGUES

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


#: (default mr, the other mr) of a 16-column tile (one panel) per vector width. AVX2: 6
#: rows x 2 vectors = 12 accumulators + 2 weight vectors + 1 broadcast of the 16
#: registers. AVX-512 (one vector per panel, 32 registers): 14 rows; measured here (Zen 5,
#: 1 thread, interleaved) at 32x512x2048 / 128x256x768 / 196x384x1536: 350 / 277 / 1185 us
#: at mr 14, 384 / 292 / 1238 at mr 8, 626 / 444 / 2112 for the AVX2 kernel, oneDNN 361 /
#: 258 / 1075.
ROW_CHOICES = {32: (6, 4), 64: (14, 8)}
#: ((mr, nr) default, (mr, nr) other) per vector width, nr the tile's columns (16 or 32:
#: one or two panels). AVX-512's default is 10 x 32 (20 accumulators; per k 10 broadcasts
#: and 2 weight loads feed 20 FMAs, where 14 x 16 needs 15 loads for 14): measured as
#: above at 32x512x2048 / 128x256x768 / 196x384x1536 / 49x4608x512: 287 / 225 / 1037 /
#: 1044 us against 317 / 257 / 1182 / 1186 at 14 x 16 and oneDNN's 340 / 241 / 1063 / 1098.
TILE_CHOICES = {32: ((6, 16), (4, 16)), 64: ((10, 32), (14, 16))}


def tile_width(vector_bytes: int) -> int:
    """The vector width a template tiling names for a target of ``vector_bytes``: 64 with
    AVX-512, else 32 (the template itself falls back to SSE where the target lacks AVX)."""
    return 64 if vector_bytes >= 64 else VECTOR_BYTES


def row_choices(vector_bytes: int) -> tuple[int, int]:
    """(default ``mr``, the other ``mr``) of a register tile computing in ``vector_bytes``
    vectors."""
    return ROW_CHOICES[tile_width(vector_bytes)]


def tile_choices(vector_bytes: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """((mr, nr) of the default register tile, (mr, nr) of the other) at ``vector_bytes``."""
    return TILE_CHOICES[tile_width(vector_bytes)]


def wide_suffix(vector_bytes: int) -> str:
    """The ``tiling_repr`` part of the vector-width knob: none at the AVX2 default (so the
    AVX2 kernels keep their ``kernel_key``s), ``;vector_bytes=64`` for AVX-512."""
    return "" if vector_bytes == VECTOR_BYTES else f";vector_bytes={vector_bytes}"


@dataclass(frozen=True)
class GemmTiling(Candidate):
    """Knobs of one GEMM template static kernel (see the module docstring)."""

    block_dim: int
    mr: int
    kc: int
    mc: int
    workspace: int = 0
    vector_bytes: int = 32
    nr: int = 16

    @property
    def tiling_repr(self) -> str:
        """``tiling_repr``: every knob, canonical (``nr`` and ``vector_bytes`` only off their
        AVX2 defaults, so those kernels keep their ``kernel_key``s)."""
        return (f"cpu_gemm;block_dim={self.block_dim};mr={self.mr};kc={self.kc};mc={self.mc}"
                f"{wide_suffix(self.vector_bytes)}{'' if self.nr == 16 else f';nr={self.nr}'}")


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


def _tiling(kernel: GemmKernel, block_dim: int, tile: tuple[int, int], kc: int, vector_bytes: int) -> GemmTiling:
    mr, nr = tile
    return GemmTiling(block_dim=block_dim, mr=mr, kc=kc, mc=_default_mc(kernel, kc, mr), vector_bytes=vector_bytes,
                      nr=nr if kernel.panels > 1 else 16)


def solve(kernel: GemmKernel, device_limit: int, count: int = MAX_TOPN,
          vector_bytes: int = VECTOR_BYTES) -> list[GemmTiling]:
    """Candidate tilings of ``kernel``, the heuristic default first, at most ``count``.

    The default: the register tile (``mr`` x ``nr``) from ``tile_choices`` (6 x 16 AVX2,
    10 x 32 AVX-512 at ``vector_bytes`` 64), ``kc`` from ``_default_kc``, ``mc`` from
    ``_default_mc``, all ``device_limit`` threads unless the GEMM is under
    ``PARALLEL_MIN_FLOPS``. Then one knob at a time: the other thread count, the other
    tile (4 x 16 / 14 x 16), the whole K or a shorter k block.
    """
    threads = 1 if kernel.flops < PARALLEL_MIN_FLOPS else max(1, device_limit)
    kc = _default_kc(kernel)
    vector_bytes = tile_width(vector_bytes)
    tile, other_tile = tile_choices(vector_bytes)
    options = [_tiling(kernel, threads, tile, kc, vector_bytes)]
    if device_limit > 1:
        options.append(_tiling(kernel, device_limit if threads == 1 else 1, tile, kc, vector_bytes))
    options.append(_tiling(kernel, threads, other_tile, kc, vector_bytes))
    other_kc = kernel.k if kc < kernel.k else (kc // 2 if kc >= 128 else 0)
    if other_kc:
        options.append(_tiling(kernel, threads, tile, other_kc, vector_bytes))
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
    rows = latency_rows(kernel.m, tiling.mr, tiling.vector_bytes, tiling.nr)
    compute = kernel.flops * rows / (gflops * wide_speedup(tiling.vector_bytes) * 1e3 * tiling.block_dim)
    return compute + (2.0 if tiling.block_dim > 1 else 0.0)


def latency_rows(m: int, mr: int, vector_bytes: int, nr: int = 16) -> float:
    """Rows a tile costs per row it computes: a tile under the latency bound costs as many
    as the bound (``LATENCY_BOUND_ROWS`` at two vectors per row, as AVX2's 16 columns or
    AVX-512's 32; twice as many rows at one vector per row, AVX-512's 16 columns)."""
    vectors = max(1, nr * 4 // tile_width(vector_bytes))
    bound = LATENCY_BOUND_ROWS * 2 // min(vectors, 2)
    return sum(max(h, bound) for h in tile_heights(m, mr)) / m


def wide_speedup(vector_bytes: int) -> float:
    """The template's speed at ``vector_bytes`` over AVX2 (1.6x measured at AVX-512 on Zen 5,
    the numbers at ``ROW_CHOICES``)."""
    return 1.6 if vector_bytes >= 64 else 1.0


def render_kernel(kernel: GemmKernel, tiling: GemmTiling) -> str:
    """C++ source of ``kernel`` compiled with ``tiling``."""
    epilogue = GEMM_EPILOGUES[kernel.epilogue]
    return render("cpu_gemm.cpp.j2", tiling_repr=tiling.tiling_repr, m=kernel.m, n=kernel.n, k=kernel.k,
                  panel=kernel.panel, panels=kernel.panels, vector_bytes=tiling.vector_bytes, mr=tiling.mr,
                  kc=min(tiling.kc, kernel.k), mc=tiling.mc, block_dim=tiling.block_dim, nr=tiling.nr,
                  a_offset=kernel.a_offset, a_row_stride=kernel.a_row_stride, has_bias=kernel.has_bias,
                  has_residual=epilogue.reads_residual, residual_offset=kernel.residual_offset,
                  residual_row_stride=kernel.residual_row_stride, epilogue=kernel.epilogue,
                  epilogue_expr=scalar(epilogue, forms=GEMM_FORMS),
                  epilogue_text=f"{kernel.epilogue}(a @ W^T{' + bias' if kernel.has_bias else ''})",
                  optional_helpers=[])
