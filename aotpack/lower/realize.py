"""When a lazy value gets a buffer, and the fused kernel that writes it.

A lazy value is realised when an extern call or a graph output needs storage, when its
chain grows past ``MAX_FUSED_OPS``, or when several users would otherwise recompute
something costly (``maybe_realize``). ``realize`` builds the kernel: its iteration
domain (reshaped where that makes loads affine in ``j``), extra outputs for shared values
it reads, and a buffer for any reduction read at other rows than its own.
"""
from __future__ import annotations

import functools
import math

import torch

from aotpack.ir.graph import (Buffer, ExternArg, ExternCall, KernelCall, Lazy, Reduction, StridedView, Value,
                              affine_read, as_strided_parts, contiguous_strides, flat_index, unflatten_index)
from aotpack.ir.kernel import (FusedKernel, Load, foreign_reduction, has_reduce, inner_access, inner_var, row_vars,
                               walk, input_buffers)
from aotpack.lower import ops
from aotpack.lower.registry import meta

#: A lazy chain longer than this gets a buffer, to bound kernel size and compile time.
MAX_FUSED_OPS = 48
#: Inner loops shorter than this vectorise poorly: try merging outer dimensions in.
NARROW_INNER = 64


def maybe_realize(lw, node, value: Lazy) -> None:
    """Give the fresh lazy value of ``node`` a buffer now when its chain is too long or its
    users would recompute something costly; a costly value feeding a row reduction is
    queued in ``lw.shared`` instead (the row kernel that first reads it writes it)."""
    fanout = len(ops.users(node))
    if fanout > 1 and not value.reduces and _disjoint_slices(node):
        fanout = 1  # split into head and tail: each element is still computed once
    # recomputing a few ops on a small tensor in each user is cheaper than a kernel
    # launch of its own plus a round trip through memory
    cheap = not value.expensive and value.numel * value.op_count * (fanout - 1) <= lw.backend.recompute_budget
    costly = (value.op_count >= 2 or value.expensive) and not cheap
    if value.op_count > MAX_FUSED_OPS:
        realize(lw, value)
    elif fanout > 1 and costly and not (value.reduces and _row_local_users(node)):
        if not value.reduces and not value.expensive and _feeds_row_reduction(node):
            lw.shared.append(value)  # written by the row kernel that first reads it
        else:
            realize(lw, value)


def _feeds_row_reduction(node) -> bool:
    """Some user reduces ``node``'s trailing dims (a LayerNorm after a residual add)."""
    rank = len(meta(node).shape)
    for user in ops.users(node):
        if user.target in ops.REDUCTIONS or user.target in ops.VARIANCES or \
                user.target is torch.ops.aten.var_mean.correction:
            dims = user.args[1] if len(user.args) > 1 else user.kwargs.get("dim")
            dims = [dims] if isinstance(dims, int) else list(dims or range(rank))
            if rank and sorted(d % rank for d in dims) == list(range(rank - len(dims), rank)):
                return True
    return False


def _shared_outputs(lw, value: Lazy, outer: tuple, inner: int, build, absorb: bool) -> list[Lazy]:
    """Shared values (``lw.shared``) the kernel of ``value`` over ``outer x (inner,)``
    reads, each written as an extra output of that kernel when ``absorb`` and it is
    read at the kernel's own element only; any other read gives it a kernel of its
    own first (so a shared value is never recomputed by two kernels).

    Found by giving each pending shared value a stand-in buffer while the kernel's
    IR is built (``build(values)`` -> exprs): a load of a stand-in is a read of that value.
    """
    absorbed = []
    while True:
        pending = [v for v in lw.shared if v.realized is None and all(v is not a for a in absorbed)]
        for v in pending:
            v.realized = Buffer("shared", tuple(v.shape), contiguous_strides(v.shape), v.dtype, "kernel")
        exprs = build([value])
        stand_ins = {id(v.realized): v for v in pending}
        loads = [node for expr in exprs for node in walk(expr)
                 if isinstance(node, Load) and id(node.buffer) in stand_ins]
        read = {id(node.buffer): node.buffer for node in loads}
        own = {}
        for v in pending:
            stand_in = v.realized
            v.realized = None
            if id(stand_in) in read and v.numel == math.prod(outer) * inner:
                position = flat_index(row_vars(outer) + [inner_var(inner)], tuple(outer) + (inner,))
                own[id(stand_in)] = stand_in.expr(unflatten_index(position, v.shape)).index
        if not read:
            return absorbed
        for key, stand_in in read.items():
            v = stand_ins[key]
            if absorb and key in own and all(n.index == own[key] for n in loads if n.buffer is stand_in):
                absorbed.append(v)
            else:
                realize(lw, v)


