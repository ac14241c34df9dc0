"""The CPU Winograd convolution template: tilings (TopN solver) and rendering of
``template_kernels.WinogradConvKernel`` (3x3, stride 1, dilation 1).

The kernel (``templates/cpu_winograd_conv.cpp.j2``) computes F(2x2, 3x3) (Lavin & Gray,
"Fast Algorithms for Convolutional Neural Networks", 2016): 16 multiplies per 2x2 output
tile and channel pair where the direct convolution needs 36, so a 3x3 layer's GEMM work
drops 2.25x; the price is an input and an output transform (a few adds per element) and a
transformed weight 16/9 the dense one's size. Each image is first copied with its zero
border into the ``workspace``; then per block of ``tiles`` tiles (row-major over
the image, a multiple of ``nr`` so every register tile is whole) it writes the transformed input ``v[16][C_in][tiles]`` into the ``workspace``, runs 16 GEMMs with the
tiles in the vector lanes (a register tile of ``mr`` output channels x ``nr`` tiles: one
weight broadcast per channel and one vector load per ``kLanes`` tiles per input channel),
keeps their results ``m[16][C_out][tiles]`` in the workspace, and transforms them back
with the bias, the residual and the epilogue. A block's ``v`` and ``m`` are meant to stay in
L2 (``BLOCK_BYTES``). Threads take whole blocks of an image (each in its own part of the
workspace), so they wait on each other only after each image's copy and its last block:
with one barrier per stage and block, 2 threads ran a 64 x 56 x 56 layer only 1.7x faster
than one.

Knobs (the tiling): ``tiles``, ``mr``, ``nr``, ``block_dim``, ``vector_bytes``.
"""
from __future__ import annotations

from dataclasses import dataclass

from aotpack.backends.base import Candidate
from aotpack.backends.cpu.epilogue import scalar
from aotpack.backends.cpu.gemm_template import PARALLEL_MIN_FLOPS, VECTOR_BYTES, tile_width, wide_speedup, wide_suffix
from aotpack.config import MAX_TOPN
from aotpack.ir.template_kernels import WinogradConvKernel
from aotpack.ir.epilogues import CONV_EPILOGUES
from aotpack.backends.cpu.templating import render


@dataclass(frozen=True)
class WinogradTiling(Candidate):
    """Knobs of one Winograd template static kernel (see the module docstring).
    ``workspace``: the zero-bordered image (``padded_bytes``), then one block's ``v`` and
    ``m`` (``block_bytes``) per thread."""

    block_dim: int
    tiles: int
    mr: int
    nr: int
    workspace: int = 0
    vector_bytes: int = 32

    @property
    def tiling_repr(self) -> str:
        """``tiling_repr``: every knob, canonical (``vector_bytes`` only off its AVX2 default)."""
        return (f"cpu_winograd;block_dim={self.block_dim};tiles={self.tiles};mr={self.mr};nr={self.nr}"
                f"{wide_suffix(self.vector_bytes)}")


#: Register tiles (output channels, tiles) per vector width, the default first: accumulators
#: plus the tile vectors and one broadcast within the 32 (16) vector registers. Measured at
#: 1 / 2 threads (Zen 4, interleaved) on ResNet's 64 x 56 x 56, 128 x 28 x 28, 256 x 14 x 14
#: layers: 12 x 32 1697 / 867, 1642 / 928, 1753 / 960 us; 8 x 48 1684 / 937, 1682 / 1015,
#: 2352 / 1415 us (its 48-tile blocks pad 49 tiles to 96).
REGISTER_TILES = {64: ((12, 32), (8, 48)), 32: ((6, 16), (4, 24))}


def block_bytes(kernel: WinogradConvKernel, tiles: int) -> int:
    """Bytes of one block's ``v`` (16 x C_in rows) and ``m`` (16 x C_out rows) of ``tiles``
    floats, each of the 32 ``xi`` parts one cache line (16 floats) longer (the template's skew)."""
    return 16 * ((kernel.x_shape[1] + kernel.c_out) * tiles + 2 * 16) * 4


#: Bytes a block's ``v`` and ``m`` may take: bigger blocks cut fewer tile rows in two (a cut row
#: is transformed twice, by each block). ResNet's 64 x 56 x 56 layer at 1 thread (Zen 4, 1 MiB
#: L2): 32 tiles (256 KiB) 1517 us, 128 tiles (1 MiB) 1458 us.
BLOCK_BYTES = 512 * 1024


