"""The kernels' inline float exp (backends/cpu/templates/cpu_math.h.j2, ``ap::exp(float)``) against torch.

The math header is rendered as every kernel includes it, compiled with the kernel flags
(``-O3``, ``-march=native``, no ``-ffast-math``) into a small library with two entry points:
an ``omp simd`` loop (the vectorised code kernels get) and a loop over a non-inlined scalar
call. Both must agree with ``torch.exp`` on a sweep over [-110, 95] (every result range:
zero, denormals, normals, overflow) and be exact on the special values. The library
must not call libm's or libmvec's expf (the point of the inline version).

Bound asserted: at most 1 ulp from exp computed in double and rounded to float (the
correctly rounded result, up to double rounding), at most 2 ulp from ``torch.exp`` on
float (itself within 1 ulp), relative error at most 1.2e-7 where the result is normal.
Measured once over every float in [-104, 89] with a C++ loop (too slow for the suite):
1 ulp, relative error 7.7e-8 with FMA (-march=native here) and 9.9e-8 without
(-march=x86-64). libmvec's expf, which kernels called before, fails the 1 ulp bound.

``ap::exp_nonpositive`` (softmax's exp(a - max(a)), argument <= 0) is held to the same
1 ulp where its result is at least 2^-126 (x >= -87.68) and must give 0 below, and on
(0, 87.9] too (an argument a rounding above 0). Measured over every float in [-104, 0]
and (0, 87.9]: 1 ulp, relative error 7.7e-8 (FMA) / 9.9e-8 (x86-64).
"""
from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from aotpack.backends.cpu.toolchain import CpuToolchain
from aotpack.backends.cpu.templating import render


HARNESS = """#include <cstdint>
#include <type_traits>
namespace {{
{header}
}}  // namespace
__attribute__((noinline)) static float scalar_exp(float x) {{ return ap::exp(x); }}
extern "C" void simd_exp(const float* __restrict__ x, float* __restrict__ y, int64_t n) {{
  #pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = ap::exp(x[i]);
}}
extern "C" void simd_sigmoid(const float* __restrict__ x, float* __restrict__ y, int64_t n) {{
  #pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = ap_sigmoid(x[i]);
}}
__attribute__((noinline)) static float scalar_exp_nonpositive(float x) {{ return ap::exp_nonpositive(x); }}
extern "C" void simd_exp_nonpositive(const float* __restrict__ x, float* __restrict__ y, int64_t n) {{
  #pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = ap::exp_nonpositive(x[i]);
}}
extern "C" void scalar_loop_exp_nonpositive(const float* __restrict__ x, float* __restrict__ y, int64_t n) {{
  for (int64_t i = 0; i < n; ++i) y[i] = scalar_exp_nonpositive(x[i]);
}}
extern "C" void scalar_loop_exp(const float* __restrict__ x, float* __restrict__ y, int64_t n) {{
  for (int64_t i = 0; i < n; ++i) y[i] = scalar_exp(x[i]);
}}
"""


