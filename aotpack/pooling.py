"""Max pooling as a fused lazy value: ``max_pool2d`` lowered to index arithmetic.

ATen's NCHW ``max_pool2d_with_indices`` is a scalar loop (6.7 ms for ResNet-18's 3x3
stride-2 pool of 64x112x112 at one thread here, against 0.25 ms for oneDNN on its own
layout), and it also writes the int64 indices inference never reads. Lowered here, the
pool is a pointwise value: each output element is the ``maximum`` of its window's taps,
the consumer's kernel reads it directly. The input is first copied once with a ``-inf``
border (as PyTorch pads max pooling) and its columns dealt into ``stride`` phases, so
every tap is a unit-stride read without a bounds check (the depthwise template stages its
planes the same way).
``maximum`` propagates NaN, as the ATen kernel does.
"""
from __future__ import annotations

import math
import operator

import torch

from aotpack.index import Index
from aotpack.ir import Pointwise, Value
from aotpack.kernel_ir import Const, Op, Piecewise


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


def _reindexed(source: Value, shape: tuple, fn) -> Pointwise:
    """A lazy value of ``shape`` reading ``source`` through ``fn`` (index -> expression);
    a still-lazy ``source`` carries its op count and names into it (``pad`` added)."""
    lazy = getattr(source, "realized", True) is None
    return Pointwise(shape, source.dtype, fn, op_count=source.op_count if lazy else 0,
                     expensive=lazy and source.expensive, op_names=(source.op_names if lazy else ()) + ("pad",))


def padded(source: Value, padding: tuple) -> Pointwise:
    """``source`` [..., H, W] bordered by ``padding`` (ph, pw) of ``-inf``: a lazy value
    of shape [..., H + 2ph, W + 2pw] (a Piecewise per dim; only the border reads no input)."""
    (ph, pw), (height, width) = padding, source.shape[-2:]
    dtype = source.dtype

    def fn(index):
        *lead, h, w = index
        tap = source.expr([*lead, h + (-ph), w + (-pw)])
        return _padded(h, ph, height, _padded(w, pw, width, tap, dtype), dtype)

    return _reindexed(source, (*source.shape[:-2], height + 2 * ph, width + 2 * pw), fn)


def phase_split(source: Value, stride: int) -> Pointwise:
    """``source`` [..., H, W] with its columns dealt into ``stride`` phases: a lazy value
    [stride, ..., H, ceil(W / stride)] whose phase ``p`` holds columns p, p + stride, ...
    (``-inf`` past the end), so a stride-``stride`` window reads each tap as one unit-stride
    run of one phase (a vector load, not a gather)."""
    width = source.shape[-1]
    columns = -(-width // stride)
    dtype = source.dtype

    def fn(index):
        phase, *lead, h, column = index
        selector = column.scale(stride) + phase  # the column of source
        return _padded(selector, 0, width, source.expr([*lead, h, selector]), dtype)

    return _reindexed(source, (stride, *source.shape[:-1], columns), fn)


def max_pool2d(source: Value, out_shape: tuple, kernel, stride, dilation) -> Pointwise:
    """The values of ``max_pool2d`` over a padded, phase-split ``source`` ([SW, ..., H, W']
    from ``phase_split(padded(x), SW)``; ``out_shape`` [..., OH, OW], float dtypes) as a
    lazy value with unit-stride reads along OW; every argument an (h, w) pair. A window
    that runs past the padded input (``ceil_mode``) is cut at its end, as PyTorch cuts it."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    height, columns = source.shape[-2:]
    dtype = source.dtype

    def fn(index):
        *lead, oh, ow = index
        best = None
        for i in range(kh):
            h = oh.scale(sh) + i * dh
            for j in range(kw):
                phase, shift = divmod(j * dw, sw)[::-1]  # column ow*sw + j*dw = phase + sw*(ow + shift)
                w = ow + shift
                tap = source.expr([Index.constant(phase), *lead, h, w])
                tap = _padded(h, 0, height, _padded(w, 0, columns, tap, dtype), dtype)
                best = tap if best is None else Op("maximum", (best, tap), dtype)
        return best

    return Pointwise(tuple(out_shape), dtype, fn, op_count=kh * kw - 1, op_names=("max_pool2d",))


def is_values_only(node) -> bool:
    """Whether only the values (output 0) of a ``max_pool2d_with_indices`` node are read."""
    return all(user.target is operator.getitem and user.args[1] == 0 for user in node.users)


def supported(source: Value) -> bool:
    """Float input of 3 or 4 dims with elements (other inputs stay ATen calls)."""
    return source.dtype in FLOAT_DTYPES and len(source.shape) in (3, 4) and source.numel > 0
