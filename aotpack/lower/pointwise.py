"""Pointwise ops (unary, binary with broadcasting, where, clamp, rounding division, copies,
eval-mode batch norm) as lazy ``Pointwise`` values that fuse into their consumers."""
from __future__ import annotations

import torch

from aotpack.ir.graph import Lazy, Pointwise, Value
from aotpack.ir.kernel import Cast, Const, Op
from aotpack.lower import extern, ops, views
from aotpack.lower.registry import lowers, meta


def _compute_dtype(node, operands, compare: bool) -> torch.dtype:
    """The op's output dtype, or for comparisons the dtype torch compares in
    (``torch.result_type``: 0-d tensors and Python scalars promote weakly)."""
    out = meta(node).dtype
    if not compare:
        return out
    probes = [torch.empty(v.shape, dtype=v.dtype, device="meta") if isinstance(v, Value) else v
              for v in operands]
    if len(probes) == 1:
        return probes[0].dtype
    a, b = probes
    return torch.result_type(b, a) if not isinstance(a, torch.Tensor) else torch.result_type(a, b)


def pointwise(lw, node, args, name: str, expensive: bool, compare=False, where=False, params=()) -> Pointwise | None:
    """``node`` as the IR op ``name`` of ``args`` (FX nodes or Python scalars), broadcast to
    the node's shape; each operand is cast to the compute dtype (``bool`` for ``where``'s
    condition). None when an operand is neither a tensor value nor a scalar."""
    operands = [lw.operand(a) for a in args]
    if any(not isinstance(v, (Value, int, float, bool)) for v in operands):
        return None
    out_shape = tuple(meta(node).shape)
    out_dtype = meta(node).dtype
    compute = _compute_dtype(node, operands, compare)
    lazy = [v for v in operands if isinstance(v, Lazy) and v.realized is None]

    def fn(index):
        exprs = []
        for pos, v in enumerate(operands):
            want = torch.bool if where and pos == 0 else compute
            if isinstance(v, Value):
                expr = v.expr(views.broadcast_index(v.shape, out_shape, index))
                exprs.append(expr if v.dtype == want else Cast(expr, want))
            else:
                exprs.append(Const(v, want))
        return Op(name, tuple(exprs), out_dtype, tuple(params))

    return Pointwise(out_shape, out_dtype, fn,
                     op_count=(name != "identity") + sum(v.op_count for v in lazy),
                     expensive=expensive or any(v.expensive for v in lazy),
                     op_names=sum((v.op_names for v in lazy), ()) + (ops.short_name(node.target),),
                     reduces=any(v.reduces for v in lazy))


@lowers(ops.UNARY)
def _unary(lw, node):
    op = node.target
    name, expensive = ops.UNARY[op]
    source_dtype = meta(node.args[0]).dtype
    if op is torch.ops.aten.bitwise_not.default and source_dtype == torch.bool:
        name = "logical_not"  # ~true is -2, which is true again as a bool
    if op in ops.ROUNDING and not source_dtype.is_floating_point:
        name = "identity"  # integers are already whole (a double round trip loses bits)
    # predicates (isnan, logical_not) test the input, not its cast to bool
    predicate = meta(node).dtype == torch.bool and source_dtype != torch.bool
    return pointwise(lw, node, [node.args[0]], name, expensive, compare=predicate)


@lowers(ops.BINARY)
def _binary(lw, node):
    op = node.target
    a, b = node.args[0], node.args[1]
    alpha = node.kwargs.get("alpha", node.args[2] if len(node.args) > 2 else 1)
    params = ()
    if alpha != 1 and op in (torch.ops.aten.add.Tensor, torch.ops.aten.sub.Tensor):
        params = (alpha,)
    elif op is torch.ops.aten.pow.Tensor_Scalar and b in ops.POW_SPECIAL:
        return pointwise(lw, node, [a], ops.POW_SPECIAL[b], False)
    return pointwise(lw, node, [a, b], ops.BINARY[op], op in ops.EXPENSIVE_BINARY,
                     compare=op in ops.COMPARISONS, params=params)


@lowers(torch.ops.aten.where.self)
def _where(lw, node):
    return pointwise(lw, node, list(node.args[:3]), "where", False, where=True)


@lowers(torch.ops.aten.clamp.default, torch.ops.aten.clamp_min.default, torch.ops.aten.clamp_max.default)
def _clamp(lw, node):
    """clamp with Python-number bounds (a tensor bound in the scalar overload: extern)."""
    op = node.target
    low = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
    high = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
    if op is torch.ops.aten.clamp_max.default:
        low, high = None, node.args[1]
    if any(hasattr(b, "op") for b in (low, high)):
        return None
    return pointwise(lw, node, [node.args[0]], "clamp", False, params=(low, high))


