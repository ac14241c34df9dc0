"""Max pooling as a fused lazy value: ``max_pool2d`` lowered to index arithmetic.

ATen's NCHW ``max_pool2d_with_indices`` is a scalar loop, many times slower than a fused
pool (docs/measurements.md, "Max pooling"), and it also writes the int64 indices inference
never reads.
Lowered here, the pool is a pointwise value: each output element is the ``maximum`` of its window's taps,
the consumer's kernel reads it directly. A pool that pads or strides along the width is
separable (``row_max``, realized, then ``column_max``): the maximum over a window's rows
reads whole input rows and writes every column of the ``-inf``-bordered width (as PyTorch
pads max pooling), so the columns' maximum then reads ``ow * sw + j * dw`` without a
bounds check. Without either, ``row_max`` stays lazy and the one kernel reads the
windows in place.
``maximum`` propagates NaN, as the ATen kernel does.
"""
from __future__ import annotations

import functools
import math
import operator

import torch

from aotpack.ir.index import Index
from aotpack.ir.graph import Pointwise, Value
from aotpack.ir.kernel import Const, Op, Piecewise


#: dtypes the pool is lowered for (``-inf`` padding needs a float).
FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _pair(value, default=None) -> tuple[int, int]:
    """``int`` or 1/2-element list -> (h, w); an empty list is ``default``."""
    if isinstance(value, int):
        return value, value
    if not value:
        return default
    return (value[0], value[0]) if len(value) == 1 else (value[0], value[1])


def pool_params(args: list) -> tuple | None:
    """(kernel, stride, padding, dilation) pairs of ``max_pool2d_with_indices``'s arguments
    after the input (``kernel_size, stride=[], padding=0, dilation=1, ceil_mode=False``;
    ``ceil_mode`` only changes the output size, which the caller takes from the node)."""
    kernel = _pair(args[0])
    stride = _pair(args[1] if len(args) > 1 else [], kernel)
    padding = _pair(args[2] if len(args) > 2 else 0)
    dilation = _pair(args[3] if len(args) > 3 else 1)
    if not all(isinstance(v, int) for pair in (kernel, stride, padding, dilation) for v in pair):
        return None
    return kernel, stride, padding, dilation


def _padded(selector: Index, pad: int, size: int, inner, dtype) -> object:
    """``inner`` where ``pad <= selector < pad + size``, else ``-inf``: the padded read
    along one dim (``selector`` = the padded coordinate, never negative)."""
    neg_inf = Const(-math.inf, dtype)
    bounds, pieces = [], []
    if pad > 0:
        bounds.append(pad)
        pieces.append(neg_inf)
    if selector.upper > pad + size:
        bounds += [pad + size, selector.upper]
        pieces += [inner, neg_inf]
    else:
        bounds.append(selector.upper)
        pieces.append(inner)
    return inner if len(pieces) == 1 else Piecewise(selector, tuple(bounds), tuple(pieces), dtype)


def _pool_pass(source: Value, shape: tuple, taps, count: int, name: str) -> Pointwise:
    """A lazy value of ``shape``: the ``maximum`` of ``taps(index)`` (the ``count``
    expressions of one pass's window taps); a still-lazy ``source`` carries its op count
    and names into it."""
    lazy = getattr(source, "realized", True) is None

    def fn(index):
        return functools.reduce(lambda best, tap: Op("maximum", (best, tap), source.dtype), taps(index))

    return Pointwise(tuple(shape), source.dtype, fn, op_count=count - 1 + (source.op_count if lazy else 0),
                     expensive=lazy and source.expensive, op_names=(source.op_names if lazy else ()) + (name,))


def row_max(source: Value, out_rows: int, kernel, stride, padding, dilation) -> Pointwise:
    """The first pass of a separable max pool: ``V[..., oh, w]``, the maximum over the ``kh``
    rows of window row ``oh`` of ``source`` [..., H, W] bordered by ``-inf`` (``padding``
    (ph, pw)), for every column ``w`` of the padded width W + 2pw. Rows are read whole and
    contiguous, and the border is a condition on the row (taken out of the column loop) or
    on the first and last ``pw`` columns (their own loop segments), so the pass vectorises
    without masks. Rows a ``ceil_mode`` window runs past are ``-inf``."""
    (kh, _), (sh, _), (ph, pw), (dh, _) = kernel, stride, padding, dilation
    height, width = source.shape[-2:]
    dtype = source.dtype

    def taps(index):
        *lead, oh, w = index
        found = []
        for i in range(kh):
            h = oh.scale(sh) + i * dh  # the padded row
            tap = source.expr([*lead, h + (-ph), w + (-pw)])
            found.append(_padded(h, ph, height, _padded(w, pw, width, tap, dtype), dtype))
        return found

    return _pool_pass(source, (*source.shape[:-2], out_rows, width + 2 * pw), taps, kh, "max_pool2d_rows")


def column_max(rows: Value, out_shape: tuple, kernel, stride, dilation) -> Pointwise:
    """The second pass: ``out[..., oh, ow]`` = the maximum over the ``kw`` taps
    ``V[..., oh, ow*sw + j*dw]`` of ``row_max``'s ``V`` (already ``-inf`` where the padding
    is; a ``ceil_mode`` window past its end reads ``-inf`` there too). Unrealized (no
    padding nor width stride), ``V`` is computed in this one pass."""
    (_, kw), (_, sw), (_, dw) = kernel, stride, dilation
    columns = rows.shape[-1]

    def taps(index):
        *lead, oh, ow = index
        return [_padded(w, 0, columns, rows.expr([*lead, oh, w]), rows.dtype)
                for w in (ow.scale(sw) + j * dw for j in range(kw))]

    return _pool_pass(rows, out_shape, taps, kw, "max_pool2d")


def is_values_only(node) -> bool:
    """Whether only the values (output 0) of a ``max_pool2d_with_indices`` node are read."""
    return all(user.target is operator.getitem and user.args[1] == 0 for user in node.users)


def supported(source: Value) -> bool:
    """Float input of 3 or 4 dims with elements (other inputs stay ATen calls)."""
    return source.dtype in FLOAT_DTYPES and len(source.shape) in (3, 4) and source.numel > 0
