"""Which ATen ops fuse, and the kernel IR op (``kernel_ir.Op.name``) each one becomes.

Backends render IR op names (``aotpack/backends/<name>/``); this table only says what
fuses. Everything not listed here runs as an extern call into ATen (see ``lowering``).
"""
from __future__ import annotations

import torch

aten = torch.ops.aten
prims = torch.ops.prims

#: op -> (IR op name, expensive). "expensive" ops are worth a buffer when a value
#: has several users, rather than being recomputed in each (transcendentals).
UNARY = {
    aten.neg.default: ("neg", False),
    aten.relu.default: ("relu", False),
    aten.abs.default: ("abs", False),
    aten.exp.default: ("exp", True),
    aten.exp2.default: ("exp2", True),
    aten.expm1.default: ("expm1", True),
    aten.log.default: ("log", True),
    aten.log2.default: ("log2", True),
    aten.log1p.default: ("log1p", True),
    aten.sqrt.default: ("sqrt", False),
    aten.rsqrt.default: ("rsqrt", False),
    aten.reciprocal.default: ("reciprocal", False),
    aten.sigmoid.default: ("sigmoid", True),
    aten.tanh.default: ("tanh", True),
    aten.erf.default: ("erf", True),
    aten.sin.default: ("sin", True),
    aten.cos.default: ("cos", True),
    aten.floor.default: ("floor", False),
    aten.ceil.default: ("ceil", False),
    aten.round.default: ("round", False),
    aten.trunc.default: ("trunc", False),
    aten.sign.default: ("sign", False),
    aten.logical_not.default: ("logical_not", False),
    aten.bitwise_not.default: ("bitwise_not", False),
    aten.isnan.default: ("isnan", False),
    aten.silu.default: ("silu", True),
}

#: Rounding ops: identity on integer inputs.
ROUNDING = {aten.floor.default, aten.ceil.default, aten.round.default, aten.trunc.default}

#: pow(x, scalar) exponents ATen computes without pow() (pow_tensor_scalar_optimized),
#: as IR ops: the same formulas give the same NaN/inf/-0 results.
POW_SPECIAL = {
    0.5: "sqrt", -0.5: "rsqrt", 2: "square", 2.0: "square", 3: "cube", 3.0: "cube",
    -1: "reciprocal", -1.0: "reciprocal", -2: "reciprocal_square", -2.0: "reciprocal_square",
}

#: op -> IR op name (``kernel_ir.Op.name``).
BINARY = {
    aten.add.Tensor: "add",
    aten.sub.Tensor: "sub",
    aten.mul.Tensor: "mul",
    aten.div.Tensor: "div",
    aten.pow.Tensor_Tensor: "pow",
    aten.pow.Tensor_Scalar: "pow",
    aten.maximum.default: "maximum",
    aten.minimum.default: "minimum",
    aten.fmod.Tensor: "fmod",
    aten.atan2.default: "atan2",
    aten.eq.Tensor: "eq",
    aten.ne.Tensor: "ne",
    aten.lt.Tensor: "lt",
    aten.le.Tensor: "le",
    aten.gt.Tensor: "gt",
    aten.ge.Tensor: "ge",
    aten.eq.Scalar: "eq",
    aten.ne.Scalar: "ne",
    aten.lt.Scalar: "lt",
    aten.le.Scalar: "le",
    aten.gt.Scalar: "gt",
    aten.ge.Scalar: "ge",
    aten.logical_and.default: "logical_and",
    aten.logical_or.default: "logical_or",
    aten.bitwise_and.Tensor: "bitwise_and",
    aten.bitwise_or.Tensor: "bitwise_or",
    aten.bitwise_xor.Tensor: "bitwise_xor",
    aten.mul.Scalar: "mul",
    aten.add.Scalar: "add",
    aten.sub.Scalar: "sub",
    aten.div.Scalar: "div",
}
EXPENSIVE_BINARY = {aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.fmod.Tensor, aten.atan2.default}
#: Binary ops whose operands are compared in their promoted dtype (the result is bool).
COMPARISON_NAMES = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or"}
COMPARISONS = {op for op, name in BINARY.items() if name in COMPARISON_NAMES}

#: Activations with scalar parameters -> (IR op name, expensive). The parameters are
#: the schema's scalar arguments after the input, in order (defaults filled in):
#: leaky_relu (negative_slope), elu (alpha, scale, input_scale), hardtanh (min, max:
#: ReLU6 is hardtanh(0, 6); ATen computes it as clamp).
PARAMETRIC = {
    aten.leaky_relu.default: ("leaky_relu", False),
    aten.elu.default: ("elu", True),
    aten.hardtanh.default: ("clamp", False),
}

#: ``div``'s rounding modes -> IR op name (None: true division).
DIV_ROUNDING = {None: "div", "trunc": "div_trunc", "floor": "div_floor"}
DIV_WITH_MODE = {aten.div.Tensor_mode, aten.div.Scalar_mode}
#: Python-style remainder (the result has the divisor's sign); ``Scalar_Tensor`` is
#: ``number % tensor``.
REMAINDERS = {aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor}
#: clamp with tensor bounds (either may be absent: then it is maximum or minimum).
CLAMP_TENSOR = {aten.clamp.Tensor, aten.clamp_min.Tensor, aten.clamp_max.Tensor}
#: Ops that only re-type or copy their input: identity in a kernel.
COPIES = {
    aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default,
    aten.detach.default, aten._to_copy.default, prims.convert_element_type.default,
    aten.contiguous.default,
}

#: View ops: re-index a value without computing anything.
VIEWS = {
    aten.view.default, aten._unsafe_view.default, aten.reshape.default,
    aten.permute.default, aten.expand.default, aten.unsqueeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.slice.Tensor,
    aten.select.int, aten.t.default, aten.transpose.int, aten.split_with_sizes.default,
    aten.split.Tensor, aten.unbind.int,
}

#: Checks export inserts on metadata that is static here: verified at build time.
ASSERTIONS = {aten._assert_tensor_metadata.default, aten._assert_scalar.default,
              aten.sym_constrain_range_for_size.default}


def users(node) -> list:
    """The FX users of ``node`` that compute something (not runtime assertions, which
    ``torch.export`` adds after ``.to()`` and which read no element)."""
    return [user for user in node.users if user.target not in ASSERTIONS]

#: reduction op -> (kind, mean?)
REDUCTIONS = {
    aten.sum.dim_IntList: ("sum", False),
    aten.sum.default: ("sum", False),
    aten.mean.dim: ("sum", True),
    aten.mean.default: ("sum", True),
    aten.amax.default: ("max", False),
    aten.amin.default: ("min", False),
    aten.prod.dim_int: ("prod", False),
    aten.prod.default: ("prod", False),
}
#: var(x, dim, correction, keepdim) (``std`` decomposes into var + sqrt).
VARIANCES = {aten.var.correction}


def short_name(op) -> str:
    """``aten.add.Tensor`` -> ``add`` (for kernel names)."""
    return str(getattr(op, "__name__", op)).split(".")[0].lstrip("_")
