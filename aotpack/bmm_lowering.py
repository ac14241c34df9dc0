"""Lower a batched GEMM of two runtime operands (``aten.bmm``, or an ``aten.mm`` that is
not a linear with a constant weight) into a ``gemm.GemmStep`` timed by PGO:

* ``aten``: the ATen call, as aotpack lowered it before (operands passed as strided views);
* ``template``: aotpack's batched GEMM kernel (``kernel_ir.BmmKernel``), reading both
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

from aotpack.gemm import GemmStep, GemmVariant
from aotpack.ir import Buffer, ExternCall, KernelCall, contiguous_strides
from aotpack.kernel_ir import BmmKernel

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


def _batched(parts: tuple) -> tuple:
    """A 2-D view (``mm``'s operand) as a batch of one."""
    base, shape, strides, offset = parts
    if len(shape) == 2:
        return base, (1, *shape), (0, *strides), offset
    return parts


def lower(lw, node):
    """The node's value: the output buffer of the ATen call, inside a new ``GemmStep``
    appended to ``lw.steps`` when the template fits, else alone.

    Args:
        lw: the ``lowering.Lowerer``; node: a node ``applies`` accepts.
    """
    for arg in node.args:  # any copy an operand needs is made before the step, for every variant
        lw._read_parts(lw._operand(arg))
    outer, lw.steps = lw.steps, []
    out = lw._extern(node)
    aten_steps, lw.steps = lw.steps, outer
    variant = None
    if len(aten_steps) == 1 and isinstance(aten_steps[0], ExternCall) and isinstance(out, Buffer):
        a, b = (_batched(arg.value) for arg in aten_steps[0].args)
        variant = _template_variant(lw, node, a, b, out)
    if variant is None:
        lw.steps.extend(aten_steps)
        return out
    kernel = variant.steps[0].kernel
    shape = f"{kernel.batch}x{kernel.m}x{kernel.k}x{kernel.n}"
    lw.steps.append(GemmStep(f"bmm_{node.name}", "bmm", shape, "none",
                             [GemmVariant("aten", aten_steps, []), variant], out))
    return out


def _template_variant(lw, node, a: tuple, b: tuple, out: Buffer) -> GemmVariant | None:
    """The ``BmmKernel`` variant writing ``out``, or None where the layouts do not fit."""
    (a_base, (batch, m, k), a_strides, a_offset), (b_base, b_shape, b_strides, b_offset) = a, b
    n = b_shape[-1]
    if out.strides != contiguous_strides(out.shape) or min(a_strides + b_strides) < 0:
        return None
    if a_base.kind == "packed" or b_base.kind == "packed":
        return None
    inputs = [a_base] if b_base is a_base else [a_base, b_base]
    # named by position, not lw.counter: offering the template renames no other buffer or kernel
    kernel = BmmKernel(f"bmm_{len(lw.kernels)}", "bmm", (batch,), m, n, k, tuple(inputs), (out,),
                       a_offset, tuple(a_strides), b_offset, tuple(b_strides), len(inputs) - 1)
    lw.kernels.append(kernel)
    return GemmVariant("template", [KernelCall(kernel)], [])
