"""The CPU renderer: one fused kernel (``kernel_ir``) with one tiling -> C++ source.

Every shape, stride and tiling parameter is a compile-time constant. The loop frame comes
from ``templates/cpu_kernel.cpp.j2``; the loop bodies from ``kernel_writer`` (the row form),
``reduce_loops`` (column and split reductions) or ``softmax_store`` (stored-exp softmax).
"""
from __future__ import annotations

import math

from aotpack.backends.cpu import reduce_loops, softmax_store
from aotpack.backends.cpu.formulas import optional_helpers
from aotpack.backends.cpu.kernel_writer import SIMDLEN_MARK, build_body, j_segments
from aotpack.backends.cpu.templating import render
from aotpack.ir.index import contiguous_strides
from aotpack.ir.kernel import FusedKernel


def render_kernel(kernel: FusedKernel, tiling) -> str:
    """C++ source of ``kernel`` compiled with ``tiling`` (a CPU ``Tiling``).

    A tiling with ``col_block`` or ``split`` renders the loop nest of ``reduce_loops``
    (column or split reduction) in place of the row loop.
    """
    loop_lines = []
    if getattr(tiling, "col_block", 0):
        loop_lines = reduce_loops.column_loops(kernel, tiling)
    elif getattr(tiling, "split", 0):
        loop_lines = reduce_loops.split_loops(kernel, tiling)
    online = getattr(tiling, "online", 0)
    if online == 2:
        body = softmax_store.build_body(kernel, bool(getattr(tiling, "stream", 0)))
    else:
        body = build_body(kernel, bool(online))
    clause = f" simdlen({tiling.simdlen})" if tiling.simdlen else ""
    row_lines = [line.replace(SIMDLEN_MARK, clause) for line in body.row_lines]
    rows = math.prod(kernel.outer_shape)
    splits_rows = body.write_is_row and not body.has_reduction  # a reduction needs whole rows
    tile = min(tiling.inner_tile, kernel.inner_size) if splits_rows else kernel.inner_size
    tiles = -(-kernel.inner_size // tile)
    row_block = min(tiling.row_block, rows) if splits_rows and tiling.row_block > 1 else 0
    row_blocks = -(-rows // row_block) if row_block else rows
    outer = [(f"i{k}", stride, size)
             for k, (stride, size) in enumerate(zip(contiguous_strides(kernel.outer_shape), kernel.outer_shape))
             if size > 1]
    return render(
        "cpu_kernel.cpp.j2",
        body=body, row_lines=row_lines, rows=rows, cols=kernel.inner_size, tile=tile, tiles=tiles,
        segments=j_segments(body.j_splits, kernel.inner_size),
        items=row_blocks * tiles, row_block=row_block, outer=outer, block_dim=tiling.block_dim,
        chunk=tiling.chunk, simdlen=tiling.simdlen, tiling_repr=tiling.tiling_repr, workspace=tiling.workspace,
        optional_helpers=optional_helpers(
            [*body.thread_lines, *body.row_lines, *body.write_lines, *body.thread_end_lines]),
        loop_lines=loop_lines,
    )
