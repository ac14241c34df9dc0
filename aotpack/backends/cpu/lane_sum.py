"""The lane form of a float32 row sum: float partial sums in independent lanes, double across chunks.

The plain row form (``kernel_writer.KernelWriter._reduction_loop``) adds every element into
one double accumulator under ``omp simd reduction(+:acc)``: each float is converted to
double (half the lanes of a float vector), and the loop carries one vector accumulator,
so it runs at one vector add per add latency. layer_norm of 64x4096 (two such sums per
row) took 139 us per call that way at 1 thread, 83 us in this form (eager: 131 us;
kernel-only, interleaved on a 2-core AVX2 host).

Here the row is cut into chunks of ``CHUNK`` elements; within a chunk, element ``j``
adds into float lane ``(j - chunk start) % LANES`` (``LANES`` = 32 floats: four AVX2
vectors, independent dependency chains), each lane taking ``CHUNK / LANES`` = 32 adds.
The lanes are summed in float (a vector reduction), a chunk's remainder (the row is not
a multiple of ``LANES``) in a float sum of its own, and the chunks' sums in double.

Accuracy: a float sum of ``k`` terms errs by at most ``(k - 1) * 2^-24`` times the sum
of the terms' magnitudes (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd
ed., section 4.2). Each element passes through fewer than ``2 * LANES + CHUNK / LANES``
= 96 float adds (its lane, the lane sum, the chunk's remainder) before the double sum, so a
chunk errs by at most ~6e-6 of its sum of magnitudes (~1e-7 typically, as ATen's
cascade sum for float32); chunks add in double, so long rows (16M elements) do not drift.
"""
from __future__ import annotations

import torch

#: Float lanes per chunk: independent partial sums (four 8-float vectors with AVX2).
LANES = 32
#: Elements per chunk: ``CHUNK / LANES`` float adds per lane before the double sum.
CHUNK = 1024


def applies(kind: str, dtype: torch.dtype, source_dtype: torch.dtype, size: int) -> bool:
    """Whether a reduction of ``size`` elements takes the lane form: a float32 sum of
    float32 values, at least one lane vector long (shorter rows gain nothing)."""
    return kind == "sum" and dtype == torch.float32 and source_dtype == torch.float32 and size >= LANES


def lane_sum_lines(acc: str, size: int, body: list[str], value: str, simdlen_mark: str,
                   span: tuple[str, str] | None = None) -> list[str]:
    """C++ lines that leave the sum of ``value`` over ``j < size`` in ``double acc``.

    Args:
        acc: name of the double accumulator the lines declare (``accN``).
        size: elements in the row (>= ``LANES``).
        body: lines computing ``value`` (a float expression) for element ``j``.
        value: the C++ name of the element's value.
        simdlen_mark: placeholder the renderer replaces with the tiling's ``simdlen`` clause.
        span: C++ expressions ``(begin, end)`` of a part of the row to sum instead (a split
            reduction's segment); None = the whole row.
    """
    chunk = min(size, CHUNK)
    begin, end = span or ("0", str(size))
    whole = span is None and size % LANES == 0  # every chunk is whole lane vectors (CHUNK is a multiple)
    exact = whole and size % chunk == 0  # and every chunk is CHUNK long
    inner = ["    " + line for line in body]
    lines = [f"double {acc} = 0;",
             f"for (int64_t jc = {begin}; jc < {end}; jc += {chunk}) {{"]
    if exact:  # constant trip counts
        lines += [f"  const int64_t jl_end = jc + {chunk};"]
    else:
        lines += [f"  const int64_t jc_end = ap::min_index(jc + {chunk}, {end});",
                  f"  const int64_t jl_end = jc + (jc_end - jc) / {LANES} * {LANES};"]
    lines += [f"  float lanes[{LANES}] = {{}};",
              f"  for (int64_t jb = jc; jb < jl_end; jb += {LANES}) {{",
              f"    #pragma omp simd{simdlen_mark}",
              f"    for (int64_t l = 0; l < {LANES}; ++l) {{",
              "      const int64_t j = jb + l;"]
    lines += ["  " + line for line in inner]
    lines += [f"      lanes[l] = lanes[l] + {value};", "    }", "  }",
              "  float cs = 0;",
              f"  #pragma omp simd reduction(+:cs){simdlen_mark}",
              f"  for (int64_t l = 0; l < {LANES}; ++l) cs = cs + lanes[l];"]
    if not whole:  # the rest of a chunk that is not whole lane vectors
        lines += [f"  #pragma omp simd reduction(+:cs){simdlen_mark}",
                  "  for (int64_t j = jl_end; j < jc_end; ++j) {"]
        lines += inner
        lines += [f"    cs = cs + {value};", "  }"]
    return lines + [f"  {acc} += static_cast<double>(cs);", "}"]
