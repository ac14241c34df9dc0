"""Structural affine index arithmetic for fused kernels (``Index`` with div/mod ``Atom``s).

An index is ``sum(coef * atom) + const`` over loop variables and floordiv/modulo atoms
that could not be simplified away; keeping them as terms keeps every index affine, so
strides stay visible and later floordiv/modulo can still fold back.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

@dataclass(frozen=True)
class Index:
    """An integer index expression: ``sum(coef * atom) + const``, coefficients positive.

    The value is non-negative wherever it is read. ``const`` may be negative in a piece
    of a ``kernel_ir.Piecewise`` (a ``cat`` input read at ``index - offset``): there the
    value is only evaluated where it is in range, and every simplification below is
    exact for any integer (floor division and modulo as Python's).

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

    def atoms(self) -> list["Atom"]:
        """Every atom (div, mod, reversal) of the terms, and those inside their operands."""
        found = []
        for name, _, _ in self.terms:
            if isinstance(name, Atom):
                found += [name] + name.operand.atoms()
        return found

    def reversed(self, extent: int) -> "Index":
        """``(extent - 1) - self`` for ``self`` in ``range(extent)`` (``torch.flip``).

        A negative coefficient would break the non-negative terms every simplification
        relies on, so the reversal is one atom over ``range(extent)`` (stride -1 to
        whoever reads its coefficient: the tiler treats it as a strided access).
        """
        if extent <= 1:
            return Index.constant(0)
        return _atom(self, "rev", extent, extent)

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
    """``operand / divisor``, ``operand % divisor`` or ``(divisor - 1) - operand`` (``op``
    ``/``, ``%``, ``rev``), kept as one index term.

    Identity is structural (the operand includes its variables' extents), so two atoms
    that print alike but range differently are never confused.
    """

    operand: Index
    op: str  # "/", "%", or "rev": (divisor - 1) - operand
    divisor: int

    def __str__(self) -> str:
        if self.op == "rev":
            return f"({self.divisor - 1} - ({self.operand.render()}))"
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
