"""Find GEMMs and convolutions with a constant weight, and the epilogue that follows them.

Works on the exported, decomposed FX graph before lowering. A match is a linear
(``addmm(bias, x, permute(W))`` or ``mm(x, permute(W))``, ``W`` a 2-D weight) or a 2-D
convolution (``convolution(x, W, bias, ...)``, not transposed) in float32, plus the
pointwise ops after it that a GEMM implementation can apply as post-ops, when no other op reads the
intermediate values:

* an activation: ``relu``, ``tanh``, ``sigmoid``, GELU (erf form, as decomposed:
  ``0.5*y * (1 + erf(y*sqrt(0.5)))``), SiLU (``y * sigmoid(y)``), hardswish
  (``y * clamp(clamp(y + 3, 0), None, 6) / 6``) or hardsigmoid (``clamp(clamp(y + 3, 0),
  None, 6) / 6``), as decomposed;
* or a residual ``add(y, other)`` of the same shape, for a convolution optionally
  followed by ``relu`` (ResNet's block output).

A convolution may first be followed by an eval-mode batch norm with constant
statistics: it is folded into the convolution's weight and bias at build time
(``gemm_lowering``), so the epilogue after it still fits (conv -> BN -> ReLU is one
convolution with a ReLU post-op).

Reshapes (``view``) between the GEMM and its epilogue are allowed when they keep the
last dimension (the GEMM's N), so the rows stay the GEMM's rows.
"""
from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass

import torch

from aotpack.lower import ops

aten = torch.ops.aten
_RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
_UNARY = {aten.relu.default: "relu", aten.tanh.default: "tanh", aten.sigmoid.default: "sigmoid"}
_SQRT_HALF = math.sqrt(0.5)


@dataclass(frozen=True)
class GemmMatch:
    """One GEMM/conv and its foldable epilogue.

    ``nodes`` are every FX node the match covers, in graph order (the GEMM first, the
    epilogue's last node last: its value is the match's result); ``unary`` is the
    post-op name (``relu``, ``gelu``, ``tanh``, ``sigmoid``, ``swish``, ``hardswish``,
    ``hardsigmoid``) or None;
    ``residual`` the FX node added to the result, or None (with a ``unary``, that is
    applied after the add); ``batch_norm`` the eval-mode batch norm node folded into a
    convolution, or None.
    """

    kind: str  # "linear" | "conv2d"
    gemm: object
    x: object
    weight: object
    bias: object | None
    unary: str | None
    residual: object | None
    nodes: tuple
    batch_norm: object | None = None

    @property
    def final(self):
        """The node whose value the match computes."""
        return self.nodes[-1]

    @property
    def epilogue(self) -> str:
        """What the epilogue does, as text: ``gelu``, ``add``, ``add_relu``, ``none``."""
        if self.residual is not None:
            return f"add_{self.unary}" if self.unary else "add"
        return self.unary or "none"


def _val(node):
    return node.meta.get("val") if hasattr(node, "meta") else None


def _is_f32(*nodes) -> bool:
    return all(isinstance(_val(n), torch.Tensor) and _val(n).dtype == torch.float32 for n in nodes)


def _users(node) -> list:
    return ops.users(node)


def _scalar_arg(node, value: float) -> bool:
    """``node`` is ``mul(x, value)`` or ``add(x, value)`` with a Python number second."""
    return len(node.args) == 2 and isinstance(node.args[1], (int, float)) and abs(node.args[1] - value) < 1e-12


def _gelu(y) -> tuple | None:
    users = _users(y)
    if len(users) != 2 or any(u.target is not aten.mul.Tensor or u.args[0] is not y for u in users):
        return None
    half = next((u for u in users if _scalar_arg(u, 0.5)), None)
    inner = next((u for u in users if _scalar_arg(u, _SQRT_HALF)), None)
    if half is None or inner is None or len(_users(inner)) != 1 or len(_users(half)) != 1:
        return None
    erf = _users(inner)[0]
    if erf.target is not aten.erf.default or len(_users(erf)) != 1:
        return None
    plus = _users(erf)[0]
    if plus.target is not aten.add.Tensor or not _scalar_arg(plus, 1) or plus.kwargs or len(_users(plus)) != 1:
        return None
    final = _users(plus)[0]
    if final.target is not aten.mul.Tensor or set(final.args) != {half, plus} or _users(half) != [final]:
        return None
    return "gelu", [half, inner, erf, plus, final]


