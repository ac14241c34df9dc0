"""The CPU fused attention template: tilings (TopN solver) and rendering of ``template_kernels.AttentionKernel``.

The kernel (``templates/cpu_attention.cpp.j2``) takes (batch, block of ``bm`` query rows) as
work items; per item it sweeps the keys in blocks of ``bn``: the block of ``k`` is packed
transposed into the thread's workspace, the ``bm x bn`` scores computed in register tiles
(6 rows x 64 keys with AVX-512), the score ops (scale, masks) applied, and an online softmax
(running max and sum per row, as FlashAttention-2) rescales the rows' accumulators before
the block's exp-weights times ``v`` are added. The score matrix never reaches memory; the
thread's slot holds one block of it. ``v`` is read in place where its rows are unit-stride
and ``dv`` a multiple of 16, else each key block of it is packed.

Knobs (the tiling): ``block_dim``, ``bm`` (query rows per item), ``bn`` (keys per block, a
multiple of 64); ``workspace`` is ``block_dim`` slots of ``slot_floats`` floats.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from aotpack.backends.base import Candidate
from aotpack.backends.cpu.gemm_template import PARALLEL_MIN_FLOPS, VECTOR_BYTES, tile_width, wide_suffix
from aotpack.config import MAX_TOPN
from aotpack.ir.template_kernels import AttentionKernel, AttentionOperand
from aotpack.backends.cpu.templating import render

#: Keys per block must be a multiple of this (the score tile's width with AVX-512).
KEY_ALIGN = 64
#: Most query rows per item: its accumulators (``MAX_ROWS x dv`` floats, 64 KiB at dv 64) stay
#: in L2 while each key block of ``k`` is packed once for all of them.
MAX_ROWS = 256


@dataclass(frozen=True)
class AttentionTiling(Candidate):
    """Knobs of one fused attention static kernel (see the module docstring)."""

    block_dim: int
    bm: int
    bn: int
    workspace: int = 0
    vector_bytes: int = 32

    @property
    def tiling_repr(self) -> str:
        """``tiling_repr``: every knob, canonical."""
        return f"cpu_attention;block_dim={self.block_dim};bm={self.bm};bn={self.bn}{wide_suffix(self.vector_bytes)}"


def _round16(x: int) -> int:
    return -(-x // 16) * 16


def pack_v(kernel: AttentionKernel) -> bool:
    """Whether ``v``'s key blocks are packed (its rows are not unit-stride multiples of 16 floats)."""
    return kernel.v.strides[-1] != 1 or kernel.dv % 16 != 0


#: Query rows whose scores are computed at a time within an item (48 x 128 floats: 24 KiB, in L1).
SUB_ROWS = 48


def sub_rows(bm: int) -> int:
    """Rows per score sub-block of an item of ``bm`` rows."""
    return min(bm, SUB_ROWS)


def slot_floats(kernel: AttentionKernel, bm: int, bn: int) -> int:
    """Floats of one thread's workspace slot: ``k`` block, ``v`` block (if packed), a sub-block
    of scores, the item's accumulators and three per-row statistics, rounded up to 16 floats
    (64 bytes)."""
    dvp = _round16(kernel.dv)
    return _round16(kernel.d * bn + (bn * dvp if pack_v(kernel) else 0) + sub_rows(bm) * bn + bm * dvp
                    + 3 * _round16(bm))


def tiling(kernel: AttentionKernel, block_dim: int, bm: int, bn: int,
           vector_bytes: int = VECTOR_BYTES) -> AttentionTiling:
    """The tiling with these knobs and the workspace it needs.

    Raises:
        ValueError: ``bn`` not a positive multiple of ``KEY_ALIGN`` or ``bm`` < 1.
    """
    if bn <= 0 or bn % KEY_ALIGN or bm < 1:
        raise ValueError(f"{kernel.name}: bn {bn} must be a positive multiple of {KEY_ALIGN}, bm {bm} >= 1")
    return AttentionTiling(block_dim=block_dim, bm=bm, bn=bn, workspace=block_dim * slot_floats(kernel, bm, bn) * 4,
                           vector_bytes=vector_bytes)


