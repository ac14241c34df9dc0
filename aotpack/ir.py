"""The aotpack IR: index arithmetic, buffers, and lazy tensor values.

Lowering turns every FX value into one of:

* ``Buffer`` – a materialised tensor (graph input, constant, extern-call result, or
  fused-kernel output) with static shape and strides (in elements);
* ``StridedView`` – a view of a buffer expressible as (sizes, strides, offset);
* ``Pointwise`` – a lazy value: a function from an index to a scalar C expression;
* ``Reduction`` – a lazy reduction over the innermost ``reduce_size`` elements.

Lazy values are code generators (Inductor's ``inner_fn`` idea): calling
``value.load(ctx, index)`` emits C++ into a ``kernel_codegen.KernelContext`` and
returns the name of the variable holding the element at ``index``. Views of lazy
values become index arithmetic (``Index``), so they cost nothing at run time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

# ----------------------------------------------------------------------------- index


@dataclass(frozen=True)
class Index:
    """An integer index expression: ``sum(coef * atom) + const``, all non-negative.

    ``terms`` holds ``(atom, coef, extent)``: an atom is a loop variable name (``i0``,
    ``j``) or, when a floordiv/modulo cannot be simplified away, an ``Atom`` for that
    sub-expression (``((i0) / 4)``), with ``extent`` its exclusive upper bound. Keeping
    such atoms as terms keeps every index affine, so strides stay visible (e.g. to spot
    transposing access) and later floordiv/modulo can still simplify.
    """

    terms: tuple = ()
    const: int = 0

    @staticmethod
    def var(name: str, extent: int) -> "Index":
        """Loop variable ``name`` running over ``range(extent)`` (constant 0 if extent <= 1)."""
        return Index(((name, 1, extent),), 0) if extent > 1 else Index((), 0)

    @staticmethod
    def constant(value: int) -> "Index":
        """The integer ``value``."""
        return Index((), int(value))

    @property
    def upper(self) -> int:
        """Exclusive upper bound of the value."""
        return self.const + sum(c * (e - 1) for _, c, e in self.terms) + 1

    def coefficient(self, atom: str) -> int:
        """Coefficient of ``atom`` (e.g. the stride along loop variable ``j``)."""
        return sum(c for name, c, _ in self.terms if name == atom)

    def divisions(self) -> list["Atom"]:
        """The div/mod atoms among the terms."""
        return [name for name, _, _ in self.terms if isinstance(name, Atom)]

    def variables(self) -> set[str]:
        """Loop variables this index depends on, also through div/mod atoms."""
        found = set()
        for name, _, _ in self.terms:
            found |= name.operand.variables() if isinstance(name, Atom) else {name}
        return found

    def __add__(self, other: "Index | int") -> "Index":
        other = other if isinstance(other, Index) else Index.constant(other)
        merged: dict[str, list] = {}
        for name, coef, extent in self.terms + other.terms:
            slot = merged.setdefault(name, [0, extent])
            slot[0] += coef
        terms = tuple(sorted(((n, c, e) for n, (c, e) in merged.items() if c != 0), key=lambda t: str(t[0])))
        return _recombine(Index(terms, self.const + other.const))

    def scale(self, factor: int) -> "Index":
        """``self * factor`` (factor >= 0: strides and slice steps)."""
        if factor == 0:
            return Index.constant(0)
        return Index(tuple((n, c * factor, e) for n, c, e in self.terms), self.const * factor)

    def _split(self, divisor: int) -> tuple["Index", "Index"]:
        """(part divisible by divisor, remainder part)."""
        div_terms = tuple(t for t in self.terms if t[1] % divisor == 0)
        rest_terms = tuple(t for t in self.terms if t[1] % divisor != 0)
        quotient, remainder = divmod(self.const, divisor)
        return Index(div_terms, quotient * divisor), Index(rest_terms, remainder)

    def _factor(self, divisor: int) -> tuple[int, "Index", "Index"] | None:
        """(g, big/g, small) with self = g*big/g + small, g | divisor, 0 <= small < g.

        Then floor(self / d) = floor((big/g) / (d/g)) and self % d = g*((big/g) % (d/g)) + small.
        """
        for g in sorted({c for _, c, _ in self.terms if divisor % c == 0 and c > 1}, reverse=True):
            whole, small = self._split(g)
            if small.upper <= g:
                return g, Index(tuple((n, c // g, e) for n, c, e in whole.terms), whole.const // g), small
        return None

    def floordiv(self, divisor: int) -> "Index":
        """``self // divisor`` (divisor > 0), simplified exactly using atom ranges."""
        if divisor == 1:
            return self
        if self.upper <= divisor:
            return Index.constant(0)
        whole, rest = self._split(divisor)
        quotient = Index(tuple((n, c // divisor, e) for n, c, e in whole.terms), whole.const // divisor)
        if rest.upper <= divisor:
            return quotient
        if whole.terms or whole.const:  # (d*q + rest) // d == q + rest // d
            return quotient + rest.floordiv(divisor)
        factored = self._factor(divisor)
        if factored:
            g, big, _ = factored
            return big.floordiv(divisor // g)
        return _atom(self, "/", divisor, (self.upper - 1) // divisor + 1)

    def mod(self, divisor: int) -> "Index":
        """``self % divisor`` (divisor > 0), simplified exactly using atom ranges."""
        if divisor == 1:
            return Index.constant(0)
        if self.upper <= divisor:
            return self
        _, rest = self._split(divisor)
        if rest.upper <= divisor:
            return rest
        factored = self._factor(divisor)
        if factored:
            g, big, small = factored
            return big.mod(divisor // g).scale(g) + small
        if len(rest.terms) < len(self.terms):  # (d*q + rest) % d == rest % d
            return rest.mod(divisor)
        return _atom(self, "%", divisor, divisor)

    def render(self) -> str:
        """C++ expression (int64 arithmetic; '/' and '%' on non-negative values)."""
        parts = [str(name) if coef == 1 else f"{coef} * {name}" for name, coef, _ in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


@dataclass(frozen=True)
class Atom:
    """``operand / divisor`` or ``operand % divisor`` (``op``), kept as one index term.

    Identity is structural (the operand includes its variables' extents), so two atoms
    that print alike but range differently are never confused.
    """

    operand: Index
    op: str
    divisor: int

    def __str__(self) -> str:
        return f"(({self.operand.render()}) {self.op} {self.divisor})"


def _atom(operand: Index, op: str, divisor: int, extent: int) -> Index:
    """``operand / divisor`` or ``operand % divisor`` as one term over ``range(extent)``."""
    if extent <= 1:
        return Index.constant(0)
    return Index(((Atom(operand, op, divisor), 1, extent),), 0)


def _recombine(index: Index) -> Index:
    """Fold ``c*d*(E / d) + c*(E % d)`` back into ``c*E`` (a split index merged again)."""
    coefs = {name: coef for name, coef, _ in index.terms}
    for name, coef, _ in index.terms:
        if not isinstance(name, Atom) or name.op != "/":
            continue
        partner = Atom(name.operand, "%", name.divisor)
        if coef % name.divisor == 0 and coefs.get(partner) == coef // name.divisor:
            rest = Index(tuple(t for t in index.terms if t[0] not in (name, partner)), index.const)
            return rest + name.operand.scale(coef // name.divisor)
    return index


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides in elements for ``shape``."""
    strides, running = [], 1
    for size in reversed(shape):
        strides.append(running)
        running *= max(size, 1)
    return tuple(reversed(strides))


def flat_index(index: Sequence[Index], shape: Sequence[int]) -> Index:
    """Row-major linear index of a multi-index into ``shape``."""
    total = Index.constant(0)
    for idx, stride in zip(index, contiguous_strides(shape)):
        total = total + idx.scale(stride)
    return total


def unflatten_index(flat: Index, shape: Sequence[int]) -> list[Index]:
    """Multi-index into ``shape`` of a row-major linear index."""
    return [flat.floordiv(stride).mod(size) if size > 1 else Index.constant(0)
            for stride, size in zip(contiguous_strides(shape), shape)]


# ----------------------------------------------------------------------------- values

#: dtypes fused kernels compute in, with their C++ type.
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


class Value:
    """A tensor value during lowering: static ``shape`` and ``dtype``."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    def load(self, ctx, index: Sequence[Index]) -> str:  # pragma: no cover - interface
        """Emit code reading element ``index`` into ``ctx``; return its C variable name."""
        raise NotImplementedError

    @property
    def numel(self) -> int:
        """Element count."""
        return math.prod(self.shape)


@dataclass(eq=False)
class Buffer(Value):
    """A materialised tensor.

    ``kind`` is ``input`` (graph input), ``constant`` (weight/buffer, from the
    safetensors file), ``extern`` (result of an ATen call) or ``kernel`` (written by a
    fused kernel). Strides are in elements.
    """

    name: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: torch.dtype
    kind: str
    #: buffers whose memory this one may share (an extern op that returns a view)
    aliases: tuple = ()

    def roots(self) -> list["Buffer"]:
        """This buffer and every buffer it may alias, transitively."""
        found, todo = [], [self]
        while todo:
            buf = todo.pop()
            if all(buf is not f for f in found):
                found.append(buf)
                todo.extend(buf.aliases)
        return found

    def load(self, ctx, index):
        offset = Index.constant(0)
        for idx, stride in zip(index, self.strides):
            offset = offset + idx.scale(stride)
        return ctx.load(self, offset)


@dataclass(eq=False)
class StridedView(Value):
    """A view of ``base`` given as sizes, strides and element offset (as_strided)."""

    base: Buffer
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int

    @property
    def dtype(self):
        return self.base.dtype

    def load(self, ctx, index):
        offset = Index.constant(self.offset)
        for idx, stride in zip(index, self.strides):
            offset = offset + idx.scale(stride)
        return ctx.load(self.base, offset)


class Lazy(Value):
    """A value computed inside a fused kernel until ``realize`` gives it a buffer."""

    realized: Buffer | None = None
    #: number of arithmetic ops in the expression tree (guides fan-out realisation)
    op_count: int = 0
    #: a reduction or transcendental op somewhere inside: costly to recompute
    expensive: bool = False
    #: short names of the ops inside, for kernel names
    op_names: tuple = ()
    #: reads an unrealised reduction: its kernel's rows are the reduction's rows
    reduces: bool = False


@dataclass(eq=False)
class Pointwise(Lazy):
    """Element ``index`` is ``fn(ctx, index)``: emits code, returns a C variable name."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    fn: Callable
    op_count: int = 0
    expensive: bool = False
    op_names: tuple = ()
    reduces: bool = False
    realized: Buffer | None = None

    def load(self, ctx, index):
        if self.realized is not None:
            return self.realized.load(ctx, index)
        return self.fn(ctx, list(index))


@dataclass(eq=False)
class Reduction(Lazy):
    """Reduce ``source`` over its innermost ``reduce_size`` elements.

    ``source`` has shape ``outer_shape + (reduce_size,)``; the value has ``shape``
    (``outer_shape`` with kept dims of size 1 where ``keepdim``). ``kind`` is one of
    ``sum``, ``max``, ``min``, ``prod``; ``scale`` multiplies the result (1/N for mean).
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    source: Value
    outer_shape: tuple[int, ...]
    reduce_size: int
    kind: str
    scale: float = 1.0
    kept_dims: tuple[int, ...] = ()
    op_count: int = 1
    expensive: bool = True
    op_names: tuple = ()
    reduces: bool = True
    realized: Buffer | None = None

    def load(self, ctx, index):
        if self.realized is not None:
            return self.realized.load(ctx, index)
        outer = [idx for dim, idx in enumerate(index) if dim not in self.kept_dims]
        return ctx.reduction(self, outer)


def base_buffer(value: Value) -> Buffer | None:
    """The buffer behind a value that needs no kernel to read, else None."""
    if isinstance(value, Buffer):
        return value
    if isinstance(value, StridedView):
        return value.base
    if isinstance(value, Lazy) and value.realized is not None:
        return value.realized
    return None


def as_strided_parts(value: Value) -> tuple[Buffer, tuple, tuple, int] | None:
    """(base, sizes, strides, offset) when the value is a buffer or a view of one."""
    if isinstance(value, Lazy) and value.realized is not None:
        value = value.realized
    if isinstance(value, Buffer):
        return value, value.shape, value.strides, 0
    if isinstance(value, StridedView):
        return value.base, value.shape, value.strides, value.offset
    return None


# ----------------------------------------------------------------------------- graph


@dataclass(eq=False)
class FusedKernel:
    """One fused kernel: writes ``outputs`` (contiguous buffers) from lazy ``values``.

    All outputs share one iteration domain ``outer_shape x (inner_size,)``; an output
    of shape ``outer_shape (+ kept 1s)`` is a reduction result written once per row.
    """

    name: str  # unique in the model, e.g. fused_exp_sub_3
    base_name: str  # name without the ordinal: the cache folder (fused_exp_sub)
    outputs: list[Buffer]
    values: list[Lazy]
    outer_shape: tuple[int, ...]
    inner_size: int
    has_reduction: bool
    inputs: list[Buffer] = field(default_factory=list)
    body: object = None  # kernel_codegen.KernelBody, frozen when the kernel is created


@dataclass(eq=False)
class ExternArg:
    """One schema argument of an extern call, already normalised.

    ``kind`` is an ``AotpackArgKind`` name (``tensor``, ``int``, ``double``, ``bool``,
    ``int_list``, ``double_list``, ``bool_list``, ``tensor_list``, ``none``, ``string``,
    ``scalar_type``, ``layout``, ``device``, ``memory_format``); tensors are
    ``(base, sizes, strides, offset)`` tuples.
    """

    kind: str
    value: object


@dataclass(eq=False)
class ExternCall:
    """``outputs = aten::<op>.<overload>(*args)`` through the ATen dispatcher."""

    op: object  # torch._ops.OpOverload
    args: list[ExternArg]
    outputs: list[Buffer | None]


@dataclass(eq=False)
class KernelCall:
    """Launch ``kernel`` (its chosen candidate) on its input and output buffers."""

    kernel: FusedKernel


@dataclass(eq=False)
class CopyBack:
    """Write ``source`` into ``target``: a mutated input/constant, or a branch result."""

    target: Buffer
    source: Buffer | StridedView


@dataclass(eq=False)
class CondStep:
    """``torch.cond``: run ``true_steps`` or ``false_steps`` by the 0-d bool ``pred``.

    ``results`` are allocated before the branch runs; each branch ends by copying its
    outputs into them, so code after the cond sees one layout whichever branch ran.
    """

    pred: tuple  # (base, sizes, strides, offset)
    results: list[Buffer]
    true_steps: list
    false_steps: list


@dataclass(eq=False)
class Graph:
    """The lowered program: steps in execution order over named buffers."""

    inputs: list[Buffer]
    constants: list[Buffer]
    constant_tensors: dict  # name -> torch.Tensor (contiguous)
    steps: list
    outputs: list  # (base, sizes, strides, offset) per graph output
    kernels: list[FusedKernel]
    mutated_buffers: list[str] = field(default_factory=list)  # constants written in place
    mutated_inputs: list[str] = field(default_factory=list)  # caller's inputs written in place
