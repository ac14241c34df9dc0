"""This machine's roofline for the benchmark: peak fp32 and bf16 FMA rate and the FLOPs a
model does, so each model's achieved GFLOP/s can be read against what the cores can do.

The peak is measured, not looked up: a register-resident loop of independent vector FMA
chains (AVX-512 ``vfmadd231ps``, or AVX2 where AVX-512 is missing; ``vdpbf16ps`` for bf16
where the CPU has AVX512_BF16) compiled here with g++ and run on ``threads`` OpenMP
threads; the best of a few repeats. FLOPs per model come from
``torch.utils.flop_counter`` (a multiply-add counts 2; only matmuls, convolutions and
attention are counted, as is usual for "model FLOPs").

    python benchmarks/roofline.py            # prints the peaks at 1 and all cores
"""
from __future__ import annotations

import ctypes
import functools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

# Sixteen independent accumulators: enough chains to cover FMA latency x issue width on
# current x86 cores (4-5 cycles x 2 pipes), so the loop runs at the FMA throughput.
_CHAINS = 16  # X(0) ... X(15) below
_SOURCE = r"""
#include <immintrin.h>
#include <omp.h>

#define CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)

extern "C" double fp32_fma_loop(long iters, int threads) {
  double total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
#ifdef __AVX512F__
    typedef __m512 V;
#define SET1 _mm512_set1_ps
#define FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define ADD _mm512_add_ps
#define SUM _mm512_reduce_add_ps
#else
    typedef __m256 V;
#define SET1 _mm256_set1_ps
#define FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define ADD _mm256_add_ps
    auto SUM = [](__m256 v) { float f[8]; _mm256_storeu_ps(f, v); float s = 0; for (float x : f) s += x; return s; };
#endif
    const V x = SET1(0.999999f), y = SET1(1e-7f);
#define DECL(i) V a##i = SET1(1.0f + i * 1e-3f);
    CHAINS(DECL)
    for (long n = 0; n < iters; ++n) {
#define STEP(i) a##i = FMA(a##i, x, y);
      CHAINS(STEP)
    }
    V s = a0;
#define ACC(i) s = ADD(s, a##i);
    CHAINS(ACC)
    total += SUM(s);
  }
  return total;
}

#ifdef __AVX512BF16__
extern "C" double bf16_dot_loop(long iters, int threads) {
  double total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80);  // bf16 1.0
    const __m512bh y = (__m512bh)_mm512_set1_epi16(0x3380);  // bf16 ~6e-8
#define DECLB(i) __m512 b##i = _mm512_set1_ps(1.0f + i * 1e-3f);
    CHAINS(DECLB)
    for (long n = 0; n < iters; ++n) {
#define STEPB(i) b##i = _mm512_dpbf16_ps(b##i, x, y);
      CHAINS(STEPB)
    }
    __m512 s = b0;
#define ACCB(i) s = _mm512_add_ps(s, b##i);
    CHAINS(ACCB)
    total += _mm512_reduce_add_ps(s);
  }
  return total;
}
#endif
"""


def cpu_flags() -> set[str]:
    """The CPU feature flags of /proc/cpuinfo (empty where it does not exist)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@functools.cache
def _library() -> tuple[ctypes.CDLL, int, int]:
    """The compiled probe, its fp32 lanes per FMA and bf16 pairs per dot (0: no bf16)."""
    flags = cpu_flags()
    isa = ["-mavx512f", "-mfma"] if "avx512f" in flags else ["-mavx2", "-mfma"]
    bf16 = "avx512_bf16" in flags and "avx512f" in flags
    if bf16:
        isa.append("-mavx512bf16")
    with tempfile.TemporaryDirectory(prefix="aotpack-roofline-") as work:
        source, library = Path(work) / "peak.cpp", Path(work) / "peak.so"
        source.write_text(_SOURCE)
        subprocess.run([os.environ.get("CXX", "g++"), "-O2", "-fopenmp", "-shared", "-fPIC", *isa,
                        str(source), "-o", str(library)], check=True, capture_output=True, text=True)
        lib = ctypes.CDLL(str(library))  # stays mapped after the file is removed
    lib.fp32_fma_loop.restype = ctypes.c_double
    lib.fp32_fma_loop.argtypes = [ctypes.c_long, ctypes.c_int]
    if bf16:
        lib.bf16_dot_loop.restype = ctypes.c_double
        lib.bf16_dot_loop.argtypes = [ctypes.c_long, ctypes.c_int]
    return lib, 16 if "avx512f" in flags else 8, 32 if bf16 else 0


def _best_rate(function, flops_per_iter: float, threads: int, seconds: float, repeats: int) -> float:
    """Best GFLOP/s of ``function(iters, threads)`` over ``repeats`` runs of ~``seconds``."""
    iters = 1 << 16
    while True:  # size the run to ~seconds
        start = time.perf_counter()
        function(iters, threads)
        took = time.perf_counter() - start
        if took > seconds / 4:
            break
        iters *= 4
    iters = max(1, int(iters * seconds / took))
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        function(iters, threads)
        best = max(best, iters * flops_per_iter * threads / (time.perf_counter() - start) / 1e9)
    return best


def peak_gflops(threads: int, dtype: str = "fp32", seconds: float = 0.2, repeats: int = 5) -> float | None:
    """Measured peak of ``threads`` cores in GFLOP/s (1e9 FLOP/s, a multiply-add = 2) for
    ``dtype`` ``"fp32"`` (vector FMA) or ``"bf16"`` (``vdpbf16ps``: bf16 products summed
    in fp32); None for bf16 on a CPU without AVX512_BF16. Raises
    subprocess.CalledProcessError when g++ cannot build the probe."""
    lib, lanes, pairs = _library()
    if dtype == "fp32":
        return _best_rate(lib.fp32_fma_loop, 2.0 * lanes * _CHAINS, threads, seconds, repeats)
    if dtype == "bf16":
        return _best_rate(lib.bf16_dot_loop, 2.0 * pairs * _CHAINS, threads, seconds, repeats) if pairs else None
    raise ValueError(f"dtype must be 'fp32' or 'bf16', got {dtype!r}")


def model_flops(module: torch.nn.Module, inputs: tuple) -> int:
    """FLOPs of one eager forward of ``module`` on ``inputs`` (torch.utils.flop_counter:
    matmuls, convolutions and attention; a multiply-add = 2)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        module(*inputs)
    return int(counter.get_total_flops())


def main() -> int:
    counts = sorted({1, os.cpu_count() or 1})
    for dtype in ("fp32", "bf16"):
        for threads in counts:
            rate = peak_gflops(threads, dtype)
            text = "not supported by this CPU" if rate is None else f"{rate:8.1f} GFLOP/s ({rate / threads:.1f} per core)"
            print(f"{dtype} peak at {threads} thread(s): {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
