"""CPU cost model: estimated microseconds of one launch of a candidate tiling.

It exists to rank and prune the tiling solver's space *before* compiling (the CostModel
pre-filter, ``--cost-model``): only the best ``--cost-model-ratio`` of the space is
compiled and PGO times those, so the space can grow without the build growing with it.
It ranks; it does not replace measurement.

The estimate is a roofline with launch overheads, ``max(memory, compute) + overhead``:

* memory: bytes the kernel must move (each input buffer read once, each output written
  once) over the bandwidth of ``block_dim`` threads. From memory: ~10 GB/s for one thread,
  each more thread adding ~60% of that up to a ~17 GB/s socket (round assumptions: a
  4096x4096 float32 copy into existing memory moved ~16 GB/s read + write at 1 thread on
  the 2-core build host). A launch that moves at most ``CACHE_RESIDENT_BYTES`` finds its
  inputs in L2/L3 (the kernel before it wrote them) and moves ~40 GB/s per thread:
  MobileNetV3-Small's squeeze-excite scales (150-400 KB) ran at 46-85 GB/s on 2 threads,
  ViT's 605 KB token copy at 105, ResNet-18's 3.2 MB max pool at 103 (Zen 3, PGO
  timings); the memory-side figure put them 5-9x too slow, so ``--tiny-kernel-us`` missed
  them. A strided (transposing) load without a blocked loop order wastes most of each
  64-byte line.
* compute: element operations (transcendentals ~8 ops: libm/libmvec calls) over
  ``lanes x 3 GHz x block_dim``; ``lanes`` is the SIMD width of the target ISA.
  In a ``--topn 10`` sweep of samples/transformer_block.py, ``simdlen = lanes`` beat
  the compiler's own width (``simdlen=0``) by up to ~30% on copies as on row kernels, so
  that factor scales the whole roofline term.
* overhead: ~1.5 us to fork and join an OpenMP team, ~30 ns per work item.
"""
from __future__ import annotations

import math

from aotpack.backends.cpu.tiling import Tiling
from aotpack.ir.kernel import FusedKernel, Load, Op, walk

#: Bytes per second one thread streams, and the socket's ceiling (assumed; module docstring).
THREAD_BANDWIDTH = 10e9
SOCKET_BANDWIDTH = 17e9
#: A launch moving at most this many bytes is served from the caches (L2, else the shared L3),
#: at this many bytes per second per thread, scaling linearly with the threads (assumed;
#: measured figures in the module docstring).
CACHE_RESIDENT_BYTES = 4 * 2**20
CACHE_THREAD_BANDWIDTH = 40e9
#: Each added thread's share of ``THREAD_BANDWIDTH`` once threads compete for memory.
EXTRA_THREAD_SHARE = 0.6
CLOCK_HZ = 3e9
FORK_JOIN_US = 1.5
WORK_ITEM_US = 0.03
CACHE_LINE = 64
#: Ops that compile to a libm/libmvec call, counted as this many element operations.
TRANSCENDENTAL_COST = 8
TRANSCENDENTALS = frozenset({"exp", "exp2", "expm1", "log", "log2", "log1p", "tanh", "erf", "sin",
                             "cos", "pow", "sigmoid", "silu", "gelu", "atan2", "fmod"})


def vector_bytes(features: list[str]) -> int:
    """SIMD register width in bytes of a target ISA's feature list (``target_isa``)."""
    if "avx512f" in features:
        return 64
    if "avx2" in features or "avx" in features:
        return 32
    return 16


def _itemsize(dtype) -> int:
    return dtype.itemsize if hasattr(dtype, "itemsize") else 4


def kernel_bytes(kernel: FusedKernel) -> int:
    """Bytes one launch must move: every input buffer read once, every output written once.

    A broadcast input counts its own size, not the domain's (it stays in cache).
    """
    numel = kernel.rows * kernel.inner_size
    read = sum(min(math.prod(b.shape), numel) * _itemsize(b.dtype) for b in kernel.inputs)
    written = sum(math.prod(o.shape) * _itemsize(o.dtype) for o in kernel.outputs)
    return read + written


def element_ops(kernel: FusedKernel) -> int:
    """Operations per domain element: each IR op node once, transcendentals weighted."""
    seen, ops = set(), 0
    for expr in kernel.exprs:
        for node in walk(expr):
            if id(node) in seen or not isinstance(node, Op):
                continue
            seen.add(id(node))
            ops += TRANSCENDENTAL_COST if node.name in TRANSCENDENTALS else 1
    return max(1, ops)


def _bandwidth(threads: int, nbytes: int) -> float:
    """Bytes per second ``threads`` threads move when a launch moves ``nbytes``."""
    if nbytes <= CACHE_RESIDENT_BYTES:
        return CACHE_THREAD_BANDWIDTH * threads
    return min(SOCKET_BANDWIDTH, THREAD_BANDWIDTH * (1 + EXTRA_THREAD_SHARE * (threads - 1)))


def _simd_factor(tiling: Tiling, lanes: int) -> float:
    if tiling.simdlen == lanes:
        return 1.0
    if tiling.simdlen == 0:
        return 1.1
    return 1.05


def _strided_factor(kernel: FusedKernel, tiling: Tiling) -> float:
    if not kernel.access.strided:
        return 1.0
    if tiling.row_block:
        return 1.2
    return CACHE_LINE / 16  # a strided row walk uses ~16 of each line's 64 bytes


def estimate_us(kernel: FusedKernel, tiling: Tiling, features: list[str]) -> float:
    """Estimated us of one launch of ``kernel`` with ``tiling`` on a CPU with ``features``.

    Formula and constants: the module docstring. Only the ranking of candidates of one
    kernel is meaningful, not the absolute value.
    """
    threads = max(1, tiling.block_dim)
    numel = kernel.rows * kernel.inner_size
    itemsize = max(_itemsize(b.dtype) for b in (*kernel.inputs, *kernel.outputs)) if kernel.inputs else 4
    lanes = max(1, vector_bytes(features) // itemsize)
    nbytes = kernel_bytes(kernel)
    memory_us = nbytes * _strided_factor(kernel, tiling) / _bandwidth(threads, nbytes) * 1e6
    compute_us = numel * element_ops(kernel) / (lanes * CLOCK_HZ * threads) * 1e6
    tile = max(1, tiling.inner_tile)
    rows_per_item = max(1, tiling.row_block)
    items = max(1, kernel.rows // rows_per_item) * -(-kernel.inner_size // tile)
    overhead_us = (FORK_JOIN_US if threads > 1 else 0.0) + WORK_ITEM_US * items / threads
    if tiling.chunk:  # interleaved slices: less locality per thread than one contiguous slice
        overhead_us += memory_us * (0.15 if tiling.chunk == 1 else 0.05)
    # The vector width shows in memory-bound kernels too (copies measured it most).
    return max(memory_us, compute_us) * _simd_factor(tiling, lanes) + overhead_us