@lowers(ops.CLAMP_TENSOR)
def _clamp_tensor(lw, node):
    """clamp with tensor bounds: min(max(x, low), high) in the promoted dtype (ATen's
    clamp kernel; a missing bound makes it ATen's maximum or minimum)."""
    op, values = node.target, dict((a.name, v) for a, v in extern.schema_values(node))
    if op is torch.ops.aten.clamp_min.Tensor:
        low, high = values["min"], None
    elif op is torch.ops.aten.clamp_max.Tensor:
        low, high = None, values["max"]
    else:
        low, high = values["min"], values["max"]
    if low is None and high is None:
        return None  # ATen raises: at least one bound is required
    name = "clamp_tensor" if low is not None and high is not None else ("maximum" if high is None else "minimum")
    return pointwise(lw, node, [node.args[0]] + [b for b in (low, high) if b is not None], name, False)


@lowers(ops.PARAMETRIC)
def _parametric(lw, node):
    name, expensive = ops.PARAMETRIC[node.target]
    params = tuple(value for _, value in extern.schema_values(node)[1:])
    return pointwise(lw, node, [node.args[0]], name, expensive, params=params)


@lowers(ops.DIV_WITH_MODE, ops.REMAINDERS)
def _rounding_division(lw, node):
    """div with rounding_mode and remainder, in the promoted dtype, as ATen computes them.

    Integer division fuses only by a nonzero Python number: ATen raises on an
    integer division by zero, which a kernel cannot, so a tensor divisor stays an
    extern call there. Float division by zero gives inf/nan, as in eager.
    """
    values = dict((a.name, v) for a, v in extern.schema_values(node))
    if node.target in ops.REMAINDERS:
        name = "remainder"
    else:
        mode = values.get("rounding_mode")
        if mode not in ops.DIV_ROUNDING:
            return None
        name = ops.DIV_ROUNDING[mode]
    a, b = node.args[0], node.args[1]
    if not meta(node).dtype.is_floating_point:
        if not isinstance(b, (int, float)) or isinstance(b, bool) or b == 0:
            return None
    return pointwise(lw, node, [a, b], name, name in ("remainder", "div_floor"))  # fmod inside


@lowers(torch.ops.aten.gelu.default)
def _gelu(lw, node):
    """The erf GELU (the tanh approximation runs as an extern call)."""
    if node.kwargs.get("approximate", "none") != "none":
        return None
    return pointwise(lw, node, [node.args[0]], "gelu", True)


@lowers(ops.COPIES)
def _copy(lw, node):
    """A same-device, same-shape copy: the identity (the consumer reads the source)."""
    source = lw.operand(node.args[0])
    val = meta(node)
    if val.device != meta(node.args[0]).device or tuple(val.shape) != tuple(source.shape):
        return None
    return pointwise(lw, node, [node.args[0]], "identity", False)


@lowers(torch.ops.aten._native_batch_norm_legit_no_training.default)
def _batch_norm(lw, node):
    """Eval-mode batch norm: a per-channel (dim 1) affine map, fused as pointwise."""
    x, weight, bias, mean, var = (lw.operand(a) for a in node.args[:5])
    eps = node.args[6] if len(node.args) > 6 else 1e-5
    stats = [v for v in (weight, bias, mean, var) if v is not None]
    if not isinstance(x, Value) or len(x.shape) < 2:
        return None
    channels = x.shape[1]
    if any(not isinstance(v, Value) or tuple(v.shape) != (channels,) for v in stats):
        return None
    out_shape = tuple(x.shape)

    def fn(index):
        channel = [index[1]]
        value = x.expr(index)
        m = mean.expr(channel) if mean is not None else Const(0.0, x.dtype)
        v = var.expr(channel) if var is not None else Const(1.0, x.dtype)
        scale = Op("rsqrt_eps", (v,), x.dtype, (float(eps),), convert=False)
        y = Op("normalize", (value, m, scale), x.dtype, convert=False)
        if weight is not None:
            y = Op("mul", (y, weight.expr(channel)), x.dtype, convert=False)
        if bias is not None:
            y = Op("add", (y, bias.expr(channel)), x.dtype, convert=False)
        return y

    lazy = [x] if isinstance(x, Lazy) and x.realized is None else []
    out = Pointwise(out_shape, x.dtype, fn, op_count=4 + sum(v.op_count for v in lazy),
                    expensive=any(v.expensive for v in lazy),
                    op_names=sum((v.op_names for v in lazy), ()) + ("batch_norm",),
                    reduces=any(v.reduces for v in lazy))
    return (out, None, None)
