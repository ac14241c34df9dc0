"""Lower an attention block (``bmm`` of q and k^T, scale and masks, the decomposed softmax
over the keys, ``bmm`` with v) into a ``gemm.GemmStep`` of kind ``attention`` timed by PGO:

* ``unfused:<bmm1>+<bmm2>``: what aotpack lowers without this module, the two batched
  GEMMs (``bmm_lowering``) around the fused softmax kernel, once per combination of the two
  bmm steps' variants (``aten``, ``template``), so PGO still picks each bmm's implementation;
* ``template``: aotpack's fused attention kernel (``template_kernels.AttentionKernel``), which never
  writes the score matrix.

``find`` matches the graph as ``torch.export`` decomposes it (``export.EXTRA_DECOMPOSITIONS``):
``bmm(q, k^T)``, optionally viewed as ``[batch, heads, m, n]``, then any chain of ``mul``/``div``
by a Python number, ``add`` of a float32 tensor (an additive or causal mask) and
``where(bool mask, number, s)`` (``masked_fill``), then ``amax``/``sub``/``exp``/``sum``/``div``
over the last dimension, then views back to ``[batch, m, n]`` and ``bmm`` with v. Every
intermediate has no other reader. ``scaled_dot_product_attention`` stays an ATen call.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from aotpack.lower import bmm_lowering
from aotpack.lower import ops
from aotpack.ir.gemm import GemmStep, GemmVariant
from aotpack.ir.graph import Buffer, KernelCall, contiguous_strides
from aotpack.ir.template_kernels import AttentionKernel, AttentionOperand, ScoreOp

aten = torch.ops.aten
#: ops between the softmax and the second bmm, and after the first bmm, that keep the elements' order
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default,
          aten.clone.default)


@dataclass(eq=False)
class AttentionMatch:
    """One attention block: ``nodes`` (graph order, the second bmm last) become one step;
    ``ops`` are (kind, number, mask FX node or None) in the graph's order; ``scores`` the node
    whose shape the masks broadcast to."""

    nodes: list
    first: object
    second: object
    scores: object
    ops: list


def _val(node):
    return node.meta.get("val") if hasattr(node, "meta") else None


def _float32(node) -> bool:
    value = _val(node)
    return isinstance(value, torch.Tensor) and value.dtype == torch.float32


def _only_user(node, user) -> bool:
    return ops.users(node) == [user]


def _number(arg) -> float | None:
    """A Python number, or the value of a ``scalar_tensor`` node; else None."""
    if isinstance(arg, (int, float)) and not isinstance(arg, bool):
        return float(arg)
    if getattr(arg, "target", None) is aten.scalar_tensor.default and isinstance(arg.args[0], (int, float)):
        return float(arg.args[0])
    return None


def _order_preserving(node) -> bool:
    """A view/expand/clone that keeps the element order and the last two dimensions."""
    source, out = _val(node.args[0]), _val(node)
    if node.target is aten.expand.default and tuple(source.shape) != tuple(out.shape):
        return False
    if node.target is aten.clone.default and node.kwargs.get("memory_format") not in (None, torch.contiguous_format):
        return False
    return source.numel() == out.numel() and tuple(source.shape[-2:]) == tuple(out.shape[-2:])


def _back_through_views(node, user) -> tuple:
    """(the node before the order-preserving views ending at ``node``, the views), each view
    read by ``user`` (the next one) only."""
    views = []
    while node.target in _VIEWS and _only_user(node, user) and _order_preserving(node):
        views.append(node)
        node, user = node.args[0], node
    return node, views


def _softmax(node) -> tuple | None:
    """(scores node, the softmax's nodes) where ``node`` is ``exp(s - amax(s)) / sum(...)`` over the last dim."""
    if node.target is not aten.div.Tensor or len(node.args) != 2:
        return None
    exp, total = node.args
    if getattr(exp, "target", None) is not aten.exp.default:
        return None
    if getattr(total, "target", None) is not aten.sum.dim_IntList:
        return None
    last = len(_val(node).shape) - 1
    if total.args[0] is not exp or list(total.args[1]) not in ([-1], [last]) or not total.args[2:3] == (True,):
        return None
    sub = exp.args[0]
    if getattr(sub, "target", None) is not aten.sub.Tensor or len(sub.args) != 2 or sub.kwargs:
        return None
    scores, amax = sub.args
    if getattr(amax, "target", None) is not aten.amax.default or amax.args[0] is not scores:
        return None
    if list(amax.args[1]) not in ([-1], [last]) or amax.args[2:3] != (True,):
        return None
    if set(ops.users(exp)) != {total, node} or not _only_user(sub, exp) or not _only_user(amax, sub):
        return None
    if set(ops.users(scores)) != {amax, sub} or not _only_user(total, node):
        return None
    return scores, [amax, sub, exp, total, node]


def _score_chain(node, user, shape) -> tuple | None:
    """(first bmm, its nodes up to ``node``, ops in graph order) where ``node`` (read by
    ``user`` only, or by the softmax where ``user`` is None) is a chain of score ops over
    ``bmm(q, k^T)``; else None."""
    if user is not None and not _only_user(node, user):
        return None
    if node.target is aten.bmm.default:
        return (node, [node], []) if _float32(node) else None
    if node.target in _VIEWS:
        source = node.args[0]
        if getattr(source, "target", None) is aten.bmm.default and _only_user(source, node) \
                and _order_preserving(node) and _float32(source):
            return source, [source, node], []
        return None
    if tuple(_val(node).shape) != shape or not _float32(node) or node.kwargs:
        return None
    candidates = []
    if node.target in (aten.mul.Tensor, aten.div.Tensor) and len(node.args) == 2:
        kind = "mul" if node.target is aten.mul.Tensor else "div"
        for chain, other in ((0, 1), (1, 0)) if kind == "mul" else ((0, 1),):
            if _number(node.args[other]) is not None and hasattr(node.args[chain], "op"):
                candidates.append((node.args[chain], (kind, _number(node.args[other]), None)))
    elif node.target is aten.add.Tensor and len(node.args) == 2:
        for chain, other in ((0, 1), (1, 0)):
            if all(hasattr(a, "op") for a in node.args) and _float32(node.args[other]):
                candidates.append((node.args[chain], ("add", 0.0, node.args[other])))
    elif node.target is aten.where.self and len(node.args) == 3:
        cond, fill, chain = node.args
        value = _number(fill)
        if value is not None and hasattr(chain, "op") and hasattr(cond, "op") and _val(cond).dtype == torch.bool:
            candidates.append((chain, ("fill", value, cond)))
    for chain, op in candidates:
        found = _score_chain(chain, node, shape)
        if found is not None:
            first, nodes, chain_ops = found
            return first, nodes + [node], chain_ops + [op]
    return None


def find(graph) -> dict:
    """Second bmm FX node -> ``AttentionMatch`` for every attention block of ``graph``."""
    order = {node: index for index, node in enumerate(graph.nodes)}
    found = {}
    for second in graph.nodes:
        if second.target is not aten.bmm.default or len(second.args) != 2 or not _float32(second):
            continue
        if not all(_float32(a) for a in second.args):
            continue
        weights, views = _back_through_views(second.args[0], second)
        softmax = _softmax(weights) if hasattr(weights, "op") else None
        if softmax is None:
            continue
        scores, softmax_nodes = softmax
        chain = _score_chain(scores, None, tuple(_val(scores).shape))
        if chain is None:
            continue
        first, chain_nodes, chain_ops = chain
        nodes = sorted(set(chain_nodes + softmax_nodes + views + [second]), key=order.get)
        found[second] = AttentionMatch(nodes, first, second, scores, chain_ops)
    return found


def _mask_operand(lw, mask_node, shape: tuple, inputs: list) -> AttentionOperand:
    """The mask's strided parts broadcast to the scores' ``shape`` (``[*batch, m, n]``)."""
    base, mask_shape, strides, offset = lw.read_parts(lw.operand(mask_node))
    pad = len(shape) - len(mask_shape)
    full = [0] * pad + [s if size != 1 else 0 for size, s in zip(mask_shape, strides)]
    if base not in inputs:
        inputs.append(base)
    return AttentionOperand(inputs.index(base), offset, tuple(shape[:-2]), tuple(full))


def _operand(parts: tuple, inputs: list, swap: bool = False) -> AttentionOperand:
    base, batch_shape, strides, offset = parts
    if swap:  # k^T [batch, d, n] read as k [batch, n, d]
        strides = (*strides[:-2], strides[-1], strides[-2])
    if base not in inputs:
        inputs.append(base)
    return AttentionOperand(inputs.index(base), offset, tuple(batch_shape), tuple(strides))


def _operands(lw, match: AttentionMatch) -> tuple | None:
    """(inputs, q, k, v, score ops, batch shape) of the fused kernel, or None where the
    layouts do not fit. Called before the unfused lowering: a head view it reads in place is
    still lazy (the ATen bmm variant copies it inside its own steps); any other operand or
    mask that needs a buffer gets it here, before every variant."""
    parts = [bmm_lowering.batch_operand(lw, node, position)
             for node, position in ((match.first, 0), (match.first, 1), (match.second, 1))]
    operands = bmm_lowering.common_batch(*parts)
    if operands is None or any(p[0].kind == "packed" or min(p[2]) < 0 for p in operands):
        return None
    shape = tuple(_val(match.scores).shape)
    inputs: list = []
    q_op, k_op, v_op = (_operand(operands[0], inputs), _operand(operands[1], inputs, swap=True),
                        _operand(operands[2], inputs))
    score_ops = []
    for kind, value, mask in match.ops:
        operand = _mask_operand(lw, mask, shape, inputs) if mask is not None else None
        if operand is not None and (min(operand.strides) < 0 or inputs[operand.input].kind == "packed"):
            return None
        score_ops.append(ScoreOp(kind, value, operand))
    return inputs, q_op, k_op, v_op, tuple(score_ops), tuple(operands[0][1])


def _template_variant(lw, match: AttentionMatch, operands: tuple, out: Buffer) -> GemmVariant | None:
    """The ``AttentionKernel`` variant writing ``out`` from ``_operands``; None where ``out``
    is not contiguous."""
    if out.strides != contiguous_strides(out.shape):
        return None
    inputs, q_op, k_op, v_op, score_ops, batch_shape = operands
    _, m, d = _val(match.first.args[0]).shape
    n, dv = _val(match.second.args[1]).shape[-2:]
    kernel = AttentionKernel(f"attention_{len(lw.kernels)}", "attention", batch_shape, int(m), int(n),
                             int(d), int(dv), tuple(inputs), (out,), q_op, k_op, v_op, score_ops)
    lw.kernels.append(kernel)
    return GemmVariant("template", [KernelCall(kernel)], [])


def _unfused_variants(steps: list) -> list[GemmVariant]:
    """``steps`` (the unfused lowering, its bmm ``GemmStep``s inside) as one variant per
    combination of the bmm steps' variants, all-ATen first."""
    gemms = [s for s in steps if isinstance(s, GemmStep)]
    variants = []
    for combination in itertools.product(*(g.variants for g in gemms)):
        chosen = {id(g): v for g, v in zip(gemms, combination)}
        flat = [x for s in steps for x in (chosen[id(s)].steps if id(s) in chosen else [s])]
        names = "+".join(v.name for v in combination) or "fused_softmax"
        variants.append(GemmVariant(f"unfused:{names}", flat, []))
    return variants


def lower(lw, match: AttentionMatch):
    """The second bmm's value: its output buffer, written by a new ``GemmStep`` (kind
    ``attention``) appended to ``lw.steps`` when the fused kernel fits, else the unfused
    lowering's steps alone.

    Args:
        lw: the ``lowering.Lowerer``; match: from ``find``.
    """
    # the fused kernel's operands only where the backend renders it (``Backend.template_kinds``)
    operands = _operands(lw, match) if "attention" in lw.backend.template_kinds else None
    outer, lw.steps = lw.steps, []
    for node in match.nodes:
        lw.env[node] = bmm_lowering.lower(lw, node) if bmm_lowering.applies(node) else lw.lower_op(node)
    unfused, lw.steps = lw.steps, outer
    out = lw.env[match.second]
    template = _template_variant(lw, match, operands, out) if operands and isinstance(out, Buffer) else None
    if template is None:
        lw.steps.extend(unfused)
        return out
    kernel = template.steps[0].kernel
    shape = f"{kernel.batch}x{kernel.m}x{kernel.n}x{kernel.d}x{kernel.dv}"
    lw.steps.append(GemmStep(f"attention_{match.second.name}", "attention", shape,
                             ",".join(op.kind for op in kernel.ops) or "none",
                             [*_unfused_variants(unfused), template], out))
    return out
