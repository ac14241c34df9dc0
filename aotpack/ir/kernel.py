"""The fused-kernel IR: a small, printable, backend-neutral expression DAG.

Lowering builds, for every fused kernel, one expression per output over the kernel's
iteration domain ``outer_shape x (inner_size,)``: loop variables ``i0, i1, ...`` for
the rows and ``j`` for the inner dimension. Nodes:

* ``Load(buffer, index)`` – element ``index`` (an ``ir.Index``, in elements) of a buffer;
* ``Const(value, dtype)`` – a scalar literal;
* ``Cast(source, dtype)`` – a conversion;
* ``Op(name, args, dtype, params, convert)`` – a pointwise op named as in ``ops.OP_NAMES``
  (``add``, ``exp``, ``where``, ...); ``params`` are scalar attributes (an ``add``'s
  alpha, clamp bounds); ``convert`` says the result is converted to ``dtype`` (the op
  of a torch node) rather than already being of it (arithmetic lowering adds inside one
  node, e.g. var_mean's deviation);
* ``Piecewise(index, bounds, pieces, dtype)`` – ``pieces[k]`` where ``index`` lies in
  ``[bounds[k-1], bounds[k])`` (a ``cat``); only the chosen piece is evaluated, so a
  piece may read its input at an index that is out of range elsewhere;
* ``Reduce(kind, source, size, rows, row_shape, dtype, scale)`` – ``kind`` in
  ``sum|max|min|prod`` of ``source`` over ``j`` in ``range(size)``, read at row index
  ``rows`` (the reduction's own row variables when it is computed in this kernel).

Nodes are frozen and compare structurally (a ``Load`` compares its buffer by identity),
so equal subexpressions are equal values. The analyses a backend and the fuser need —
which reductions are read at another kernel's rows, which loads stride along ``j`` — are
functions of the IR here, not side effects of rendering. How a node becomes code is
each backend's business (``aotpack/backends/<name>/``).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Iterator, Union

import torch

from aotpack.ir.index import Index


@dataclass(frozen=True)
class Load:
    """``buffer[index]``: ``index`` is the element offset (strides already applied).

    ``buffer`` is an ``ir.graph.Buffer`` (any object with ``dtype``, compared by identity);
    this module does not import it, so the graph can build on the IR."""

    buffer: object
    index: Index

    @property
    def dtype(self) -> torch.dtype:
        """The buffer's dtype."""
        return self.buffer.dtype


@dataclass(frozen=True)
class Const:
    """A scalar literal (bool, int or float, NaN and inf included) of ``dtype``."""

    value: object
    dtype: torch.dtype


@dataclass(frozen=True)
class Cast:
    """``source`` converted to ``dtype`` (C-style value conversion, as torch's ``to``)."""

    source: "Expr"
    dtype: torch.dtype


@dataclass(frozen=True)
class Op:
    """Pointwise op ``name`` on ``args`` (already of the op's compute dtype).

    ``dtype`` is the result dtype; ``params`` are scalar attributes; ``convert`` is True
    for an op of the model (its result is converted to ``dtype``, as torch returns it).
    """

    name: str
    args: tuple
    dtype: torch.dtype
    params: tuple = ()
    convert: bool = True


@dataclass(frozen=True)
class Piecewise:
    """``pieces[k]`` for ``bounds[k-1] <= index < bounds[k]`` (``bounds[-1]`` is the end).

    ``torch.cat`` along a dimension: ``index`` is the output's index along it and piece
    ``k`` reads input ``k`` at ``index - bounds[k-1]``. Unlike ``where``, a backend must
    evaluate only the piece that is selected (its loads are out of bounds elsewhere).
    """

    index: Index
    bounds: tuple
    pieces: tuple
    dtype: torch.dtype


