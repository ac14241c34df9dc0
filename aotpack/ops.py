"""Which ATen ops fuse, and the C++ expression each one becomes.

Pointwise formulas take operand variable names ``{0}``, ``{1}``, ... already cast to
the op's compute type. Helpers named ``ap_*`` live in ``templates/cpu_math.h.j2``.
Everything not listed here runs as an extern call into ATen (see ``lowering``).
"""
from __future__ import annotations

import torch

aten = torch.ops.aten
prims = torch.ops.prims

#: op -> (C++ formula, expensive). "expensive" ops are worth a buffer when a value
#: has several users, rather than being recomputed in each (transcendentals).
UNARY = {
    aten.neg.default: ("-{0}", False),
    aten.relu.default: ("ap_relu({0})", False),
    aten.abs.default: ("std::abs({0})", False),
    aten.exp.default: ("std::exp({0})", True),
    aten.exp2.default: ("std::exp2({0})", True),
    aten.expm1.default: ("std::expm1({0})", True),
    aten.log.default: ("std::log({0})", True),
    aten.log2.default: ("std::log2({0})", True),
    aten.log1p.default: ("std::log1p({0})", True),
    aten.sqrt.default: ("std::sqrt({0})", False),
    aten.rsqrt.default: ("ap_rsqrt({0})", False),
    aten.reciprocal.default: ("ap_reciprocal({0})", False),
    aten.sigmoid.default: ("ap_sigmoid({0})", True),
    aten.tanh.default: ("std::tanh({0})", True),
    aten.erf.default: ("std::erf({0})", True),
    aten.sin.default: ("std::sin({0})", True),
    aten.cos.default: ("std::cos({0})", True),
    aten.floor.default: ("std::floor({0})", False),
    aten.ceil.default: ("std::ceil({0})", False),
    aten.round.default: ("std::nearbyint({0})", False),
    aten.trunc.default: ("std::trunc({0})", False),
    aten.sign.default: ("ap_sign({0})", False),
    aten.logical_not.default: ("!{0}", False),
    aten.bitwise_not.default: ("~{0}", False),
    aten.isnan.default: ("({0} != {0})", False),
    aten.silu.default: ("({0} * ap_sigmoid({0}))", True),
}

#: Rounding ops: identity on integer inputs.
ROUNDING = {aten.floor.default, aten.ceil.default, aten.round.default, aten.trunc.default}

#: pow(x, scalar) exponents ATen computes without pow() (pow_tensor_scalar_optimized);
#: the same formulas give the same NaN/inf/-0 results.
POW_SPECIAL = {
    0.5: "std::sqrt({0})", -0.5: "ap_rsqrt({0})", 2: "({0} * {0})", 2.0: "({0} * {0})",
    3: "({0} * {0} * {0})", 3.0: "({0} * {0} * {0})", -1: "ap_reciprocal({0})", -1.0: "ap_reciprocal({0})",
    -2: "ap_reciprocal({0} * {0})", -2.0: "ap_reciprocal({0} * {0})",
}

BINARY = {
    aten.add.Tensor: "({0} + {1})",
    aten.sub.Tensor: "({0} - {1})",
    aten.mul.Tensor: "({0} * {1})",
    aten.div.Tensor: "({0} / {1})",
    aten.pow.Tensor_Tensor: "ap_pow({0}, {1})",
    aten.pow.Tensor_Scalar: "ap_pow({0}, {1})",
    aten.maximum.default: "ap_max({0}, {1})",
    aten.minimum.default: "ap_min({0}, {1})",
    aten.fmod.Tensor: "std::fmod({0}, {1})",
    aten.atan2.default: "std::atan2({0}, {1})",
    aten.eq.Tensor: "({0} == {1})",
    aten.ne.Tensor: "({0} != {1})",
    aten.lt.Tensor: "({0} < {1})",
    aten.le.Tensor: "({0} <= {1})",
    aten.gt.Tensor: "({0} > {1})",
    aten.ge.Tensor: "({0} >= {1})",
    aten.eq.Scalar: "({0} == {1})",
    aten.ne.Scalar: "({0} != {1})",
    aten.lt.Scalar: "({0} < {1})",
    aten.le.Scalar: "({0} <= {1})",
    aten.gt.Scalar: "({0} > {1})",
    aten.ge.Scalar: "({0} >= {1})",
    aten.logical_and.default: "({0} && {1})",
    aten.logical_or.default: "({0} || {1})",
    aten.bitwise_and.Tensor: "({0} & {1})",
    aten.bitwise_or.Tensor: "({0} | {1})",
    aten.bitwise_xor.Tensor: "({0} ^ {1})",
    aten.mul.Scalar: "({0} * {1})",
    aten.add.Scalar: "({0} + {1})",
    aten.sub.Scalar: "({0} - {1})",
    aten.div.Scalar: "({0} / {1})",
}
EXPENSIVE_BINARY = {aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.fmod.Tensor, aten.atan2.default}
COMPARISONS = {op for op, f in BINARY.items() if any(s in f for s in ("==", "!=", "<", ">", "&&", "||"))}

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

#: reduction op -> (kind, mean?)
REDUCTIONS = {
    aten.sum.dim_IntList: ("sum", False),
    aten.sum.default: ("sum", False),
    aten.mean.dim: ("sum", True),
    aten.mean.default: ("sum", True),
    aten.amax.default: ("max", False),
    aten.amin.default: ("min", False),
    aten.prod.dim_int: ("prod", False),
}


def short_name(op) -> str:
    """``aten.add.Tensor`` -> ``add`` (for kernel names)."""
    return str(getattr(op, "__name__", op)).split(".")[0].lstrip("_")
