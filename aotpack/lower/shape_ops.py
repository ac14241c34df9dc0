"""Ops that move elements rather than compute them: views, ``flip``, ``cat`` and values-only
``max_pool2d``. A view of a buffer stays a strided view (``views.strided_view``); anything
else becomes index arithmetic on a lazy value, so no copy is made."""
from __future__ import annotations

import itertools

import torch

from aotpack.ir.graph import Lazy, Pointwise, Value, as_strided_parts
from aotpack.ir.kernel import Cast, Piecewise
from aotpack.lower import ops, pooling, views
from aotpack.lower.registry import lowers, meta


def reindexed_operand(lw, arg) -> Value:
    """The value of ``arg`` for an op that reads it at other indices (a view, flip or
    cat): one that reads an unrealised reduction gets a buffer first, so reductions
    stay in the rows they were computed in (a remapped index would hide that a row
    reads only its own reduction result)."""
    value = lw.operand(arg)
    if isinstance(value, Lazy) and value.realized is None and value.reduces:
        lw.realize(value)
    return value


def remap(source: Value, shape: tuple, index_map) -> Pointwise:
    """``source`` read at ``index_map(index)``, as a lazy value of ``shape`` (no op of its own)."""
    def fn(index):
        return source.expr(index_map(index))

    lazy = isinstance(source, Lazy) and source.realized is None
    return Pointwise(shape, source.dtype, fn, op_count=source.op_count if lazy else 0,
                     expensive=lazy and source.expensive,
                     op_names=source.op_names if lazy else (), reduces=lazy and source.reduces)


@lowers(ops.VIEWS)
def _view(lw, node):
    source = reindexed_operand(lw, node.args[0])
    parts = as_strided_parts(source)
    if parts is not None:
        viewed = views.strided_view(node.target, parts, [lw.operand(a) for a in node.args[1:]], node.kwargs)
        if viewed is not None:
            return viewed
    return _lazy_view(lw, node, source)


def _lazy_view(lw, node, source: Value):
    """Views of lazy values: new index -> old index arithmetic."""
    val = meta(node)
    args = [lw.operand(a) for a in node.args[1:]]
    if isinstance(val, (list, tuple)):
        pieces = [tuple(v.shape) for v in val]
        maps = [views.piece_index_map(node.target, args, tuple(source.shape), pieces, i)
                for i in range(len(pieces))]
        return [remap(source, piece, m) for piece, m in zip(pieces, maps)]
    index_map = views.view_index_map(node.target, args, tuple(source.shape), tuple(val.shape))
    return remap(source, tuple(val.shape), index_map)


@lowers(torch.ops.aten.flip.default)
def _flip(lw, node):
    """``torch.flip``: a copy in eager, index arithmetic here (``i -> size - 1 - i``)."""
    source = reindexed_operand(lw, node.args[0])
    shape = tuple(meta(node).shape)
    return remap(source, shape, views.flip_index_map(shape, node.args[1]))


@lowers(torch.ops.aten.max_pool2d_with_indices.default)
def _max_pool(lw, node):
    """``max_pool2d`` whose indices are unread: (values as a lazy value, no indices);
    None (an ATen call) otherwise (``pooling``)."""
    source = reindexed_operand(lw, node.args[0])
    params = pooling.pool_params([lw.operand(a) for a in node.args[1:]])
    if params is None or not pooling.is_values_only(node) or not pooling.supported(source):
        return None
    kernel, stride, padding, dilation = params
    out_shape = tuple(meta(node)[0].shape)
    rows = pooling.row_max(source, out_shape[-2], kernel, stride, padding, dilation)
    if padding != (0, 0) or stride[1] > 1:
        lw.realize(rows)  # separable: the rows' maximum over the padded width, then the columns'
    return pooling.column_max(rows, out_shape, kernel, stride, dilation), None


@lowers(torch.ops.aten.cat.default)
def _cat(lw, node):
    """``torch.cat`` as a lazy value: element ``index`` is read from the input whose
    slice of the cat dimension holds it (a ``Piecewise`` node), so the consumer's
    kernel reads the inputs directly and no copy is made. Inputs with no elements are
    left out (torch accepts a 1-D empty tensor next to any shape); inputs of another
    dtype are cast to the result's, as torch promotes them.
    """
    out = meta(node)
    if out.numel() == 0:
        return None
    dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % out.dim()
    parts = [reindexed_operand(lw, arg) for arg in node.args[0] if meta(arg).numel() > 0]
    bounds = tuple(itertools.accumulate(value.shape[dim] for value in parts))

    def fn(index):
        pieces = []
        for value, end in zip(parts, bounds):
            start = end - value.shape[dim]
            expr = value.expr(index[:dim] + [index[dim] + (-start)] + index[dim + 1:])
            pieces.append(expr if expr.dtype == out.dtype else Cast(expr, out.dtype))
        return pieces[0] if len(pieces) == 1 else Piecewise(index[dim], bounds, tuple(pieces), out.dtype)

    lazy = [v for v in parts if isinstance(v, Lazy) and v.realized is None]
    return Pointwise(tuple(out.shape), out.dtype, fn, op_count=sum(v.op_count for v in lazy),
                     expensive=any(v.expensive for v in lazy),
                     op_names=("cat",) + sum((v.op_names for v in lazy), ()))