@pytest.fixture(scope="module")
def math_lib(tmp_path_factory) -> tuple[ctypes.CDLL, Path]:
    """The compiled harness and the path of its shared library."""
    folder = tmp_path_factory.mktemp("fast_exp")
    source, library = folder / "harness.cpp", folder / "harness.so"
    source.write_text(HARNESS.format(header=render("cpu_math.h.j2", optional_helpers=["nonpositive_exp"])))
    CpuToolchain("native").compile_kernel(source, library)
    lib = ctypes.CDLL(str(library))
    for name in ("simd_exp", "simd_sigmoid", "scalar_loop_exp", "simd_exp_nonpositive", "scalar_loop_exp_nonpositive"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib, library


def _call(lib: ctypes.CDLL, name: str, x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    getattr(lib, name)(x.data_ptr(), y.data_ptr(), x.numel())
    return y


def _ordered(x: torch.Tensor) -> torch.Tensor:
    """float32 -> int64 whose differences count ulps (+0 and -0 both map to 0)."""
    bits = x.view(torch.int32).to(torch.int64)
    return torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits)


def _ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((_ordered(a) - _ordered(b)).abs().max())


def _sweep() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    dense = torch.linspace(-110.0, 95.0, 1_000_003)
    near_zero = torch.logspace(-45, 0, 20_001) * torch.tensor([1.0, -1.0]).repeat(10_001)[:20_001]
    uniform = torch.empty(200_000).uniform_(-104.0, 89.0, generator=generator)
    # Where results become denormal (-87.34), the smallest denormal (-103.28) and zero
    # (-103.97), and where they overflow (88.72): both neighbours of each boundary.
    edges = torch.tensor([-87.33654, -103.27893, -103.97208, 88.72283, -104.0, 89.0])
    around = [torch.nextafter(edges, edges + step) for step in (-1.0, 1.0)]
    return torch.cat([dense, near_zero, uniform, edges, *around])


@pytest.mark.parametrize("entry", ["simd_exp", "scalar_loop_exp"])
def test_exp_matches_torch_within_one_ulp(math_lib, entry):
    lib, _ = math_lib
    x = _sweep()
    y = _call(lib, entry, x)
    rounded = torch.exp(x.double()).float()
    assert _ulps(y, rounded) <= 1
    assert _ulps(y, torch.exp(x)) <= 2
    normal = (rounded >= torch.finfo(torch.float32).tiny) & torch.isfinite(rounded)
    exact = torch.exp(x.double())[normal]
    assert float(((y[normal].double() - exact) / exact).abs().max()) <= 1.2e-7


@pytest.mark.parametrize("entry", ["simd_exp", "scalar_loop_exp"])
def test_exp_special_values_exact(math_lib, entry):
    lib, _ = math_lib
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([0.0, -0.0, inf, -inf, nan, -nan, 1e30, -1e30, 88.72283, 88.72284, -104.0, -150.0, 1.0])
    y = _call(lib, entry, x).tolist()
    assert y[:4] == [1.0, 1.0, inf, 0.0]
    assert np.isnan(y[4]) and np.isnan(y[5])
    assert y[6:12] == [inf, 0.0, torch.exp(torch.tensor(88.72283)).item(), inf, 0.0, 0.0]
    assert y[12] == torch.exp(torch.tensor(1.0)).item()


def test_sigmoid_on_inline_exp_matches_torch(math_lib):
    lib, _ = math_lib
    x = torch.cat([torch.linspace(-120.0, 120.0, 100_001), torch.tensor([float("inf"), -float("inf")])])
    y = _call(lib, "simd_sigmoid", x)
    torch.testing.assert_close(y, torch.sigmoid(x), rtol=3e-7, atol=0.0)
    assert y[-2:].tolist() == [1.0, 0.0]
    assert torch.isnan(_call(lib, "simd_sigmoid", torch.tensor([float("nan")]))).all()


#: exp_nonpositive flushes to 0 where n = round(x / ln 2) <= -127, i.e. x < -126.5 * ln 2
#: = -87.683118 (the exact float where it starts depends on FMA): 0 below FLUSH_BELOW,
#: rounded once like eager's denormals above DENORMAL_FROM.
FLUSH_BELOW, DENORMAL_FROM = -87.6832, -87.6830


def _nonpositive_sweep() -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    dense = torch.linspace(-110.0, 0.0, 1_000_003)
    near_zero = -torch.logspace(-45, 0, 20_001)
    uniform = torch.empty(200_000).uniform_(-104.0, 0.0, generator=generator)
    above = torch.linspace(0.0, 87.9, 100_001)  # a hair above 0 must stay right too
    edges = torch.tensor([FLUSH_BELOW, DENORMAL_FROM, -87.33654, -104.0, -0.0])
    around = [torch.nextafter(edges, edges + step) for step in (-1.0, 1.0)]
    return torch.cat([dense, near_zero, uniform, above, edges, *around])


@pytest.mark.parametrize("entry", ["simd_exp_nonpositive", "scalar_loop_exp_nonpositive"])
def test_exp_nonpositive_matches_torch_within_one_ulp(math_lib, entry):
    lib, _ = math_lib
    x = _nonpositive_sweep()
    y = _call(lib, entry, x)
    rounded = torch.exp(x.double()).float()
    normal = rounded >= torch.finfo(torch.float32).tiny
    assert _ulps(y[normal], rounded[normal]) <= 1
    exact = torch.exp(x.double())[normal]
    assert float(((y[normal].double() - exact) / exact).abs().max()) <= 1.2e-7
    assert (y[x < FLUSH_BELOW] == 0).all()  # eager's denormals (< 1.2e-38) flush to 0
    denormal = ~normal & (x >= DENORMAL_FROM)  # [-87.68, -87.34]: rounded once, as eager
    assert _ulps(y[denormal], rounded[denormal]) <= 1


@pytest.mark.parametrize("entry", ["simd_exp_nonpositive", "scalar_loop_exp_nonpositive"])
def test_exp_nonpositive_special_values_exact(math_lib, entry):
    lib, _ = math_lib
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([0.0, -0.0, -inf, nan, -nan, -1e30, -104.0, -150.0, -1.0])
    y = _call(lib, entry, x).tolist()
    assert y[:3] == [1.0, 1.0, 0.0]
    assert np.isnan(y[3]) and np.isnan(y[4])
    assert y[5:8] == [0.0, 0.0, 0.0]
    assert y[8] == torch.exp(torch.tensor(-1.0)).item()


def test_exp_needs_no_library_call(math_lib):
    _, library = math_lib
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(library)],
                               capture_output=True, text=True, check=True).stdout
    assert "expf" not in undefined
