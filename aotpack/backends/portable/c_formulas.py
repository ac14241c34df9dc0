"""The portable backend's formula table: kernel IR op name -> C99 expression.

Formulas take operand variable names ``{0}``, ``{1}``, ... (already of the op's compute
type); ``{t}`` is that type's C name, ``{s}`` its helper suffix (``f32``, ``i64``, ...) and
``{m}`` the libm suffix (``f`` for float, empty for double). Helpers named ``pp_*_<s>`` are
defined for every C type in ``templates/portable_math.h.j2``; the rest is <math.h>.
"""
from __future__ import annotations

import math

import torch

#: dtypes portable kernels compute in, with their C type (<stdint.h>, <stdbool.h>).
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

#: C type -> suffix of its ``pp_*`` helpers.
SUFFIX = {"float": "f32", "double": "f64", "int64_t": "i64", "int32_t": "i32", "int16_t": "i16",
          "int8_t": "i8", "uint8_t": "u8", "bool": "b8"}

FORMULAS = {
    "neg": "(-{0})",
    "relu": "pp_relu_{s}({0})",
    "abs": "pp_abs_{s}({0})",
    "exp": "exp{m}({0})",
    "exp2": "exp2{m}({0})",
    "expm1": "expm1{m}({0})",
    "log": "log{m}({0})",
    "log2": "log2{m}({0})",
    "log1p": "log1p{m}({0})",
    "sqrt": "sqrt{m}({0})",
    "rsqrt": "(({t})1 / sqrt{m}({0}))",
    "reciprocal": "(({t})1 / {0})",
    "sigmoid": "(({t})1 / (({t})1 + exp{m}(-{0})))",
    "tanh": "tanh{m}({0})",
    "erf": "erf{m}({0})",
    "sin": "sin{m}({0})",
    "cos": "cos{m}({0})",
    "floor": "floor{m}({0})",
    "ceil": "ceil{m}({0})",
    "round": "nearbyint{m}({0})",
    "trunc": "trunc{m}({0})",
    "sign": "(({t})((({t})0 < {0}) - ({0} < ({t})0)))",
    "logical_not": "(!{0})",
    "bitwise_not": "(~{0})",
    "isnan": "({0} != {0})",
    "silu": "({0} * (({t})1 / (({t})1 + exp{m}(-{0}))))",
    "add": "({0} + {1})",
    "sub": "({0} - {1})",
    "mul": "({0} * {1})",
    "div": "({0} / {1})",
    "pow": "pp_pow_{s}({0}, {1})",
    "maximum": "pp_max_{s}({0}, {1})",
    "minimum": "pp_min_{s}({0}, {1})",
    "fmod": "fmod{m}({0}, {1})",
    "atan2": "atan2{m}({0}, {1})",
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
    "reciprocal_square": "(({t})1 / ({0} * {0}))",
    "identity": "{0}",
    "where": "({0} ? {1} : {2})",
    "ne_zero": "({0} != 0)",
    "gelu": "({0} * ({t})0.5 * (({t})1 + erf{m}({0} * ({t})0.7071067811865476)))",
    "rsqrt_eps": "(({t})1 / sqrt{m}({0} + {p0}))",
    # ATen's leaky_relu_kernel: a > 0 ? a : a * slope (NaN takes the second branch)
    "leaky_relu": "({0} > ({t})0 ? {0} : {0} * {p0})",
    # ATen's elu_kernel: negcoef = alpha * scale (in the compute type), expm1 on x <= 0
    "elu": "({0} <= ({t})0 ? expm1{m}({0} * {p2}) * ({p0} * {p1}) : {0} * {p1})",
    "clamp_tensor": "pp_min_{s}(pp_max_{s}({0}, {1}), {2})",
    "div_trunc": "pp_div_trunc_{s}({0}, {1})",
    "div_floor": "pp_div_floor_{s}({0}, {1})",
    "remainder": "pp_remainder_{s}({0}, {1})",
    "normalize": "(({0} - {1}) * {2})",
}

#: C's % truncates toward zero like fmod; x % 0 is undefined, torch gives x - x.
INTEGER_FMOD = "({1} == 0 ? {0} - {0} : {0} % {1})"


def literal(value, ctype: str) -> str:
    """A Python scalar as a C expression of type ``ctype`` (NaN and inf included)."""
    if isinstance(value, bool):
        return f"(({ctype}){int(value)})"
    if isinstance(value, float):
        if math.isnan(value):
            return f"(({ctype})NAN)"
        if math.isinf(value):
            return f"(({ctype}){'-' if value < 0 else ''}INFINITY)"
        return f"(({ctype}){value!r})"
    return f"(({ctype}){int(value)}LL)"


def formula(name: str, params: tuple, dtype: torch.dtype, operand_ctype: str) -> str:
    """The C template of IR op ``name`` with ``params``, result dtype ``dtype``, operands of
    C type ``operand_ctype``.

    Raises:
        KeyError: an op the portable backend cannot render (a lowering/backend mismatch).
    """
    if name in ("add", "sub") and params:  # alpha scales the second operand
        text = FORMULAS[name].replace("{1}", f"({{1}} * {literal(params[0], '{t}')})")
    elif name == "clamp":
        low, high = params
        text = "{0}"
        # a NaN bound makes every element NaN (torch.clamp): pp_max / pp_min test it
        if low is not None:
            text = f"pp_max{'' if _is_nan(low) else '_bound'}_{{s}}({text}, {literal(low, '{t}')})"
        if high is not None:
            text = f"pp_min{'' if _is_nan(high) else '_bound'}_{{s}}({text}, {literal(high, '{t}')})"
    elif name == "fmod" and not dtype.is_floating_point:
        text = INTEGER_FMOD
    else:
        text = FORMULAS[name]
        for k, value in enumerate(params):
            text = text.replace(f"{{p{k}}}", literal(value, "{t}"))
    libm = {"float": "f", "double": ""}.get(operand_ctype, "")
    return text.replace("{t}", operand_ctype).replace("{s}", SUFFIX[operand_ctype]).replace("{m}", libm)


def _is_nan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


def accumulator(kind: str, dtype: torch.dtype) -> tuple[str, str]:
    """(C type, initial value) of a reduction's accumulator: float sums and products in
    double; integer max/min from the type's limits; bool as int."""
    ctype = "int" if dtype == torch.bool else C_TYPES[dtype]
    if kind in ("sum", "prod"):
        return ("double" if dtype.is_floating_point else ctype), ("0" if kind == "sum" else "1")
    if dtype.is_floating_point:
        return ctype, f"({'-' if kind == 'max' else ''}INFINITY)"
    limits = {"int": ("0", "1"), "int64_t": ("INT64_MIN", "INT64_MAX"), "int32_t": ("INT32_MIN", "INT32_MAX"),
              "int16_t": ("INT16_MIN", "INT16_MAX"), "int8_t": ("INT8_MIN", "INT8_MAX"), "uint8_t": ("0", "UINT8_MAX")}
    low, high = limits[ctype]
    return ctype, (low if kind == "max" else high)