def padded_bytes(kernel: WinogradConvKernel) -> int:
    """Bytes of the zero-bordered image copy: C_in planes of (2 * tile rows + 2) x (2 * tile
    columns + 2) floats, plus two vectors of slack, in whole cache lines (the template's
    ``kPaddedFloats``)."""
    th, tw = kernel.tiles
    return -(-(kernel.x_shape[1] * (2 * th + 2) * (2 * tw + 2) + 2 * 16 + 2) // 16) * 16 * 4


def _default_tiles(kernel: WinogradConvKernel, nr: int, threads: int = 1) -> int:
    """Tiles per block, a multiple of ``nr``: the fewest blocks whose ``v`` and ``m`` fit
    ``BLOCK_BYTES`` (at least ``nr`` tiles each) and, where the image has the tiles for it, at
    least one block per thread (threads share an image's blocks), the tiles split evenly."""
    count = kernel.tiles[0] * kernel.tiles[1]
    fit = max(nr, BLOCK_BYTES // (16 * (kernel.x_shape[1] + kernel.c_out) * 4) // nr * nr)
    blocks = max(-(-count // fit), min(threads, count // nr))
    per_block = -(-count // blocks)
    return -(-per_block // nr) * nr


def make_tiling(kernel: WinogradConvKernel, block_dim: int, tiles: int, mr: int, nr: int,
                vector_bytes: int = VECTOR_BYTES) -> WinogradTiling:
    """The tiling with these knobs and the workspace it needs (``tiles`` rounded up to a
    multiple of ``nr``, capped at the image's tiles rounded so).

    Raises:
        ValueError: ``nr`` is not a whole number of vectors of ``vector_bytes``.
    """
    if nr % (vector_bytes // 4):
        raise ValueError(f"nr={nr} is not a multiple of the {vector_bytes // 4} lanes of a {vector_bytes}-byte vector")
    count = kernel.tiles[0] * kernel.tiles[1]
    tiles = -(-max(nr, min(tiles, count)) // nr) * nr
    return WinogradTiling(block_dim=block_dim, tiles=tiles, mr=mr, nr=nr,
                          workspace=padded_bytes(kernel) + block_dim * block_bytes(kernel, tiles),
                          vector_bytes=vector_bytes)


def solve(kernel: WinogradConvKernel, device_limit: int, count: int = MAX_TOPN,
          vector_bytes: int = VECTOR_BYTES) -> list[WinogradTiling]:
    """Candidate tilings, the default first, at most ``count``: the default register tile
    (``REGISTER_TILES``) on ``_default_tiles`` blocks with all ``device_limit`` threads (one
    under ``PARALLEL_MIN_FLOPS``); then the other thread count, the other register tile,
    blocks of twice and half the tiles."""
    threads = 1 if kernel.flops < PARALLEL_MIN_FLOPS else max(1, device_limit)
    vector_bytes = tile_width(vector_bytes)
    (mr, nr), (other_mr, other_nr) = REGISTER_TILES[vector_bytes]
    tiles = _default_tiles(kernel, nr, threads)
    options = [make_tiling(kernel, threads, tiles, mr, nr, vector_bytes)]
    if device_limit > 1:
        other_threads = device_limit if threads == 1 else 1
        options.append(make_tiling(kernel, other_threads, _default_tiles(kernel, nr, other_threads), mr, nr,
                                   vector_bytes))
    options.append(make_tiling(kernel, threads, _default_tiles(kernel, other_nr, threads), other_mr, other_nr,
                               vector_bytes))
    options.append(make_tiling(kernel, threads, tiles * 2, mr, nr, vector_bytes))
    options.append(make_tiling(kernel, threads, tiles // 2, mr, nr, vector_bytes))
    return list(dict.fromkeys(options))[:min(count, MAX_TOPN)]


def estimate_us(kernel: WinogradConvKernel, tiling: WinogradTiling, gflops: float = 80.0) -> float:
    """Guess in us: the 16 GEMMs (4/9 of the direct convolution's flops, padded to whole
    register tiles) at ``gflops`` per thread, the transforms at ~30 GB/s over ``v`` and ``m``
    (written and read in L2; 64 x 56 x 56 at 1 thread: 1414 us estimated, 1517 measured),
    an image's blocks shared among the threads, ~2 us for the parallel region."""
    n, c_in = kernel.x_shape[:2]
    blocks = -(-kernel.tiles[0] * kernel.tiles[1] // tiling.tiles)
    channels = -(-kernel.c_out // tiling.mr) * tiling.mr
    gemm = 2 * n * blocks * 16 * tiling.tiles * c_in * channels / (gflops * wide_speedup(tiling.vector_bytes) * 1e3)
    transforms = n * blocks * block_bytes(kernel, tiling.tiles) * 2 / 30e3
    region = 2.0 if tiling.block_dim > 1 else 0.0
    return (gemm + transforms) / min(tiling.block_dim, blocks) + region


def render_kernel(kernel: WinogradConvKernel, tiling: WinogradTiling) -> str:
    """C++ source of ``kernel`` compiled with ``tiling``."""
    (n, c_in, h, w), (oh, ow), (ph, pw) = kernel.x_shape, kernel.out_hw, kernel.padding
    epilogue = CONV_EPILOGUES[kernel.epilogue]
    return render("cpu_winograd_conv.cpp.j2", tiling_repr=tiling.tiling_repr, batch=n, c_in=c_in, h=h, w=w,
                  n=kernel.c_out, oh=oh, ow=ow, ph=ph, pw=pw, block_tiles=tiling.tiles, mr=tiling.mr, nr=tiling.nr,
                  vector_bytes=tiling.vector_bytes, block_dim=tiling.block_dim, workspace=tiling.workspace,
                  x_offset=kernel.x_offset, has_bias=kernel.has_bias,
                  has_residual=epilogue.reads_residual, residual_offset=kernel.residual_offset,
                  epilogue_expr=scalar(epilogue),
                  epilogue_text=f"{epilogue.text} where y = conv3x3(x, W)"
                                f"{' + bias' if kernel.has_bias else ''}",
                  optional_helpers=[])
