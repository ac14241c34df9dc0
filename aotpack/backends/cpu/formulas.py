"""The CPU renderer's formula table: kernel IR op name -> C++ expression.

Formulas take operand variable names ``{0}``, ``{1}``, ... (already of the op's compute
type); ``{t}`` is that type's C++ name and ``{p0}``, ``{p1}``, ... the op's scalar parameters
as literals of that type. Helpers named ``ap_*`` and the ``ap::`` math functions (GCC
builtins standing in for <cmath>, which kernels do not include: it dominated their
compile time) live in ``templates/cpu_math.h.j2``.
"""
from __future__ import annotations

import math
import re

import torch

from aotpack.ir.kernel import Const, Op

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


def short_literal(value, ctype: str) -> str:
    """A finite ``float`` literal as templates write it (``3.0f``); else ``literal``."""
    if ctype == "float" and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return f"{float(value)!r}f"
    return literal(value, ctype)


def formula(name: str, params: tuple, dtype: torch.dtype, operand_ctype: str, spell=literal) -> str:
    """The C++ template of IR op ``name`` with ``params``, result dtype ``dtype``; ``spell``
    writes the params as literals (``literal``, or ``short_literal`` in templates).

    Raises:
        KeyError: an op the CPU backend cannot render (a lowering/backend mismatch).
    """
    if name in ("add", "sub") and params:  # alpha scales the second operand
        text = FORMULAS[name].replace("{1}", f"({{1}} * {spell(params[0], operand_ctype)})")
    elif name == "clamp":
        low, high = params
        text = "{0}"
        # a NaN bound makes every element NaN (torch.clamp): only ap_max / ap_min test it
        if low is not None:
            text = f"{'ap_max' if _is_nan(low) else 'ap_max_bound'}({text}, {spell(low, operand_ctype)})"
        if high is not None:
            text = f"{'ap_min' if _is_nan(high) else 'ap_min_bound'}({text}, {spell(high, operand_ctype)})"
    elif name == "fmod" and not dtype.is_floating_point:
        text = INTEGER_FMOD
    else:
        text = FORMULAS[name]
        for k, value in enumerate(params):
            text = text.replace(f"{{p{k}}}", spell(value, operand_ctype))
    return text.replace("{t}", operand_ctype)


def optional_helpers(lines) -> list[str]:
    """Groups of ``OPTIONAL_HELPERS`` that the kernel body ``lines`` (C++ text) calls."""
    text = "\n".join(lines)
    return [group for group, calls in OPTIONAL_HELPERS.items() if any(call in text for call in calls)]


#: A formula that is one binary operator, ``({0} + {1})``: C writes it infix.
_BINARY = re.compile(r"^\(\{0\} (\S+) \{1\}\)$")
#: C's precedence of those operators (lower binds tighter; 0 is an operand that needs no
#: parentheses, 2 a unary minus).
_PRECEDENCE = {"*": 3, "/": 3, "%": 3, "+": 4, "-": 4, "<": 6, "<=": 6, ">": 6, ">=": 6, "==": 7, "!=": 7,
               "&": 8, "^": 9, "|": 10, "&&": 11, "||": 12}


def inline(expr, leaves: dict, ctype: str = "float", forms: dict | None = None) -> str:
    """``expr`` (kernel IR of ``Op`` and ``Const`` nodes) as one C++ expression with only the
    parentheses C needs and ``short_literal`` constants: what a template splices in.

    ``leaves`` maps nodes to the C++ text that holds them (a template's variables); ``forms``
    maps op names to formulas that replace ``FORMULAS``' in this template (its own helpers).

    Raises:
        KeyError: a node that is neither a leaf nor an op the table renders.
    """
    return _inline(expr, leaves, ctype, forms or {})[0]


def _bare(template: str, slot: str) -> bool:
    """Whether every use of ``slot`` in ``template`` is a whole call argument."""
    at = [m.start() for m in re.finditer(re.escape(slot), template)]
    return all(template[:k].endswith(("(", ", ")) and template[k + len(slot):].startswith((",", ")")) for k in at)


def _inline(node, leaves: dict, ctype: str, forms: dict) -> tuple[str, int]:
    """(C++ text, precedence) of ``node``."""
    if node in leaves:
        return leaves[node], 0
    if isinstance(node, Const):
        text = short_literal(node.value, ctype)
        return text, 2 if text.startswith("-") else 0
    if not isinstance(node, Op):
        raise KeyError(f"no inline form for {node!r}")
    template = forms.get(node.name) or formula(node.name, node.params, node.dtype, ctype, spell=short_literal)
    args = [_inline(a, leaves, ctype, forms) for a in node.args]
    binary = _BINARY.match(template)
    if binary:
        symbol = binary.group(1)
        precedence = _PRECEDENCE[symbol]
        (left, lp), (right, rp) = args
        left = f"({left})" if lp > precedence else left
        right = f"({right})" if rp >= precedence else right
        return f"{left} {symbol} {right}", precedence
    texts = [text if not p or _bare(template, f"{{{k}}}") else f"({text})" for k, (text, p) in enumerate(args)]
    text = re.sub(r"\{(\d+)\}", lambda m: texts[int(m.group(1))], template)
    # a call or a parenthesised whole is an operand as it is; anything else is parenthesised
    return text, 0 if _enclosed(template) else 15


def _enclosed(template: str) -> bool:
    """Whether ``template`` is ``name(...)`` or ``(...)``, its first parenthesis closing at its end."""
    start = len(template) - len(template.lstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:"))
    if template[start:start + 1] != "(":
        return False
    depth = 0
    for k, char in enumerate(template[start:], start):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return k == len(template) - 1
    return False