def _row_local_users(node) -> bool:
    """Every user reduces ``node``'s rows or maps them elementwise (softmax's exp).

    Such a value is recomputed per row inside one row kernel, from data already
    in cache, instead of costing a second kernel and a round trip to memory.
    """
    shape = tuple(meta(node).shape)
    for user in ops.users(node):
        if (user.target in ops.REDUCTIONS or user.target in ops.VARIANCES
                or user.target is torch.ops.aten.var_mean.correction):
            continue
        elementwise = user.target in ops.UNARY or user.target in ops.BINARY
        if not elementwise or tuple(meta(user).shape) != shape:
            return False
    return True


def realize(lw, value: Value) -> Buffer | StridedView:
    """Give ``value`` storage: a fused kernel (appended to ``lw.kernels`` and ``lw.steps``)
    writes it into a contiguous buffer. A buffer or view comes back as it is."""
    if not isinstance(value, Lazy):
        return value
    if value.realized is not None:
        return value.realized
    shape = tuple(value.shape)
    if isinstance(value, Reduction):
        outer, inner = tuple(value.outer_shape), value.reduce_size
    else:
        outer, inner = (shape[:-1], shape[-1]) if shape else ((), 1)
    lw.counter += 1
    buf = Buffer(f"buf{lw.counter}", shape, contiguous_strides(shape), value.dtype, "kernel")
    if value.numel == 0:  # nothing to compute: just allocate
        value.realized = buf
        lw.steps.append(_empty(buf))
        return buf
    names = "_".join(dict.fromkeys(value.op_names)) or "copy"
    base_name = f"fused_{names[:48]}"
    name = f"{base_name}_{lw.counter}"
    row_outputs = (0,) if isinstance(value, Reduction) else ()
    build = functools.partial(_output_exprs, outer=outer, inner=inner)
    while True:  # a reduction read at other rows than its own needs a buffer first
        exprs = _output_exprs([value], outer, inner)
        foreign = foreign_reduction(exprs, outer)
        if foreign is None:
            break
        epilogue = None if row_outputs else _row_epilogue(value, foreign)
        if epilogue is not None:  # computed once per row of the reduction it reads
            outer, inner, exprs = epilogue
            row_outputs = (0,)
            build = functools.partial(_row_exprs, outer=outer)
            break
        realize(lw, foreign.origin)
    outputs, values = [buf], [value]
    if lw.shared:
        values += _shared_outputs(lw, value, outer, inner, build, absorb=has_reduce(exprs) and not row_outputs)
        exprs = build(values)
        for v in values[1:]:
            lw.counter += 1
            outputs.append(Buffer(f"buf{lw.counter}", tuple(v.shape), contiguous_strides(v.shape), v.dtype,
                                  "kernel"))
    access = inner_access(exprs, inner)
    if not has_reduce(exprs) and (access.divisors or inner < NARROW_INNER):
        outer, inner, exprs, access = _choose_domain(value, outer, inner, exprs, access)
    kernel = FusedKernel(name, base_name, tuple(outer), inner, tuple(input_buffers(exprs)), tuple(outputs),
                         tuple(exprs), access, has_reduce(exprs), row_outputs)
    for v, out in zip(values, outputs):
        v.realized = out
    lw.kernels.append(kernel)
    lw.steps.append(KernelCall(kernel))
    return buf


def _empty(buf: Buffer) -> ExternCall:
    """``aten::empty_strided`` writing ``buf`` (for tensors with no elements)."""
    args = [ExternArg("int_list", list(buf.shape)), ExternArg("int_list", list(buf.strides)),
            ExternArg("scalar_type", buf.dtype), ExternArg("none", None),
            ExternArg("none", None), ExternArg("none", None)]
    return ExternCall(torch.ops.aten.empty_strided.default, args, [buf])


def read_parts(lw, value: Value) -> tuple:
    """Strided parts for a reader that takes strides (an extern call, a GEMM's
    input): a lazy plain read of a buffer is passed as that view, with no copy."""
    return affine_read(value) or strided(lw, value)


def strided(lw, value: Value) -> tuple:
    """``(base, shape, strides, offset)`` of ``value``, realising it first when it is not a view."""
    parts = as_strided_parts(value)
    if parts is None:
        realize(lw, value)
        parts = as_strided_parts(value)
    return parts


