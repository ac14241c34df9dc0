"""The CPU renderer's formula table: kernel IR op name -> C++ expression.

Formulas take operand variable names ``{0}``, ``{1}``, ... (already of the op's compute
type); ``{t}`` is that type's C++ name and ``{p0}``, ``{p1}``, ... the op's scalar parameters
as literals of that type. Helpers named ``ap_*`` and the ``ap::`` math functions (GCC
builtins standing in for <cmath>, which kernels do not include: it dominated their
compile time) live in ``templates/cpu_math.h.j2``.
"""
from __future__ import annotations

import math

import torch

#: dtypes CPU kernels compute in, with their C++ type.
C_TYPES = {
    torch.float32: "float",
    torch.float64: "double",
    torch.int64: "int64_t",
    torch.int32: "int32_t",
    torch.int16: "int16_t",
    torch.int8: "int8_t",
    torch.uint8: "uint8_t",
    torch.bool: "bool",
}

FORMULAS = {
    "neg": "-{0}",
    "relu": "ap_relu({0})",
    "abs": "ap::abs({0})",
    "exp": "ap::exp({0})",
    "exp2": "ap::exp2({0})",
    "expm1": "ap::expm1({0})",
    "log": "ap::log({0})",
    "log2": "ap::log2({0})",
    "log1p": "ap::log1p({0})",
    "sqrt": "ap::sqrt({0})",
    "rsqrt": "ap_rsqrt({0})",
    "reciprocal": "ap_reciprocal({0})",
    "sigmoid": "ap_sigmoid({0})",
    "tanh": "ap::tanh({0})",
    "erf": "ap::erf({0})",
    "sin": "ap::sin({0})",
    "cos": "ap::cos({0})",
    "floor": "ap::floor({0})",
    "ceil": "ap::ceil({0})",
    "round": "ap::nearbyint({0})",
    "trunc": "ap::trunc({0})",
    "sign": "ap_sign({0})",
    "logical_not": "!{0}",
    "bitwise_not": "~{0}",
    "isnan": "({0} != {0})",
    "silu": "({0} * ap_sigmoid({0}))",
    "add": "({0} + {1})",
    "sub": "({0} - {1})",
    "mul": "({0} * {1})",
    "div": "({0} / {1})",
    "pow": "ap_pow({0}, {1})",
    "maximum": "ap_max({0}, {1})",
    "minimum": "ap_min({0}, {1})",
    "fmod": "ap::fmod({0}, {1})",
    "atan2": "ap::atan2({0}, {1})",
    "eq": "({0} == {1})",
    "ne": "({0} != {1})",
    "lt": "({0} < {1})",
    "le": "({0} <= {1})",
    "gt": "({0} > {1})",
    "ge": "({0} >= {1})",
    "logical_and": "({0} && {1})",
    "logical_or": "({0} || {1})",
    "bitwise_and": "({0} & {1})",
    "bitwise_or": "({0} | {1})",
    "bitwise_xor": "({0} ^ {1})",
    "square": "({0} * {0})",
    "cube": "({0} * {0} * {0})",
    "reciprocal_square": "ap_reciprocal({0} * {0})",
    "identity": "{0}",
    "where": "({0} ? {1} : {2})",
    "ne_zero": "({0} != 0)",
    "gelu": "({0} * static_cast<{t}>(0.5) * (static_cast<{t}>(1) + ap::erf({0} * static_cast<{t}>(0.7071067811865476))))",
    "rsqrt_eps": "ap_rsqrt({0} + {p0})",
    # ATen's leaky_relu_kernel: a > 0 ? a : a * slope (NaN takes the second branch)
    "leaky_relu": "({0} > static_cast<{t}>(0) ? {0} : {0} * {p0})",
    # ATen's elu_kernel: negcoef = alpha * scale (in the compute type), expm1 on x <= 0
    "elu": "({0} <= static_cast<{t}>(0) ? ap::expm1({0} * {p2}) * ({p0} * {p1}) : {0} * {p1})",
    "clamp_tensor": "ap_min(ap_max({0}, {1}), {2})",
    "div_trunc": "ap_div_trunc({0}, {1})",
    "div_floor": "ap_div_floor({0}, {1})",
    "remainder": "ap_remainder({0}, {1})",
    "normalize": "(({0} - {1}) * {2})",
}

#: Helper groups of ``cpu_math.h.j2`` rendered only into kernels that call them (the
#: rest of the header is in every kernel) -> the helpers of each group.
OPTIONAL_HELPERS = {"rounding": ("ap_div_trunc", "ap_div_floor", "ap_remainder"),
                    "nonpositive_exp": ("ap::exp_nonpositive",),
                    "streaming_store": ("ap_store_scaled_streaming", "ap_stream_fence")}

#: C++'s % truncates toward zero like fmod; x % 0 is undefined, torch gives x - x.
INTEGER_FMOD = "({1} == 0 ? {0} - {0} : {0} % {1})"


def _is_nan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


def literal(value, ctype: str) -> str:
    """A Python scalar as a C++ expression of type ``ctype`` (NaN and inf included)."""
    if isinstance(value, bool):
        return f"static_cast<{ctype}>({'true' if value else 'false'})"
    if isinstance(value, float):
        if math.isnan(value):
            return f"ap::limits<{ctype}>::quiet_NaN()"
        if math.isinf(value):
            sign = "-" if value < 0 else ""
            return f"{sign}ap::limits<{ctype}>::infinity()"
        return f"static_cast<{ctype}>({value!r})"
    return f"static_cast<{ctype}>({int(value)}LL)"


def formula(name: str, params: tuple, dtype: torch.dtype, operand_ctype: str) -> str:
    """The C++ template of IR op ``name`` with ``params``, result dtype ``dtype``.

    Raises:
        KeyError: an op the CPU backend cannot render (a lowering/backend mismatch).
    """
    if name in ("add", "sub") and params:  # alpha scales the second operand
        text = FORMULAS[name].replace("{1}", f"({{1}} * {literal(params[0], '{t}')})")
    elif name == "clamp":
        low, high = params
        text = "{0}"
        # a NaN bound makes every element NaN (torch.clamp): only ap_max / ap_min test it
        if low is not None:
            text = f"{'ap_max' if _is_nan(low) else 'ap_max_bound'}({text}, {literal(low, '{t}')})"
        if high is not None:
            text = f"{'ap_min' if _is_nan(high) else 'ap_min_bound'}({text}, {literal(high, '{t}')})"
    elif name == "fmod" and not dtype.is_floating_point:
        text = INTEGER_FMOD
    else:
        text = FORMULAS[name]
        for k, value in enumerate(params):
            text = text.replace(f"{{p{k}}}", literal(value, "{t}"))
    return text.replace("{t}", operand_ctype)


def optional_helpers(lines) -> list[str]:
    """Groups of ``OPTIONAL_HELPERS`` that the kernel body ``lines`` (C++ text) calls."""
    text = "\n".join(lines)
    return [group for group, calls in OPTIONAL_HELPERS.items() if any(call in text for call in calls)]