def _silu(y) -> tuple | None:
    users = _users(y)
    if len(users) != 2:
        return None
    sig = next((u for u in users if u.target is aten.sigmoid.default), None)
    mul = next((u for u in users if u.target is aten.mul.Tensor), None)
    if sig is None or mul is None or _users(sig) != [mul] or set(mul.args) != {y, sig}:
        return None
    return "swish", [sig, mul]


def _clamped_plus_3(add) -> list | None:
    """``[add, clamp(add, 0), clamp(that, None, 6)]`` when ``add`` is ``y + 3`` followed by
    those two clamps (each the only reader of the one before), else None."""
    if add.target is not aten.add.Tensor or not _scalar_arg(add, 3) or add.kwargs or len(_users(add)) != 1:
        return None
    low = _users(add)[0]
    if low.target is not aten.clamp.default or low.kwargs or tuple(low.args[1:]) not in ((0,), (0, None)):
        return None
    if len(_users(low)) != 1:
        return None
    high = _users(low)[0]
    if high.target is not aten.clamp.default or high.kwargs or tuple(high.args[1:]) != (None, 6):
        return None
    return [add, low, high] if len(_users(high)) == 1 else None


def _divided_by_6(node) -> bool:
    return node.target is aten.div.Tensor and _scalar_arg(node, 6) and not node.kwargs


def _hardsigmoid(y) -> tuple | None:
    users = _users(y)
    clamped = _clamped_plus_3(users[0]) if len(users) == 1 and users[0].args[0] is y else None
    if clamped is None or not _divided_by_6(div := _users(clamped[-1])[0]):
        return None
    return "hardsigmoid", [*clamped, div]


def _hardswish(y) -> tuple | None:
    users = _users(y)
    if len(users) != 2:
        return None
    add = next((u for u in users if u.target is aten.add.Tensor and u.args[0] is y), None)
    mul = next((u for u in users if u.target is aten.mul.Tensor), None)
    clamped = _clamped_plus_3(add) if add is not None and mul is not None else None
    if clamped is None or _users(clamped[-1]) != [mul] or set(mul.args) != {y, clamped[-1]}:
        return None
    if len(_users(mul)) != 1 or not _divided_by_6(div := _users(mul)[0]):
        return None
    return "hardswish", [*clamped, mul, div]


def _activation(y) -> tuple | None:
    """(post-op name, nodes) of the activation applied to ``y`` alone, or None."""
    users = _users(y)
    if len(users) == 1 and users[0].target in _UNARY:
        return _UNARY[users[0].target], users
    return _gelu(y) or _silu(y) or _hardswish(y) or _hardsigmoid(y)


def _residual(y) -> tuple | None:
    """(other node, add node) when ``y``'s only reader is ``add(y, other)`` of y's shape."""
    users = _users(y)
    if len(users) != 1:
        return None
    add = users[0]
    if add.target is not aten.add.Tensor or len(add.args) != 2 or add.kwargs:
        return None
    others = [a for a in add.args if a is not y]
    if len(others) != 1 or not hasattr(others[0], "op") or not _is_f32(others[0], add):
        return None
    if tuple(_val(others[0]).shape) != tuple(_val(y).shape) or tuple(_val(add).shape) != tuple(_val(y).shape):
        return None
    return others[0], add


_BATCH_NORM = aten._native_batch_norm_legit_no_training.default


def _batch_norm(y, constants: set) -> tuple | None:
    """(batch norm node, its ``getitem`` 0) when ``y``'s only reader is an eval-mode batch
    norm over constants (weight, bias, running mean and variance; weight and bias may be
    None) whose only used result is the normalised value."""
    users = _users(y)
    if len(users) != 1 or users[0].target is not _BATCH_NORM or users[0].args[0] is not y:
        return None
    bn = users[0]
    stats = bn.args[1:5]
    if any(s is not None and (not hasattr(s, "op") or s.op != "placeholder" or s.name not in constants)
           for s in stats) or stats[2] is None or stats[3] is None:
        return None
    reads = _users(bn)
    if len(reads) != 1 or reads[0].target is not operator.getitem or reads[0].args[1] != 0 or not _is_f32(reads[0]):
        return None
    return bn, reads[0]


