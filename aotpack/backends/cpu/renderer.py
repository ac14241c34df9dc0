"""The CPU renderer: one fused kernel (``kernel_ir``) with one tiling -> C++ source.

Every shape, stride and tiling parameter is a compile-time constant. The loop frame
comes from ``templates/cpu_kernel.cpp.j2``; this module turns the kernel's expression
DAG into the loop bodies (``KernelWriter``), with the formulas of ``formulas``.

Iteration domain: ``rows = prod(outer_shape)`` rows of ``inner_size`` elements.
A kernel that reduces computes each reduction once per row, in a loop of its own
before the row's write loop (softmax/layer_norm become one row kernel).
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

import torch

from aotpack.backends.cpu import lane_sum
from aotpack.backends.cpu.formulas import C_TYPES, formula, literal, optional_helpers
from aotpack.ir.index import Index, contiguous_strides
from aotpack.ir.kernel import Cast, Const, FusedKernel, Load, Op, Piecewise, Reduce, online_softmax_pairs
from aotpack.backends.cpu.templating import render


#: Placeholder in a frozen body where a tiling's ``simdlen`` clause goes.
SIMDLEN_MARK = "@SIMDLEN@"


#: Elements per chunk of an online softmax sweep (4 KiB of float32: re-read from L1).
ONLINE_CHUNK = 1024

REDUCTION_CLAUSE = {"sum": "+", "prod": "*", "max": "max", "min": "min"}
REDUCTION_COMBINE = {
    "sum": "{acc} = {acc} + {v};",
    "prod": "{acc} = {acc} * {v};",
    "max": "{acc} = {acc} > {v} ? {acc} : {v};",
    "min": "{acc} = {acc} < {v} ? {acc} : {v};",
}
_TOKEN = re.compile(r"[A-Za-z_]\w*")


def _accumulator(kind: str, dtype) -> tuple[str, str]:
    """(C type, initial value) of a reduction's accumulator.

    Float sums and products accumulate in double: a float32 accumulator over millions
    of elements drifts by 1e-3 relative (ATen uses a cascade sum for the same reason).
    A float32 row sum first adds each chunk in float lanes (``lane_sum``), then the chunks here.
    Integer max/min start from the type's limits (an integer has no infinity); bool
    reduces as int, which OpenMP's max/min clauses accept.
    """
    ctype = "int" if dtype == torch.bool else C_TYPES[dtype]
    if kind in ("sum", "prod"):
        return ("double" if dtype.is_floating_point else ctype), ("0" if kind == "sum" else "1")
    if dtype.is_floating_point:
        sign = "-" if kind == "max" else ""
        return ctype, f"{sign}ap::limits<{ctype}>::infinity()"
    return ctype, f"ap::limits<{ctype}>::{'lowest' if kind == 'max' else 'max'}()"


#: The formula of an ``exp`` whose argument is known <= 0 (``exp_of_nonpositive``).
NONPOSITIVE_EXP = "ap::exp_nonpositive({0})"


def piece_condition(index: Index, bound: int) -> str:
    """``index < bound`` (a ``Piecewise`` bound) as C++, without ``j`` where ``j`` cannot
    move the index across the bound: every other term and ``bound - const`` are multiples
    of some g and ``j``'s terms stay below g. So a ``cat`` of whole rows read a row at a
    time (piece k for rows [a, b) of the input) compares row-invariant values, and GCC
    takes the branch out of the ``j`` loop instead of masking every piece's loads in it.
    Exact: with R and B multiples of g and 0 <= t < g, R + t < B iff R < B."""
    j_terms = tuple(t for t in index.terms if t[0] == "j")
    rest = tuple(t for t in index.terms if t[0] != "j")
    if j_terms and rest:
        reach = sum(coef * (extent - 1) for _, coef, extent in j_terms)
        grain = math.gcd(*(coef for _, coef, _ in rest))
        if reach < grain and (bound - index.const) % grain == 0:
            return f"{Index(rest, index.const).render()} < {bound}"
    return f"{index.render()} < {bound}"


def exp_of_nonpositive(node, inner_size: int) -> bool:
    """Whether ``node`` is ``exp(a - max(a))`` with the max over the row being read.

    Softmax's and log_softmax's exp: ``a`` at any ``j`` of the row is at most the row's
    max, and at most the running max of every chunk read so far (the online and stored
    forms subtract that), so the argument is <= 0 (or NaN, from a NaN or from
    ``inf - inf``), and ``ap::exp_nonpositive`` applies. Any other exp (sigmoid, tanh,
    a user's exp) keeps the general ``ap::exp``.
    """
    if not (isinstance(node, Op) and node.name == "exp" and len(node.args) == 1
            and node.dtype.is_floating_point):
        return False
    sub = node.args[0]
    if not (isinstance(sub, Op) and sub.name == "sub" and not sub.params and len(sub.args) == 2):
        return False
    a, m = sub.args
    return (isinstance(m, Reduce) and m.kind == "max" and m.scale == 1.0 and m.source == a
            and m.size == inner_size)


class _Block:
    def __init__(self):
        self.lines: list[str] = []
        self.cse: dict[str, str] = {}
        self.pieces: dict[Piecewise, str] = {}  # piecewise values computed in this block


def chunk_max_lines(ctype: str, acc_type: str, chunk: int, size: int, block_lines: list, value: str,
                    running: str, total: str, nan_flag: str) -> list[str]:
    """The body of one chunk ``[jc, jc_end)`` of an online max/sum sweep (C++ lines): the
    chunk's max and NaN flag, then the running max ``running`` raised to it, with the
    running sum ``total`` rescaled by ``exp(old - new)``. ``block_lines`` compute ``value``
    (the element) inside the chunk loop. Used by the online (``online=1``) and
    stored-exp (``softmax_store``) forms."""
    lines = [f"  const int64_t jc_end = ap::min_index(jc + {chunk}, {size});",
             f"  {ctype} cm = -ap::limits<{ctype}>::infinity();", "  int cnan = 0;",
             f"  #pragma omp simd reduction(max:cm) reduction(|:cnan){SIMDLEN_MARK}",
             "  for (int64_t j = jc; j < jc_end; ++j) {"]
    lines += ["    " + line for line in block_lines]
    return lines + [f"    cm = cm > {value} ? cm : {value};", f"    cnan |= ({value} != {value});",
                    "  }", f"  {nan_flag} |= cnan;",
                    f"  if (cm > {running}) {{",
                    f"    {total} = {total} * ap::exp(static_cast<{acc_type}>({running}) - "
                    f"static_cast<{acc_type}>(cm));",
                    f"    {running} = cm;", "  }"]


class KernelWriter:
    """Collects the C++ of one kernel while rendering its expressions.

    ``value`` returns the C++ variable (or inline literal) of a node; expressions are
    common-subexpression eliminated within the enclosing blocks. An expression that
    does not depend on the inner loop variable ``j`` is hoisted into ``row_lines``: it
    runs once per row, after the reductions it reads (emitted there in dependency order).
    """

    def __init__(self, kernel: FusedKernel, online: bool = False):
        self.kernel = kernel
        # max reduction -> sum reduction computed with it in one pass (online softmax)
        self.online = online_softmax_pairs(kernel.exprs) if online else {}
        self.arg_names = {id(buf): f"in{k}" for k, buf in enumerate(kernel.inputs)}
        self.counter = 0
        self.row_block = _Block()
        self.stack = [self.row_block]
        self.reductions: dict[Reduce, str] = {}
        self.reduction_count = 0
        self.row_lines: list[str] = []
        self.depends_on_j: set[str] = {"j"}
        self.branches = 0  # depth of Piecewise pieces being written: nothing in them is hoisted
        self.j_splits: set[int] = set()  # j where a piece chosen by j alone changes (``j_segments``)
        self.write_block = None  # the write loop's block (``build_body``): only its pieces cut it

    def _new_var(self) -> str:
        self.counter += 1
        return f"t{self.counter}"

    def emit(self, ctype: str, expr: str) -> str:
        """``const ctype tN = expr;`` in the right block (or an existing equal one)."""
        for block in reversed(self.stack):
            if expr in block.cse:
                return block.cse[expr]
        name = self._new_var()
        self._place(name, [f"const {ctype} {name} = {expr};"], expr).cse[expr] = name
        return name

    def _place(self, name: str, lines: list[str], reads: str) -> _Block:
        """Append the lines defining ``name`` (whose text ``reads``) where they belong: in the
        current block when they depend on ``j`` or sit in a Piecewise branch, else once per
        row. Returns the block whose caches may then hold ``name``."""
        if set(_TOKEN.findall(reads)) & self.depends_on_j:
            self.depends_on_j.add(name)
        if name in self.depends_on_j or self.branches:
            self.stack[-1].lines.extend(lines)
            return self.stack[-1]
        self.row_lines.extend(lines)
        return self.row_block

    def value(self, node) -> str:
        """C++ variable (or literal) holding ``node`` at the current loop position."""
        if isinstance(node, Load):
            return self.emit(C_TYPES[node.dtype], f"{self.arg_names[id(node.buffer)]}[{node.index.render()}]")
        if isinstance(node, Const):
            return literal(node.value, C_TYPES[node.dtype])
        if isinstance(node, Cast):
            want = C_TYPES[node.dtype]
            return self.emit(want, f"static_cast<{want}>({self.value(node.source)})")
        if isinstance(node, Op):
            names = [self.value(arg) for arg in node.args]
            ctype = C_TYPES[node.dtype]
            if exp_of_nonpositive(node, self.kernel.inner_size):
                text = NONPOSITIVE_EXP.format(*names)
            else:
                text = formula(node.name, node.params, node.dtype, C_TYPES[node.args[-1].dtype]).format(*names)
            return self.emit(ctype, f"static_cast<{ctype}>({text})" if node.convert else text)
        if isinstance(node, Piecewise):
            return self.piecewise(node)
        return self.reduction(node)

    def piecewise(self, node: Piecewise) -> str:
        """Variable holding ``node``, set by an if/else chain over its pieces.

        Only the selected piece runs: a piece reads its input at ``index - offset``, out
        of bounds where another piece is selected, so nothing inside a piece is hoisted
        out of its branch. A chain that does not depend on ``j`` runs once per row (and
        inside ``j``'s loop GCC unswitches a row-invariant condition at -O3).
        """
        for block in reversed(self.stack):
            if node in block.pieces:
                return block.pieces[node]
        name = self._new_var()
        lines = [f"{C_TYPES[node.dtype]} {name};"]
        saved = self.stack
        self.branches += 1
        last = len(node.pieces) - 1
        for k, (bound, piece) in enumerate(zip(node.bounds, node.pieces)):
            branch = _Block()
            self.stack = saved + [branch]
            value = self.value(piece)
            condition = f"if ({piece_condition(node.index, bound)}) {{"
            self._note_j_split(node.index, bound)
            if k == 0:
                lines.append(condition)
            else:
                lines.append(f"}} else {condition}" if k < last else "} else {")
            lines += ["  " + line for line in branch.lines] + [f"  {name} = {value};"]
        lines.append("}")
        self.branches -= 1
        self.stack = saved
        self._place(name, lines, "\n".join(lines)).pieces[node] = name
        return name

    def _note_j_split(self, index: Index, bound: int) -> None:
        """Record where ``index < bound`` flips when the index is ``c * j + const`` alone and
        the piece is written in the write loop (a reduction's ``j`` runs over its own range)."""
        if self.write_block is None or self.write_block not in self.stack:
            return
        if index.terms and all(name == "j" for name, _, _ in index.terms):
            coef, extent = index.coefficient("j"), index.terms[0][2]
            split = -(-(bound - index.const) // coef)  # the first j with c * j + const >= bound
            if extent == self.kernel.inner_size and 0 < split < extent:
                self.j_splits.add(split)

    def reduction(self, red: Reduce) -> str:
        """Variable holding ``red`` for this row; computes it first if needed."""
        if red in self.reductions:
            return self.reductions[red]
        partner = self.online.get(red) or next((m for m, s in self.online.items() if s == red), None)
        if partner is not None:
            maximum, total = (red, partner) if red.kind == "max" else (partner, red)
            self._online_pair(maximum, total)
            return self.reductions[red]
        number = self.reduction_count
        self.reduction_count += 1  # before recursing: a nested reduction needs its own name
        saved, block = self.stack, _Block()
        self.stack = [self.row_block, block]
        value = self.value(red.source)
        self.stack = saved
        self.row_lines.extend(self._reduction_loop(red, number, block.lines, value))
        result = f"red{number}"
        self.reductions[red] = result
        return result

    def _online_pair(self, maximum: Reduce, total: Reduce) -> None:
        """``maximum`` and ``total = sum(exp(A - maximum))`` in one sweep over the row.

        Chunks of ``ONLINE_CHUNK`` elements: the chunk's max (vectorised), then the running
        sum is rescaled by ``exp(old - new)`` when the max grows and the chunk's
        ``exp(A - max)`` are added (the chunk is still in L1), so the row is read from
        memory once for both. While every element so far is -inf the sum stays 0 (each
        contributes ``exp(-inf - final max) = 0``); a NaN anywhere makes both NaN, as the
        three-pass form gives.
        """
        number = self.reduction_count
        self.reduction_count += 2
        ctype = C_TYPES[maximum.dtype]
        acc_type, _ = _accumulator("sum", total.dtype)
        running = f"om{number}"
        saved, block_max = self.stack, _Block()
        self.stack = [self.row_block, block_max]
        value_max = self.value(maximum.source)
        block_sum = _Block()
        self.stack = [self.row_block, block_sum]
        self.reductions[maximum] = running
        self.depends_on_j.add(running)
        value_sum = self.value(total.source)
        self.stack = saved
        inf = f"ap::limits<{ctype}>::infinity()"
        size, chunk = total.size, min(total.size, ONLINE_CHUNK)
        lines = [f"{ctype} {running} = -{inf};", f"{acc_type} os{number} = 0;", f"int onan{number} = 0;",
                 f"for (int64_t jc = 0; jc < {size}; jc += {chunk}) {{"]
        lines += chunk_max_lines(ctype, acc_type, chunk, size, block_max.lines, value_max,
                                 running, f"os{number}", f"onan{number}")
        lines += [f"  if ({running} == -{inf}) continue;  // all -inf so far: each adds exp(-inf) = 0",
                  f"  {acc_type} cs = 0;",
                  f"  #pragma omp simd reduction(+:cs){SIMDLEN_MARK}",
                  "  for (int64_t j = jc; j < jc_end; ++j) {"]
        lines += ["    " + line for line in block_sum.lines]
        lines += [f"    cs = cs + static_cast<{acc_type}>({value_sum});", "  }", f"  os{number} += cs;", "}"]
        nan = f"ap::limits<{ctype}>::quiet_NaN()"
        lines += [f"const {ctype} red{number} = onan{number} ? {nan} : {running};",
                  f"const {ctype} red{number + 1} = onan{number} ? {nan} : static_cast<{ctype}>(os{number});"]
        self.row_lines.extend(lines)
        # readers after the sweep see the final values (the running names stay inside it)
        self.reductions[maximum] = f"red{number}"
        self.reductions[total] = f"red{number + 1}"

    def _reduction_loop(self, red: Reduce, number: int, body: list[str], value: str) -> list[str]:
        ctype = C_TYPES[red.dtype]
        acc_type, init = _accumulator(red.kind, red.dtype)
        acc, nan = f"acc{number}", f"nan{number}"
        clauses = f"reduction({REDUCTION_CLAUSE[red.kind]}:{acc})"
        # max/min propagate NaN as torch does; OpenMP's max/min combiners would drop it
        tracks_nan = red.kind in ("max", "min") and red.dtype.is_floating_point
        lines = [f"{acc_type} {acc} = {init};"]
        if tracks_nan:
            lines.append(f"int {nan} = 0;")
            clauses += f" reduction(|:{nan})"
        lines += [f"#pragma omp simd {clauses}{SIMDLEN_MARK}",
                  f"for (int64_t j = 0; j < {red.size}; ++j) {{"]
        lines += ["  " + line for line in body]
        cast = f"static_cast<{acc_type}>({value})"
        lines.append("  " + REDUCTION_COMBINE[red.kind].format(acc=acc, v=cast))
        if tracks_nan:
            lines.append(f"  {nan} |= ({value} != {value});")
        lines.append("}")
        if lane_sum.applies(red.kind, red.dtype, red.source.dtype, red.size):  # float lanes, double chunks
            lines = lane_sum.lane_sum_lines(acc, red.size, body, value, SIMDLEN_MARK)
        result = f"static_cast<{ctype}>({acc})"
        if red.scale != 1.0:
            scale = repr(red.scale) if math.isfinite(red.scale) else literal(red.scale, "double")
            result = f"static_cast<{ctype}>({acc} * {scale})"
        if tracks_nan:
            result = f"{nan} ? ap::limits<{ctype}>::quiet_NaN() : {result}"
        lines.append(f"const {ctype} red{number} = {result};")
        return lines


@dataclass(frozen=True)
class KernelBody:
    """Generated pieces of one kernel for the template (tiling-independent)."""

    args: list  # (c_name, ctype, is_output)
    row_lines: list[str]  # per row, before the write loop: reductions, hoisted values
    write_lines: list[str]
    write_is_row: bool
    has_reduction: bool
    j_splits: tuple = ()  # sorted j where a piece chosen by j alone changes
    # per thread, before its first row and after its last (state carried from row to row,
    # e.g. the streamed softmax's deferred store); empty: the plain parallel row loop
    thread_lines: tuple = ()
    thread_end_lines: tuple = ()


#: The write loop is cut at most this many times (one copy of its body per segment).
MAX_J_SPLITS = 3


def j_segments(splits: tuple, cols: int) -> list[tuple[int, int]]:
    """``[0, cols)`` cut at ``splits`` (a ``cat`` along the inner dimension: in each segment
    every piece is fixed, so GCC folds its compares and reads only that piece), or whole
    past ``MAX_J_SPLITS`` cuts."""
    splits = tuple(sorted({s for s in splits if 0 < s < cols}))
    if not splits or len(splits) > MAX_J_SPLITS:
        return [(0, cols)]
    bounds = [0, *splits, cols]
    return list(zip(bounds, bounds[1:]))


@functools.lru_cache(maxsize=256)
def build_body(kernel: FusedKernel, online: bool = False) -> KernelBody:
    """Emit the loads, math and stores of ``kernel`` (the same for every tiling but the
    ``online`` softmax choice)."""
    ctx = KernelWriter(kernel, online)
    write = _Block()
    ctx.stack = [ctx.row_block, write]
    ctx.write_block = write
    write_is_row = True
    stores = []
    for k, (out, expr) in enumerate(zip(kernel.outputs, kernel.exprs)):
        var = ctx.value(expr)
        if k in kernel.row_outputs:  # written once per row (a reduction result)
            stores.append(f"out{k}[r] = {var};")
            write_is_row = False
        else:
            stores.append(f"out{k}[r * {kernel.inner_size} + j] = static_cast<{C_TYPES[out.dtype]}>({var});")
    args = [(f"in{k}", C_TYPES[buf.dtype], False) for k, buf in enumerate(kernel.inputs)]
    args += [(f"out{k}", C_TYPES[buf.dtype], True) for k, buf in enumerate(kernel.outputs)]
    return KernelBody(args, ctx.row_lines, write.lines + stores, write_is_row, bool(ctx.reductions),
                      tuple(sorted(ctx.j_splits)))


def render_kernel(kernel: FusedKernel, tiling) -> str:
    """C++ source of ``kernel`` compiled with ``tiling`` (a CPU ``Tiling``).

    A tiling with ``col_block`` or ``split`` renders the loop nest of ``reduce_loops``
    (column or split reduction) in place of the row loop.
    """
    from aotpack.backends.cpu import reduce_loops  # builds on this module's writer

    loop_lines = []
    if getattr(tiling, "col_block", 0):
        loop_lines = reduce_loops.column_loops(kernel, tiling)
    elif getattr(tiling, "split", 0):
        loop_lines = reduce_loops.split_loops(kernel, tiling)
    online = getattr(tiling, "online", 0)
    if online == 2:
        from aotpack.backends.cpu import softmax_store  # builds on this module's writer

        body = softmax_store.build_body(kernel, bool(getattr(tiling, "stream", 0)))
    else:
        body = build_body(kernel, bool(online))
    clause = f" simdlen({tiling.simdlen})" if tiling.simdlen else ""
    row_lines = [line.replace(SIMDLEN_MARK, clause) for line in body.row_lines]
    rows = math.prod(kernel.outer_shape)
    splits_rows = body.write_is_row and not body.has_reduction  # a reduction needs whole rows
    tile = min(tiling.inner_tile, kernel.inner_size) if splits_rows else kernel.inner_size
    tiles = -(-kernel.inner_size // tile)
    row_block = min(tiling.row_block, rows) if splits_rows and tiling.row_block > 1 else 0
    row_blocks = -(-rows // row_block) if row_block else rows
    outer = [(f"i{k}", stride, size)
             for k, (stride, size) in enumerate(zip(contiguous_strides(kernel.outer_shape), kernel.outer_shape))
             if size > 1]
    return render(
        "cpu_kernel.cpp.j2",
        body=body, row_lines=row_lines, rows=rows, cols=kernel.inner_size, tile=tile, tiles=tiles,
        segments=j_segments(body.j_splits, kernel.inner_size),
        items=row_blocks * tiles, row_block=row_block, outer=outer, block_dim=tiling.block_dim,
        chunk=tiling.chunk, simdlen=tiling.simdlen, tiling_repr=tiling.tiling_repr, workspace=tiling.workspace,
        optional_helpers=optional_helpers(
            [*body.thread_lines, *body.row_lines, *body.write_lines, *body.thread_end_lines]),
        loop_lines=loop_lines,
    )