def _disjoint_slices(node) -> bool:
    """Every user of ``node`` takes a unit-step slice along one and the same dim, and no
    two slices overlap (``x[:4]`` and ``x[4:]``): together they read each element once."""
    users = ops.users(node)
    shape = tuple(meta(node).shape)
    if not shape or any(u.target is not torch.ops.aten.slice.Tensor or u.kwargs for u in users):
        return False
    spans = []
    for user in users:
        dim, start, end, step = (list(user.args[1:]) + [0, None, None, 1][len(user.args) - 1:])[:4]
        dim = dim % len(shape)
        size = shape[dim]
        start, end = (0 if start is None else start), (size if end is None else end)
        start, end = [min(max(v + size if v < 0 else v, 0), size) for v in (start, end)]
        spans.append((dim, start, end, step))
    spans.sort(key=lambda span: span[1])
    return (len({span[0] for span in spans}) == 1 and all(span[3] == 1 for span in spans)
            and all(a[2] <= b[1] for a, b in zip(spans, spans[1:])))


def _output_exprs(values: list, outer: tuple, inner: int) -> list:
    """IR of each output over the domain ``outer x (inner,)``.

    A reduction output is read once per row; any other output may refine its shape
    in the domain (same elements, row-major), so its index is re-derived from the
    domain's flat position.
    """
    own_rows = row_vars(tuple(outer))
    domain = own_rows + [inner_var(inner)]
    exprs = []
    for value in values:
        if isinstance(value, Reduction):  # the kernel's own reduction (bypass .realized)
            exprs.append(value.node(own_rows))
        else:
            exprs.append(value.fn(unflatten_index(flat_index(domain, tuple(outer) + (inner,)), value.shape)))
    return exprs


def _row_exprs(values: list, outer: tuple) -> list:
    """IR of each value, one element per row of ``outer`` (row-major)."""
    rows = row_vars(outer)
    return [value.fn(unflatten_index(flat_index(rows, outer), value.shape)) for value in values]


def _row_epilogue(value, foreign) -> tuple | None:
    """(outer, inner, exprs) computing pointwise ``value`` once per row of the reduction
    ``foreign`` it reads (``sqrt(var)``, a mean reshaped to drop its kept dims), or None.

    ``value`` must have one element per reduction row, in row order, and every
    reduction it reads must then be read at its own rows (checked on the IR: a
    transposing view of the result does not qualify and gets a buffer as before).
    """
    red = foreign.origin
    if not isinstance(red, Reduction) or red.realized is not None or value.numel != red.numel:
        return None
    outer = tuple(red.outer_shape)
    exprs = _row_exprs([value], outer)
    if foreign_reduction(exprs, outer) is not None:
        return None
    return outer, red.reduce_size, exprs


def _choose_domain(value, outer: tuple, inner: int, exprs: list, access, depth: int = 0):
    """Reshape a pointwise kernel's iteration domain when that makes loads affine in j.

    The output is contiguous, so any row-major refinement of its shape is exact:
    * a narrow inner dimension merges with the dimensions before it while every load
      stays affine ((1M, 3) becomes one long vectorisable loop);
    * an inner dimension read as ``j // d`` and ``j % d`` (a reshape merging heads
      back) splits into ``(N/d, d)``, so the inner loop carries no div/mod; again while
      the new inner dimension is still divided (up to three splits: a cat of halves read
      with a step, ``(j % 64) % 32``, needs two).

    Returns:
        (outer, inner, exprs, access) of the chosen domain (the given one if no trial wins).
    """
    shape = tuple(outer) + (inner,)
    trials = []
    if inner < NARROW_INNER:
        trials += [(shape[:k], math.prod(shape[k:])) for k in range(len(shape) - 2, -1, -1)]
    trials += [(tuple(outer) + (inner // d,), d) for d in access.divisors if d < inner and inner % d == 0]
    for trial_outer, trial_inner in trials:
        trial_exprs = _output_exprs([value], trial_outer, trial_inner)
        trial = inner_access(trial_exprs, trial_inner)
        if trial.divisors and trial_inner < inner and depth < 2:
            trial_outer, trial_inner, trial_exprs, trial = _choose_domain(
                value, trial_outer, trial_inner, trial_exprs, trial, depth + 1)
        if not trial.divisors and trial.strided <= access.strided:
            return tuple(trial_outer), trial_inner, trial_exprs, trial
    return tuple(outer), inner, exprs, access