def _linear_parts(node) -> tuple | None:
    """(x, weight, bias) of ``addmm(bias, x, W.T)`` / ``mm(x, W.T)``, else None."""
    if node.target is aten.addmm.default:
        if len(node.args) != 3 or node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return None
        bias, x, wt = node.args
        if not hasattr(bias, "op") or _val(bias) is None or _val(bias).dim() != 1:
            return None
    elif node.target is aten.mm.default:
        (x, wt), bias = node.args, None
    else:
        return None
    transposed = (wt.op == "call_function" and len(wt.args) >= 1
                  and (wt.target is aten.t.default
                       or (wt.target is aten.permute.default and list(wt.args[1]) == [1, 0])))
    if not transposed:
        return None
    weight = wt.args[0]
    if weight.op != "placeholder" or _val(weight) is None or _val(weight).dim() != 2:
        return None
    return x, weight, bias


def _conv_parts(node) -> tuple | None:
    if node.target is not aten.convolution.default or len(node.args) < 9:
        return None
    x, weight, bias, _stride, _padding, _dilation, transposed = node.args[:7]
    if transposed or weight.op != "placeholder" or _val(x) is None or _val(x).dim() != 4:
        return None
    if bias is not None and not hasattr(bias, "op"):
        return None
    return x, weight, bias


def match(node, constants: set, residual_ok: bool = True) -> GemmMatch | None:
    """The match rooted at GEMM/conv ``node``, or None.

    Args:
        constants: names of the placeholders that are weights or buffers (not inputs).
        residual_ok: whether a residual add may end the epilogue (False when another
            match already ends at that add).
    """
    parts = _linear_parts(node)
    kind = "linear"
    if parts is None:
        parts, kind = _conv_parts(node), "conv2d"
    if parts is None:
        return None
    x, weight, bias = parts
    if weight.name not in constants or not _is_f32(node, x, weight, *([bias] if bias is not None else [])):
        return None
    tail, views, folded = node, [], []
    batch_norm = _batch_norm(node, constants) if kind == "conv2d" else None
    if batch_norm is not None:
        tail, folded = batch_norm[1], list(batch_norm)
    n = _val(node).shape[-1] if kind == "linear" else None
    while kind == "linear" and len(_users(tail)) == 1 and _users(tail)[0].target in _RESHAPES:
        view = _users(tail)[0]
        if _val(view).shape[-1] != n:
            break
        tail = view
        views.append(view)
    found = _activation(tail)
    unary, residual = (found[0], None) if found else (None, None)
    epilogue = found[1] if found else []
    if found is None and residual_ok:
        res = _residual(tail)
        if res is not None:
            residual, epilogue = res[0], [res[1]]
            after = _users(res[1])
            if kind == "conv2d" and len(after) == 1 and after[0].target is aten.relu.default:
                unary, epilogue = "relu", [res[1], after[0]]
    if not epilogue:
        views = []
    return GemmMatch(kind, node, x, weight, bias, unary, residual, tuple([node, *folded, *views, *epilogue]),
                     batch_norm[0] if batch_norm else None)


def find(graph, constants: set) -> dict:
    """``final node -> GemmMatch`` for every match in ``graph`` (an ``fx.Graph``).

    Where two GEMMs end at the same residual add (``relu(bn(conv1(x)) + conv2(x))``),
    the match covering more nodes keeps it and the other is matched without it.
    """
    order = {node: i for i, node in enumerate(graph.nodes)}

    def rooted(node, residual_ok=True):
        m = match(node, constants, residual_ok)
        return m and dataclasses.replace(m, nodes=tuple(sorted(m.nodes, key=order.__getitem__)))

    found = {}
    for node in graph.nodes:
        m = rooted(node) if node.op == "call_function" else None
        if m is None:
            continue
        rival = found.get(m.final) if m.residual is not None else None
        if rival is not None:
            keep, other = (rival, m) if len(rival.nodes) >= len(m.nodes) else (m, rival)
            found[keep.final] = keep
            m = rooted(other.gemm, residual_ok=False)
            if m is None:
                continue
        found[m.final] = m
    return found
