"""The epilogues template kernels apply to their result ``y``, as kernel-IR expressions.

An epilogue is an ``Op`` tree over two placeholder loads: ``ACCUMULATOR`` (``y``, the
template's result, bias included) and ``RESIDUAL`` (a tensor of the output's shape). A
backend renders the tree with its own formulas, binding the placeholders to whatever holds
them in its template. Names are the post-op names the GEMM libraries share, which
``gemm_match`` finds.

The printed form of a template kernel shows its epilogue's formula as eager decomposes it
(``Epilogue.text``), and the kernel's ``kernel_id`` hashes that text: changing how an
epilogue prints changes the ids of every kernel that applies it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from aotpack.ir.index import Index
from aotpack.ir.kernel import Const, Load, Op, walk


@dataclass(frozen=True)
class Operand:
    """A placeholder an epilogue reads (``name`` is how the printed form calls it); the
    template that applies the epilogue binds it."""

    name: str
    dtype: torch.dtype = torch.float32


#: ``y``: the template's result at the element the epilogue computes.
ACCUMULATOR = Load(Operand("y"), Index.constant(0))
#: The residual at the same element.
RESIDUAL = Load(Operand("residual"), Index.constant(0))
#: ``y + residual``: the first step of every epilogue here that reads the residual.
RESIDUAL_SUM = Op("add", (ACCUMULATOR, RESIDUAL), torch.float32)


def _op(name: str, *args, params: tuple = ()) -> Op:
    return Op(name, tuple(args), torch.float32, params)


def _const(value: float) -> Const:
    return Const(float(value), torch.float32)


def _clamp_shifted(y) -> Op:
    """``clamp(y + 3, 0, 6)``, hardswish's and hardsigmoid's gate as eager decomposes it."""
    return _op("clamp", _op("add", y, _const(3)), params=(0.0, 6.0))


#: Binary ops the printed form writes infix -> (operator, C-like precedence: lower binds tighter).
_INFIX = {"mul": ("*", 1), "div": ("/", 1), "add": ("+", 2), "sub": ("-", 2)}


def _number(value) -> str:
    """A parameter or constant as eager's decomposition writes it: ``3`` for 3.0."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return str(int(value))
    return repr(value)


def eager_text(expr, names: dict | None = None) -> str:
    """An epilogue expression as eager decomposes it, with the fewest parentheses:
    ``y * clamp(y + 3, 0, 6) / 6``. ``names`` maps nodes to the text standing for them.

    Raises:
        ValueError: a node other than a placeholder load, a constant or a pointwise op.
    """
    return _printed(expr, names or {})[0]


def _printed(node, names: dict) -> tuple[str, int]:
    """(text, precedence) of an epilogue node in the printed form (0: needs no parentheses)."""
    if node in names:
        return names[node], 0
    if isinstance(node, Load):
        return node.buffer.name, 0
    if isinstance(node, Const):
        return _number(node.value), 0
    if not isinstance(node, Op) or node.params and node.name in _INFIX:
        raise ValueError(f"an epilogue is pointwise ops over y and the residual, not {node!r}")
    args = [_printed(a, names) for a in node.args]
    if node.name in _INFIX:
        symbol, precedence = _INFIX[node.name]
        (left, lp), (right, rp) = args
        left = f"({left})" if lp > precedence else left
        right = f"({right})" if rp >= precedence else right
        return f"{left} {symbol} {right}", precedence
    return f"{node.name}({', '.join([text for text, _ in args] + [_number(p) for p in node.params])})", 0


@dataclass(frozen=True)
class Epilogue:
    """One epilogue: ``name`` (the post-op name) and ``expr``, its value over ``ACCUMULATOR``
    (and ``RESIDUAL``). ``printed`` overrides the printed form where it is not ``expr``'s own
    (kept as kernels have always printed it, so their ids stay)."""

    name: str
    expr: object
    printed: str = ""

    @property
    def text(self) -> str:
        """The formula in the kernel's printed form: ``relu(y + residual)``, ``y``."""
        return self.printed or eager_text(self.expr)

    @property
    def reads_residual(self) -> bool:
        """Whether the epilogue reads ``RESIDUAL`` (the kernel then has a residual input)."""
        return any(node == RESIDUAL for node in walk(self.expr))


def _epilogues(*items: Epilogue) -> dict[str, Epilogue]:
    return {item.name: item for item in items}


_Y = ACCUMULATOR
NONE = Epilogue("none", _Y)
RELU = Epilogue("relu", _op("relu", _Y))
# the IR's gelu op; printed as the decomposition it computes (the erf form, not tanh)
GELU = Epilogue("gelu", _op("gelu", _Y), printed="(y * 0.5) * (erf(y * sqrt(0.5)) + 1)")
TANH = Epilogue("tanh", _op("tanh", _Y))
SIGMOID = Epilogue("sigmoid", _op("sigmoid", _Y))
SWISH = Epilogue("swish", _op("mul", _Y, _op("sigmoid", _Y)))
HARDSWISH = Epilogue("hardswish", _op("div", _op("mul", _Y, _clamp_shifted(_Y)), _const(6)))
HARDSIGMOID = Epilogue("hardsigmoid", _op("div", _clamp_shifted(_Y), _const(6)))
ADD = Epilogue("add", RESIDUAL_SUM)
ADD_RELU = Epilogue("add_relu", _op("relu", RESIDUAL_SUM))

#: The epilogues a GEMM template applies to ``y = x @ W^T + bias``.
GEMM_EPILOGUES = _epilogues(NONE, RELU, GELU, TANH, SIGMOID, SWISH, HARDSWISH, HARDSIGMOID, ADD)

#: The epilogues of a convolution template (``ConvKernel``, ``WinogradConvKernel``): the
#: GEMM's, less GELU (no CNN here uses it after a conv), plus ``add_relu``, ResNet's
#: ``relu(conv + residual)``.
CONV_EPILOGUES = {**{name: e for name, e in GEMM_EPILOGUES.items() if name != "gelu"}, "add_relu": ADD_RELU}

#: The epilogues a depthwise convolution template applies to ``y = conv(x, W) + bias``.
DEPTHWISE_EPILOGUES = _epilogues(NONE, RELU, HARDSWISH, HARDSIGMOID, SIGMOID, SWISH)
