"""View ops without copies: strided views of buffers, index maps for lazy values.

A view of a buffer stays a buffer view when its layout is expressible as
(sizes, strides, offset) — the same rule torch uses, computed by applying the op to a
meta tensor. Otherwise (or for a lazy value) the view becomes index arithmetic: a
function from the view's index to the source's index (``ir.Index``).
"""
from __future__ import annotations

from typing import Callable

import torch

from aotpack.ir.graph import Index, StridedView, flat_index, unflatten_index

aten = torch.ops.aten
IndexMap = Callable[[list[Index]], list[Index]]


def broadcast_index(value_shape, out_shape, index: list[Index]) -> list[Index]:
    """Index into a value broadcast to ``out_shape`` (size-1 dims read element 0)."""
    lead = len(out_shape) - len(value_shape)
    return [Index.constant(0) if size == 1 else index[lead + d] for d, size in enumerate(value_shape)]


def strided_view(op, parts, args, kwargs) -> StridedView | list[StridedView] | None:
    """``op(base_view, *args)`` as strided view(s) of the same buffer, or None.

    Applies the op to a meta tensor with the same layout: torch decides whether the
    view exists (e.g. ``view`` of a transposed tensor does not) and what its strides are.
    """
    base, sizes, strides, offset = parts
    storage = max([offset + sum((s - 1) * st for s, st in zip(sizes, strides)) + 1, base.numel, 1])
    meta = torch.empty(storage, dtype=base.dtype, device="meta").as_strided(sizes, strides, offset)
    try:
        out = op(meta, *args, **kwargs)
    except RuntimeError:
        return None
    outs = out if isinstance(out, (list, tuple)) else [out]
    found = [StridedView(base, tuple(t.shape), tuple(t.stride()), t.storage_offset()) for t in outs]
    return found if isinstance(out, (list, tuple)) else found[0]


def piece_index_map(op, args, in_shape, pieces, i: int) -> IndexMap:
    """Index map of piece ``i`` of split / split_with_sizes / unbind."""
    if op is aten.unbind.int:
        dim = (args[0] if args else 0) % len(in_shape)
        return lambda index: index[:dim] + [Index.constant(i)] + index[dim:]
    dim = (args[1] if len(args) > 1 else 0) % len(in_shape)
    start = sum(p[dim] for p in pieces[:i])
    return lambda index: index[:dim] + [index[dim] + start] + index[dim + 1:]


def flip_index_map(shape, dims) -> IndexMap:
    """Index map of ``torch.flip(x, dims)`` for ``x`` of ``shape``: reversed along ``dims``."""
    flipped = {d % len(shape) for d in dims} if shape else set()
    return lambda index: [idx.reversed(shape[d]) if d in flipped else idx for d, idx in enumerate(index)]


def view_index_map(op, args, in_shape, out_shape) -> IndexMap:
    """Index map (view index -> source index) of a single-output view op."""
    if op is aten.permute.default:
        dims = [d % len(in_shape) for d in args[0]]
        inverse = [dims.index(k) for k in range(len(dims))]
        return lambda index: [index[inverse[k]] for k in range(len(in_shape))]
    if op in (aten.t.default, aten.transpose.int) and len(in_shape) >= 2:
        a, b = (args[0], args[1]) if op is aten.transpose.int else (0, 1)
        a, b = a % len(in_shape), b % len(in_shape)

        def swap(index):
            index = list(index)
            index[a], index[b] = index[b], index[a]
            return index
        return swap
    if op is aten.expand.default:
        return lambda index: broadcast_index(in_shape, out_shape, index)
    if op is aten.slice.Tensor:
        dim = (args[0] if args else 0) % len(in_shape)
        start = args[1] if len(args) > 1 and args[1] is not None else 0
        start = max(start + in_shape[dim], 0) if start < 0 else min(start, in_shape[dim])
        step = args[3] if len(args) > 3 else 1
        return lambda index: index[:dim] + [index[dim].scale(step) + start] + index[dim + 1:]
    if op is aten.select.int:
        dim = args[0] % len(in_shape)
        pos = args[1] % in_shape[dim]
        return lambda index: index[:dim] + [Index.constant(pos)] + index[dim:]
    # view / reshape / unsqueeze / squeeze / 1-D t: same elements in row-major order
    return lambda index: unflatten_index(flat_index(index, out_shape), in_shape)