def _fit(value: int, extent: int, align: int) -> int:
    """``value``, no larger than ``extent`` rounded up to ``align``."""
    return min(value, -(-extent // align) * align)


def solve(kernel: AttentionKernel, device_limit: int, count: int = MAX_TOPN,
          vector_bytes: int = VECTOR_BYTES) -> list[AttentionTiling]:
    """Candidate tilings of ``kernel``, the heuristic default first, at most ``count``.

    The default: up to ``MAX_ROWS`` query rows per item (halved while there are fewer than
    two items per thread, down to 32) x 128 keys (at most the sequence, rounded up to 64),
    all ``device_limit`` threads unless the attention is under ``PARALLEL_MIN_FLOPS``. Then
    one knob at a time: the other thread count, 48 and 96 query rows, 64 and 256 keys.
    """
    threads = 1 if kernel.flops < PARALLEL_MIN_FLOPS else max(1, device_limit)
    vector_bytes = tile_width(vector_bytes)
    # the most rows (each item packs every key block once), as long as every thread gets two items
    bm = _fit(MAX_ROWS, kernel.m, 6)
    while bm > 32 and kernel.batch * math.ceil(kernel.m / bm) < 2 * threads:
        bm = _fit(-(-bm // 12) * 6, kernel.m, 6)
    bn = _fit(128, kernel.n, KEY_ALIGN)
    options = [tiling(kernel, threads, bm, bn, vector_bytes)]
    if device_limit > 1:
        options.append(tiling(kernel, device_limit if threads == 1 else 1, bm, bn, vector_bytes))
    for other_bm in (48, 96):
        options.append(tiling(kernel, threads, _fit(other_bm, kernel.m, 6), bn, vector_bytes))
    for other_bn in (64, 256):
        options.append(tiling(kernel, threads, bm, _fit(other_bn, kernel.n, KEY_ALIGN), vector_bytes))
    unique = list(dict.fromkeys(options))
    return unique[:min(count, MAX_TOPN)]


def estimate_us(kernel: AttentionKernel, candidate: AttentionTiling, gflops: float = 60.0) -> float:
    """Guess in us: both products' flops at ``gflops`` per thread, ~2 us per parallel region."""
    return kernel.flops / (gflops * 1e3 * candidate.block_dim) + (2.0 if candidate.block_dim > 1 else 0.0)


def batch_expr(shape: tuple, strides: tuple) -> str:
    """C++ offset of batch index ``bi`` (row-major over ``shape``) at ``strides``."""
    terms, inner = [], 1
    for size, stride in reversed(list(zip(shape, strides))):
        if stride and size > 1:
            index = "bi" if inner == 1 else f"(bi / {inner})"
            terms.append(f"({index} % {size}) * {stride}")
        inner *= size
    return " + ".join(reversed(terms)) or "0"


def _float(value: float) -> str:
    """A C++ float literal of ``value`` rounded to float32 (as eager's scalar ops compute)."""
    x = torch.tensor(value, dtype=torch.float32).item()
    if math.isinf(x):
        return "__builtin_inff()" if x > 0 else "-__builtin_inff()"
    if math.isnan(x):
        return "__builtin_nanf(\"\")"
    return f"{x.hex()}f"


def _mask_read(index: int, mask: AttentionOperand) -> str:
    return f"mask{index}[r * {mask.strides[-2]} + (n0 + j) * {mask.strides[-1]}]"


def render_kernel(kernel: AttentionKernel, candidate: AttentionTiling) -> str:
    """C++ source of ``kernel`` compiled with ``candidate``."""
    masks, lines, texts = [], [], []
    for op in kernel.ops:
        if op.kind in ("mul", "div"):
            lines.append(f"x = x {'*' if op.kind == 'mul' else '/'} {_float(op.value)};")
        else:
            index = len(masks)
            dtype = kernel.inputs[op.mask.input].dtype
            masks.append({"input": op.mask.input, "offset": op.mask.offset, "strides": op.mask.strides,
                          "ctype": "uint8_t" if dtype == torch.bool else "float",
                          "batch_expr": batch_expr(op.mask.batch_shape, op.mask.strides[:-2])})
            read = _mask_read(index, op.mask)
            lines.append(f"x = x + {read};" if op.kind == "add" else f"x = {read} ? {_float(op.value)} : x;")
        texts.append(op.format())
    return render("cpu_attention.cpp.j2", tiling_repr=candidate.tiling_repr, batch_shape=kernel.batch_shape,
                  batch=kernel.batch, m=kernel.m, n=kernel.n, d=kernel.d, dv=kernel.dv, dvp=_round16(kernel.dv),
                  bm=candidate.bm, bn=candidate.bn, sub=sub_rows(candidate.bm), block_dim=candidate.block_dim, workspace=candidate.workspace,
                  vector_bytes=candidate.vector_bytes, slot_floats=slot_floats(kernel, candidate.bm, candidate.bn),
                  pack_v=pack_v(kernel), q=kernel.q, k=kernel.k, v=kernel.v, masks=masks, ops=lines,
                  ops_text="; ".join(texts) or "none", n_inputs=len(kernel.inputs),
                  q_batch_expr=batch_expr(kernel.batch_shape, kernel.q.strides[:-2]),
                  k_batch_expr=batch_expr(kernel.batch_shape, kernel.k.strides[:-2]),
                  v_batch_expr=batch_expr(kernel.batch_shape, kernel.v.strides[:-2]),
                  optional_helpers=["nonpositive_exp"])
