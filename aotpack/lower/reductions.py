"""Reductions (sum, mean, prod, amax, amin) and var / var_mean as lazy ``Reduction`` values:
the kernel that realises one computes it per row, and pointwise users fuse around it
(softmax and layer norm decompose into these)."""
from __future__ import annotations

import math

import torch

from aotpack.ir.graph import Index, Lazy, Pointwise, Reduction, Value, unflatten_index
from aotpack.ir.kernel import Cast, Op
from aotpack.lower import ops
from aotpack.lower.registry import lowers, meta
from aotpack.lower.shape_ops import remap


def reduced_dims(node, shape) -> tuple[tuple[int, ...], bool]:
    """(sorted reduced dims, keepdim) of a reduction node over a tensor of ``shape``."""
    args = node.args
    dims = args[1] if len(args) > 1 else node.kwargs.get("dim")
    if dims is None or dims == []:
        dims = list(range(len(shape)))
    dims = [dims] if isinstance(dims, int) else list(dims)
    dims = sorted({d % max(len(shape), 1) for d in dims}) if shape else []
    keepdim = args[2] if len(args) > 2 else node.kwargs.get("keepdim", False)
    return tuple(dims), bool(keepdim)


def _suffix_dims(node, shape) -> tuple[int, bool] | None:
    """(first reduced dim, keepdim) when the reduced dims are a suffix of ``shape``."""
    dims, keepdim = reduced_dims(node, shape)
    if list(dims) != list(range(len(shape) - len(dims), len(shape))):
        return None
    return (len(shape) - len(dims) if shape else 0), keepdim


def make_reduction(node, source: Value, kind: str, mean: bool, dims: tuple, keepdim: bool,
                   out_dtype, src_fn=None) -> Reduction:
    """The reduction of ``source`` over ``dims`` (sorted). Its rows are the kept dims in
    their order and ``j`` runs over the reduced ones row-major: a reduction over leading
    dims (``x.sum(0)``) reads ``source`` with a stride along ``j``, which the backend's
    loop order handles (``kernel_ir.column_access``)."""
    shape = tuple(source.shape)
    kept = [d for d in range(len(shape)) if d not in dims]
    reduced_shape = tuple(shape[d] for d in dims)
    outer, inner = tuple(shape[d] for d in kept), math.prod(reduced_shape)
    out_shape = tuple(1 if d in dims else shape[d] for d in range(len(shape))) if keepdim else outer
    kept_dims = tuple(dims) if keepdim else ()
    red_shape_src = outer + (inner,)
    if src_fn is None:
        def src_fn(index):
            full = [None] * len(shape)
            for d, idx in zip(kept, index[:-1]):
                full[d] = idx
            for d, idx in zip(dims, unflatten_index(index[-1], reduced_shape)):
                full[d] = idx
            value = source.expr(full)
            return value if source.dtype == out_dtype else Cast(value, out_dtype)
    lazy = [source] if isinstance(source, Lazy) and source.realized is None else []
    src = Pointwise(red_shape_src, source.dtype, src_fn)
    return Reduction(out_shape, out_dtype, src, outer, inner, kind,
                     scale=(1.0 / inner if mean else 1.0), kept_dims=kept_dims,
                     op_count=1 + sum(v.op_count for v in lazy),
                     op_names=sum((v.op_names for v in lazy), ()) + (ops.short_name(node.target),))


@lowers(ops.REDUCTIONS)
def _reduction(lw, node):
    """sum/mean/prod/amax/amin over any dims. A result dtype other than the
    input's (``dtype=``, or bool/integer sum and prod accumulating in int64 as in
    eager) converts each element first."""
    source = lw.operand(node.args[0])
    kind, mean = ops.REDUCTIONS[node.target]
    if source.numel == 0:
        return None
    out_dtype = meta(node).dtype
    if out_dtype != source.dtype and kind not in ("sum", "prod"):
        return None
    return make_reduction(node, source, kind, mean, *reduced_dims(node, tuple(source.shape)), out_dtype)


@lowers(torch.ops.aten.var_mean.correction)
def _var_mean(lw, node):
    """var_mean(x, dims, correction, keepdim) as two per-row passes (mean, then the sum
    of squared deviations; float sums accumulate in double), also for ``var``.

    Returns (var, mean), or None (an extern call) for dims that are not a suffix."""
    source = lw.operand(node.args[0])
    if not source.dtype.is_floating_point or source.numel == 0:
        return None
    found = _suffix_dims(node, tuple(source.shape))
    if found is None:
        return None
    first, keepdim = found
    keepdim = node.kwargs.get("keepdim", keepdim)
    correction = node.kwargs.get("correction", 1)
    correction = 1 if correction is None else correction
    shape = tuple(source.shape)
    inner = math.prod(shape[first:])
    reduced = tuple(range(first, len(shape)))
    row_mean = make_reduction(node, source, "sum", True, reduced, True, source.dtype)

    def squared_deviation(index):
        x = source.expr(index[:-1] + unflatten_index(index[-1], shape[first:]))
        m = row_mean.expr(index[:-1] + [Index.constant(0)] * (len(shape) - first))
        deviation = Op("sub", (x, m), source.dtype, convert=False)
        return Op("mul", (deviation, deviation), source.dtype, convert=False)

    var = make_reduction(node, source, "sum", False, reduced, keepdim, source.dtype, src_fn=squared_deviation)
    # ATen divides by max(N - correction, 0): 0/0 is nan, a positive sum over 0 is inf
    var.scale = 1.0 / (inner - correction) if inner - correction > 0 else math.inf
    var.op_count += row_mean.op_count
    mean = row_mean
    if not keepdim:  # a new value: squared_deviation keeps reading row_mean at its own rows
        mean = remap(row_mean, tuple(var.shape), lambda index: index + [Index.constant(0)] * (len(shape) - first))
    return (var, mean)


@lowers(ops.VARIANCES)
def _variance(lw, node):
    """``var``: var_mean's first result."""
    found = _var_mean(lw, node)
    return None if found is None else found[0]
