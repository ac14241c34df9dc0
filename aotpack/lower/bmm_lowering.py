"""Lower a batched GEMM of two runtime operands (``aten.bmm``, or an ``aten.mm`` that is
not a linear with a constant weight) into a ``gemm.GemmStep`` timed by PGO:

* ``aten``: the ATen call, as aotpack lowered it before (operands passed as strided views);
* ``template``: aotpack's batched GEMM kernel (``template_kernels.BmmKernel``), reading both
  operands in place at their strides.

Operands come from the lowering's affine reads (``ir.affine_read``), so the head views of a
qkv projection (``q``, ``k^T``, ``v``) reach the kernel without copies. Where a view's batch
does not collapse into one stride (batch x heads of a transposed projection), the operand
that ATen needs copied is read by the template as a two-dimensional batch instead
(``_head_read``). Only float32, non-empty, contiguous outputs; anything else stays the ATen
call alone.
"""
from __future__ import annotations

import torch

from aotpack.ir import kernel as kernel_ir
from aotpack.lower import ops
from aotpack.ir.gemm import GemmStep, GemmVariant
from aotpack.ir.index import Atom, Index
from aotpack.ir.graph import Buffer, ExternCall, KernelCall, Lazy, affine_read, contiguous_strides
from aotpack.ir.template_kernels import BmmKernel

aten = torch.ops.aten
BATCHED = (aten.bmm.default, aten.mm.default)


def _val(node):
    return node.meta.get("val") if hasattr(node, "meta") else None


def applies(node) -> bool:
    """``node`` is a float32 ``bmm``/``mm`` of two tensors with elements."""
    if node.target not in BATCHED or len(node.args) != 2 or node.kwargs:
        return False
    values = [_val(a) for a in node.args] + [_val(node)]
    return (all(isinstance(v, torch.Tensor) and v.dtype == torch.float32 for v in values)
            and values[-1].numel() > 0 and values[0].shape[-1] > 0)