@dataclass(frozen=True)
class Reduce:
    """``kind``-reduction of ``source`` over ``j < size``, times ``scale`` (1/N for mean).

    ``rows`` is the row index the value is read at and ``row_shape`` the reduction's
    own rows; it can be computed inside a kernel only when those are the kernel's rows.
    ``origin`` (not part of the value) is the lowering's lazy value, so the fuser can
    give it a buffer when it is read across rows.
    """

    kind: str
    source: "Expr"
    size: int
    rows: tuple
    row_shape: tuple
    dtype: torch.dtype
    scale: float = 1.0
    origin: object = field(default=None, compare=False, repr=False)


Expr = Union[Load, Const, Cast, Op, Piecewise, Reduce]


def children(expr: Expr) -> tuple:
    """Operand nodes of ``expr``, in evaluation order."""
    if isinstance(expr, Cast):
        return (expr.source,)
    if isinstance(expr, Op):
        return expr.args
    if isinstance(expr, Piecewise):
        return expr.pieces
    if isinstance(expr, Reduce):
        return (expr.source,)
    return ()


def walk(expr: Expr) -> Iterator[Expr]:
    """Every node of ``expr``, depth first, parents before operands, left to right."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(children(node)))


def row_vars(outer_shape: tuple) -> list[Index]:
    """Row loop variables ``i0, i1, ...`` of a domain with rows ``outer_shape``."""
    return [Index.var(f"i{k}", size) for k, size in enumerate(outer_shape)]


def inner_var(size: int) -> Index:
    """The inner loop variable ``j`` over ``range(size)``."""
    return Index.var("j", size)


# ----------------------------------------------------------------------------- analyses


def foreign_reduction(exprs, outer_shape: tuple) -> Reduce | None:
    """The first reduction (in evaluation order) read at rows other than its own.

    Such a reduction cannot be computed inside a kernel over ``outer_shape``: each
    kernel row would need another row's result, so it gets a buffer of its own.
    """
    own = row_vars(tuple(outer_shape))
    for expr in exprs:
        for node in walk(expr):
            if isinstance(node, Reduce) and (tuple(node.row_shape) != tuple(outer_shape)
                                             or list(node.rows) != own):
                return node
    return None


@dataclass(frozen=True)
class InnerAccess:
    """How the kernel's loads step along ``j`` (what the tiling solver and domain choice use).

    strided: some load is not unit-stride along ``j`` (a transposing access: loop order
    matters). divisors: ``d`` of loads indexing with ``j // d`` or ``j % d`` (splitting
    ``j`` by ``d`` makes them affine).
    """

    strided: bool
    divisors: tuple


def inner_access(exprs, inner_size: int) -> InnerAccess:
    """Scan every ``Load`` of ``exprs`` for its stride along ``j``."""
    strided, divisors = False, set()
    j = inner_var(inner_size)
    for expr in exprs:
        for node in walk(expr):
            if not isinstance(node, Load):
                continue
            if node.index.coefficient("j") not in (0, 1):
                strided = True
            for atom in node.index.atoms():
                if "j" in atom.operand.variables():
                    strided = True
                    if atom.operand == j and atom.op in ("/", "%"):
                        divisors.add(atom.divisor)
    return InnerAccess(strided, tuple(sorted(divisors)))


def input_buffers(exprs) -> list:
    """Buffers the expressions load, in first-use (evaluation) order."""
    found: list = []
    for expr in exprs:
        for node in walk(expr):
            if isinstance(node, Load) and all(node.buffer is not b for b in found):
                found.append(node.buffer)
    return found


def has_reduce(exprs) -> bool:
    """Whether any reduction is computed in the expressions."""
    return any(isinstance(node, Reduce) for expr in exprs for node in walk(expr))


def online_softmax_pairs(exprs) -> dict:
    """``{max reduction: sum reduction}`` pairs a single (online) pass can compute together.

    A pair is ``M = reduce_max(A)`` and ``S = reduce_sum(exp(A - M))`` over the same ``j``
    and rows, ``A`` reading ``j`` (softmax, log_softmax): since
    ``exp(a - m') = exp(a - m) * exp(m - m')``, a running max with a rescaled running sum
    gives both in one sweep (Milakov & Gimelshein, "Online normalizer calculation for
    softmax", 2018).
    """
    pairs: dict = {}
    for expr in exprs:
        for node in walk(expr):
            if not (isinstance(node, Reduce) and node.kind == "sum" and node.dtype.is_floating_point):
                continue
            exp = node.source
            if not (isinstance(exp, Op) and exp.name == "exp" and len(exp.args) == 1):
                continue
            sub = exp.args[0]
            if not (isinstance(sub, Op) and sub.name == "sub" and not sub.params and len(sub.args) == 2):
                continue
            a, m = sub.args
            if (isinstance(m, Reduce) and m.kind == "max" and m.source == a and m.size == node.size
                    and m.rows == node.rows and m.dtype == node.dtype and m.scale == 1.0
                    and _reads_j(a) and m not in pairs):
                pairs[m] = node
    return pairs


def softmax_output(kernel) -> tuple | None:
    """``(M, S)`` when ``kernel``'s one output is ``exp(A - M) / S`` of an online pair.

    That output (softmax itself) can be written during the sweep that computes ``M`` and
    ``S``: each chunk stores ``exp(A - running max)`` and a final pass multiplies it by
    ``exp(chunk max - M) / S``, so ``exp`` runs once per element instead of twice.
    """
    if len(kernel.exprs) != 1 or kernel.row_outputs:
        return None
    out = kernel.exprs[0]
    if not (isinstance(out, Op) and out.name == "div" and len(out.args) == 2 and out.dtype.is_floating_point):
        return None
    numerator, total = out.args
    for maximum, paired in online_softmax_pairs(kernel.exprs).items():
        if paired == total and numerator == total.source and kernel.outputs[0].dtype == maximum.dtype:
            return maximum, total
    return None


def _reads_j(expr) -> bool:
    return any(isinstance(n, Load) and "j" in n.index.variables() for n in walk(expr))


def flat_reductions(kernel) -> bool:
    """Whether every output of ``kernel`` is a reduction of a reduction-free source.

    Such a kernel (``x.sum(0)``, ``x.amax(-1)``, ``x.mean()``) has no per-row work besides
    its accumulators, so a backend may reorder its loops freely: sweep rows across a
    block of columns, or split one long row among threads.
    """
    if not kernel.exprs or len(kernel.row_outputs) != len(kernel.exprs):
        return False
    return all(isinstance(e, Reduce) and not has_reduce([e.source]) for e in kernel.exprs)


def column_access(kernel) -> bool:
    """Whether ``kernel`` reads its rows as columns: some load strides along ``j`` while
    every load is unit-stride (or constant) along the last row variable.

    That is ``x.sum(0)`` of a row-major ``[R, C]``: walking ``j`` per output element reads
    with stride ``C``; sweeping the output elements (the last row variable) innermost reads
    contiguous memory instead.
    """
    if not kernel.outer_shape or kernel.outer_shape[-1] < 2:
        return False
    last = f"i{len(kernel.outer_shape) - 1}"
    strided = False
    for expr in kernel.exprs:
        for node in walk(expr):
            if not isinstance(node, Load):
                continue
            if any(last in atom.operand.variables() or "j" in atom.operand.variables()
                   for atom in node.index.atoms()):
                return False
            if node.index.coefficient(last) not in (0, 1):
                return False
            if node.index.coefficient("j") not in (0, 1):
                strided = True
    return strided


# ----------------------------------------------------------------------------- kernel


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True, eq=False)
class FusedKernel:
    """One fused kernel, frozen after lowering.

    Iteration domain ``outer_shape x (inner_size,)``; ``exprs[k]`` is the value of
    ``outputs[k]`` (a contiguous buffer) at row ``(i0, ...)`` and column ``j``, or, for
    a reduction output of shape ``outer_shape`` (+ kept 1s), once per row. ``inputs``
    are the loaded buffers in first-use order. ``kernel_id`` is a content hash of the
    printed IR with positional buffer names: equal kernels (repeated layers) share it.
    """

    name: str  # unique in the model, e.g. fused_exp_sub_3
    base_name: str  # name without the ordinal (the cache folder), e.g. fused_exp_sub
    outer_shape: tuple
    inner_size: int
    inputs: tuple
    outputs: tuple
    exprs: tuple
    access: InnerAccess = InnerAccess(False, ())
    has_reduction: bool = False
    row_outputs: tuple = ()  # indices of outputs written once per row (reduction results)

    @property
    def rows(self) -> int:
        """Number of rows, ``prod(outer_shape)``."""
        return math.prod(self.outer_shape)

    @property
    def kernel_id(self) -> str:
        """sha256 (24 hex digits) of the printed IR, buffer names positional."""
        body = self.format(with_name=False)
        return hashlib.sha256(body.encode()).hexdigest()[:24]

    def format(self, with_name: bool = True) -> str:
        """The kernel as text: signature, then one SSA line per distinct node.

        ``with_name=False`` leaves out the name and input layouts (the kernel reads
        only the offsets in its loads): the text ``kernel_id`` hashes.
        """
        names = {id(b): f"in{k}" for k, b in enumerate(self.inputs)}
        domain = ", ".join([f"i{k}<{s}" for k, s in enumerate(self.outer_shape)] + [f"j<{self.inner_size}"])
        head = f"kernel {self.name}" if with_name else "kernel"
        lines = [f"{head} [{domain}]"]
        for k, b in enumerate(self.inputs):  # the kernel sees only offsets: shapes are for readers
            layout = f"{list(b.shape)} strides {list(b.strides)}" if with_name else ""
            lines.append(f"  in{k}: {_dtype_name(b.dtype)}{layout}")
        printer = _Printer(names)
        for k, (out, expr) in enumerate(zip(self.outputs, self.exprs)):
            result = printer.node(expr)
            lines.extend(printer.flush())
            per_row = " per row" if k in self.row_outputs else ""
            lines.append(f"  out{k}: {_dtype_name(out.dtype)}{list(out.shape)}{per_row} = {result}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


class _Printer:
    """Numbers distinct nodes ``%1, %2, ...`` in evaluation order."""

    def __init__(self, buffer_names: dict[int, str]):
        self.buffer_names = buffer_names
        self.numbers: dict = {}
        self.pending: list[str] = []

    def flush(self) -> list[str]:
        lines, self.pending = self.pending, []
        return lines

    def node(self, expr: Expr) -> str:
        if isinstance(expr, Const):
            return f"{expr.value!r}:{_dtype_name(expr.dtype)}"
        if expr in self.numbers:
            return self.numbers[expr]
        if isinstance(expr, Load):
            text = f"load {self.buffer_names[id(expr.buffer)]}[{expr.index.render()}]"
        elif isinstance(expr, Cast):
            text = f"cast {self.node(expr.source)}"
        elif isinstance(expr, Op):
            params = f" {{{', '.join(map(repr, expr.params))}}}" if expr.params else ""
            args = ", ".join(self.node(a) for a in expr.args)
            text = f"{expr.name}{'' if expr.convert else '.raw'}({args}){params}"
        elif isinstance(expr, Piecewise):
            ranges = ", ".join(f"<{bound}: {self.node(piece)}" for bound, piece in zip(expr.bounds, expr.pieces))
            text = f"piecewise[{expr.index.render()}]({ranges})"
        else:
            rows = ", ".join(r.render() for r in expr.rows)
            scale = f" * {expr.scale!r}" if expr.scale != 1.0 else ""
            text = f"reduce_{expr.kind}[j<{expr.size}, rows ({rows})]({self.node(expr.source)}){scale}"
        number = f"%{len(self.numbers) + 1}"
        self.numbers[expr] = number
        self.pending.append(f"  {number}: {_dtype_name(expr.dtype)} = {text}")
        return number
