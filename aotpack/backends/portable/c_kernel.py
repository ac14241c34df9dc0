"""One fused kernel (``ir.kernel.FusedKernel``) as plain C99: the portable backend's renderer.

The loop form is fixed: an outer loop over the kernel's rows (``r``, split into ``i0, i1,
...``), in it one loop over ``j`` per reduction (in dependency order, each into its own
accumulator: double for float sums and products), then the row's per-row outputs and one
write loop over ``j < inner_size`` for the others. No intrinsics, no OpenMP, no hoisting by
hand: the compiler's loop-invariant motion and auto-vectoriser do what they can.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from aotpack.backends.portable.c_formulas import C_TYPES, accumulator, formula, literal
from aotpack.ir.index import contiguous_strides
from aotpack.ir.kernel import Cast, Const, FusedKernel, Load, Op, Piecewise, Reduce

COMBINE = {
    "sum": "{acc} = {acc} + {v};",
    "prod": "{acc} = {acc} * {v};",
    "max": "{acc} = {acc} > {v} ? {acc} : {v};",
    "min": "{acc} = {acc} < {v} ? {acc} : {v};",
}


class _Block:
    """Lines of one C block and the values already computed in it (common subexpressions)."""

    def __init__(self):
        self.lines: list[str] = []
        self.values: dict = {}


class CWriter:
    """Turns a kernel's expressions into C lines: ``value(node)`` returns the C variable or
    literal of ``node`` in the innermost open block, computing it there (or finding it in an
    enclosing block) first. Reductions are computed once per row, in the row block."""

    def __init__(self, kernel: FusedKernel):
        self.kernel = kernel
        self.names = {id(buf): f"in{k}" for k, buf in enumerate(kernel.inputs)}
        self.row = _Block()
        self.stack = [self.row]
        self.counter = 0
        self.reductions = 0

    def _find(self, node):
        for block in reversed(self.stack):
            if node in block.values:
                return block.values[node]
        return None

    def _define(self, node, ctype: str, text: str) -> str:
        self.counter += 1
        name = f"t{self.counter}"
        self.stack[-1].lines.append(f"const {ctype} {name} = {text};")
        self.stack[-1].values[node] = name
        return name

    def value(self, node) -> str:
        """C expression holding ``node`` at the current loop position."""
        if isinstance(node, Const):
            return literal(node.value, C_TYPES[node.dtype])
        found = self._find(node)
        if found is not None:
            return found
        if isinstance(node, Reduce):
            return self._reduction(node)
        if isinstance(node, Piecewise):
            return self._piecewise(node)
        ctype = C_TYPES[node.dtype]
        if isinstance(node, Load):
            return self._define(node, ctype, f"{self.names[id(node.buffer)]}[{node.index.render()}]")
        if isinstance(node, Cast):
            return self._define(node, ctype, f"({ctype})({self.value(node.source)})")
        if isinstance(node, Op):
            args = [self.value(arg) for arg in node.args]
            text = formula(node.name, node.params, node.dtype, C_TYPES[node.args[-1].dtype]).format(*args)
            return self._define(node, ctype, f"({ctype})({text})" if node.convert else text)
        raise TypeError(f"portable backend: no C for IR node {type(node).__name__}")

    def _piecewise(self, node: Piecewise) -> str:
        """An if/else chain: only the selected piece is evaluated (the others may read out of
        bounds), so nothing computed inside a branch is visible after it."""
        self.counter += 1
        name = f"t{self.counter}"
        outer = self.stack[-1]
        outer.lines.append(f"{C_TYPES[node.dtype]} {name};")
        last = len(node.pieces) - 1
        for k, (bound, piece) in enumerate(zip(node.bounds, node.pieces)):
            branch = _Block()
            self.stack.append(branch)
            value = self.value(piece)
            self.stack.pop()
            head = f"if ({node.index.render()} < {bound}) {{"
            outer.lines.append(head if k == 0 else ("} else " + head if k < last else "} else {"))
            outer.lines += ["  " + line for line in branch.lines] + [f"  {name} = {value};"]
        outer.lines.append("}")
        outer.values[node] = name
        return name

    def _reduction(self, red: Reduce) -> str:
        """``red`` for this row: a loop over ``j < size`` in the row block (its source's
        values live in the loop body only), NaN kept by float max/min as torch does."""
        number = self.reductions
        self.reductions += 1
        saved, body = self.stack, _Block()
        self.stack = [self.row, body]
        value = self.value(red.source)
        self.stack = saved
        ctype = C_TYPES[red.dtype]
        acc_type, init = accumulator(red.kind, red.dtype)
        acc, nan = f"acc{number}", f"nan{number}"
        tracks_nan = red.kind in ("max", "min") and red.dtype.is_floating_point
        lines = [f"{acc_type} {acc} = {init};"] + ([f"int {nan} = 0;"] if tracks_nan else [])
        lines.append(f"for (int64_t j = 0; j < {red.size}; ++j) {{")
        lines += ["  " + line for line in body.lines]
        lines.append("  " + COMBINE[red.kind].format(acc=acc, v=f"({acc_type})({value})"))
        if tracks_nan:
            lines.append(f"  {nan} |= ({value} != {value});")
        lines.append("}")
        result = f"({ctype})({acc})"
        if red.scale != 1.0:
            scale = repr(red.scale) if math.isfinite(red.scale) else literal(red.scale, "double")
            result = f"({ctype})({acc} * {scale})"
        if tracks_nan:
            result = f"{nan} ? ({ctype})NAN : {result}"
        self.row.lines += lines + [f"const {ctype} red{number} = {result};"]
        self.row.values[red] = f"red{number}"
        return f"red{number}"


@dataclass(frozen=True)
class KernelBody:
    """The pieces of one kernel the template puts into its loop frame."""

    args: list  # (C name, C type, is_output)
    outer: list  # (row variable, stride in rows, size)
    rows: int
    cols: int
    row_lines: list  # per row: reductions, per-row outputs
    write_lines: list  # per j of the write loop; empty when every output is per row


def build_body(kernel: FusedKernel) -> KernelBody:
    """Emit ``kernel``'s loads, math and stores. Per-row outputs first, in the row block,
    so what they compute is in scope for the write loop too."""
    writer = CWriter(kernel)
    stores = []
    for k, (out, expr) in enumerate(zip(kernel.outputs, kernel.exprs)):
        if k in kernel.row_outputs:
            stores.append(f"out{k}[r] = ({C_TYPES[out.dtype]})({writer.value(expr)});")
    writer.row.lines += stores
    write = _Block()
    writer.stack = [writer.row, write]
    for k, (out, expr) in enumerate(zip(kernel.outputs, kernel.exprs)):
        if k not in kernel.row_outputs:
            var = writer.value(expr)
            write.lines.append(f"out{k}[r * {kernel.inner_size} + j] = ({C_TYPES[out.dtype]})({var});")
    args = [(f"in{k}", C_TYPES[buf.dtype], False) for k, buf in enumerate(kernel.inputs)]
    args += [(f"out{k}", C_TYPES[buf.dtype], True) for k, buf in enumerate(kernel.outputs)]
    outer = [(f"i{k}", stride, size)
             for k, (stride, size) in enumerate(zip(contiguous_strides(kernel.outer_shape), kernel.outer_shape))]
    return KernelBody(args, outer, math.prod(kernel.outer_shape), kernel.inner_size, writer.row.lines, write.lines)