def _head_read(value) -> tuple | None:
    """``(base, (batch // d, d), (s0, s1, s2, s3), offset)`` of a lazy ``[batch, M, K]`` value
    that reads one buffer at ``(i0 / d) * s0 + (i0 % d) * s1 + i1 * s2 + i2 * s3 + offset``:
    batch x heads of a transposed projection, which no single batch stride describes (ATen
    needs it copied); None for any other value."""
    if not isinstance(value, Lazy) or value.realized is not None or value.reduces or len(value.shape) != 3:
        return None
    shape = tuple(value.shape)
    expr = value.expr([Index.var(f"i{d}", size) for d, size in enumerate(shape)])
    while isinstance(expr, kernel_ir.Op) and expr.name == "identity" and expr.args[0].dtype == expr.dtype:
        expr = expr.args[0]
    if not isinstance(expr, kernel_ir.Load) or expr.index.const < 0:
        return None
    batch, split = Index.var("i0", shape[0]), {}
    for name, coef, _extent in expr.index.terms:
        if isinstance(name, Atom) and name.operand == batch and name.op in ("/", "%"):
            split[name.op] = (name.divisor, coef)
        elif name not in ("i1", "i2"):
            return None
    divisors = {d for d, _ in split.values()}
    if len(divisors) != 1 or shape[0] % next(iter(divisors)):
        return None
    heads = divisors.pop()
    strides = (split.get("/", (0, 0))[1], split.get("%", (0, 0))[1],
               expr.index.coefficient("i1"), expr.index.coefficient("i2"))
    return expr.buffer, (shape[0] // heads, heads), strides, expr.index.const


def in_place_head(lw, node, position: int) -> tuple | None:
    """``_head_read`` of ``node``'s operand at ``position`` where the template reads it in
    place and ATen's variant copies it: a head view no other node reads; else None."""
    arg = node.args[position]
    value = lw.operand(arg)
    # the ATen variant's copy must be the value's only storage: no other node reads it
    alone = ops.users(arg) == [node] and sum(1 for v in lw.env.values() if v is value) == 1
    return _head_read(value) if alone and affine_read(value) is None else None


def batch_operand(lw, node, position: int) -> tuple:
    """``node``'s operand at ``position`` as (base, batch_shape, strides, offset), read as the
    batched GEMM template reads it: a head view in place, else its strided parts (a lazy
    value computed into a buffer first, before any variant)."""
    head = in_place_head(lw, node, position)
    return head if head is not None else _as_batch(lw.read_parts(lw.operand(node.args[position])))


def common_batch(*operands: tuple) -> tuple | None:
    """``operands`` (base, batch_shape, strides, offset) over one batch shape: a batch of one
    dimension is split as the others' two, or None where two split differently."""
    shapes = {p[1] for p in operands if len(p[1]) == 2}
    if len(shapes) > 1:
        return None
    if not shapes:
        return operands
    outer, heads = shapes.pop()

    def split(parts):
        base, batch_shape, strides, offset = parts
        if len(batch_shape) == 2:
            return parts
        return base, (outer, heads), (strides[0] * heads, strides[0], *strides[1:]), offset
    return tuple(split(p) for p in operands)


def _as_batch(parts: tuple) -> tuple:
    """Strided parts ``[batch, M, K]`` (or a 2-D ``mm`` operand) as ``(base, batch_shape,
    strides, offset)``."""
    base, shape, strides, offset = parts
    if len(shape) == 2:
        return base, (1,), (0, *strides), offset
    return base, (shape[0],), tuple(strides), offset


def lower(lw, node):
    """The node's value: the output buffer of the ATen call, inside a new ``GemmStep``
    appended to ``lw.steps`` when the template fits, else alone.

    An operand the ATen call needs copied is copied before the step (every variant reads
    the copy), except a head view ``_head_read`` describes whose only reader is this node:
    its copy is part of the ATen variant and the template reads the view in place.

    Args:
        lw: the ``lowering.Lowerer``; node: a node ``applies`` accepts.
    """
    heads = {}
    for position in range(len(node.args)):
        head = in_place_head(lw, node, position)
        if head is None:
            lw.read_parts(lw.operand(node.args[position]))
        else:
            heads[position] = head
    outer, lw.steps = lw.steps, []
    out = lw.extern(node)
    aten_steps, lw.steps = lw.steps, outer
    variant = None
    call = aten_steps[-1]
    if isinstance(call, ExternCall) and call.outputs == [out] and isinstance(out, Buffer):
        operands = common_batch(*(heads.get(p) or _as_batch(call.args[p].value) for p in (0, 1)))
        variant = _template_variant(lw, node, *operands, out) if operands else None
    if variant is None:
        lw.steps.extend(aten_steps)
        return out
    kernel = variant.steps[0].kernel
    shape = f"{kernel.batch}x{kernel.m}x{kernel.k}x{kernel.n}"
    lw.steps.append(GemmStep(f"bmm_{node.name}", "bmm", shape, "none",
                             [GemmVariant("aten", aten_steps, []), variant], out))
    return out


def _template_variant(lw, node, a: tuple, b: tuple, out: Buffer) -> GemmVariant | None:
    """The ``BmmKernel`` variant writing ``out`` from ``a``/``b`` (base, batch_shape, strides,
    offset), or None where the layouts do not fit or the backend has no bmm template."""
    if "bmm" not in lw.backend.template_kinds:
        return None
    (a_base, batch_shape, a_strides, a_offset), (b_base, _, b_strides, b_offset) = a, b
    if out.strides != contiguous_strides(out.shape) or min(a_strides + b_strides) < 0:
        return None
    if a_base.kind == "packed" or b_base.kind == "packed":
        return None
    m, k = _val(node.args[0]).shape[-2:]
    n = _val(node).shape[-1]
    inputs = [a_base] if b_base is a_base else [a_base, b_base]
    # named by position, not lw.counter: offering the template renames no other buffer or kernel
    kernel = BmmKernel(f"bmm_{len(lw.kernels)}", "bmm", tuple(batch_shape), int(m), int(n), int(k), tuple(inputs),
                       (out,), a_offset, tuple(a_strides), b_offset, tuple(b_strides), len(inputs) - 1)
    lw.kernels.append(kernel)
    return GemmVariant("template", [KernelCall(kernel)], [])
