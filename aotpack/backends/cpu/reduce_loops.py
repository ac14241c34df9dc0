"""Loop orders for kernels whose every output is a plain reduction (``kernel_ir.flat_reductions``).

The row form (``renderer``) walks ``j`` innermost for one row at a time. Two shapes of
reduction are memory-bound in that form and get a loop nest of their own here:

* **column** (``Tiling.col_block``): ``x.sum(0)`` of a row-major ``[R, C]`` reads
  ``x[j * C + i0]``, stride ``C`` along ``j``. Instead, each work item owns a block of
  ``col_block`` output elements (the last row variable) and streams ``j``: every step
  reads ``col_block`` contiguous elements into a vector of partial results, so memory is
  read in rows, once.
* **split** (``Tiling.split``): ``x.sum()`` of ``[1, 16M]`` has one row, so one thread. The
  row is cut into ``split`` segments, one work item each; every item leaves its partial
  result (and NaN flag) in the kernel's workspace, and one thread combines them per row
  after the parallel loop. Workspace: ``split_workspace_bytes``.

Both return the C++ lines that replace the template's row loop (``render_kernel``).
Accumulators are those of the row form (``kernel_writer.accumulator``: double for float sums;
a split float32 sum adds each segment in float lanes as the row form does, ``lane_sum``;
a column float32 sum adds ``COLUMN_CHUNK`` rows in float before its double accumulators),
so results agree with it to rounding.
"""
from __future__ import annotations

import math

from aotpack.backends.cpu import lane_sum
from aotpack.backends.cpu.formulas import C_TYPES
from aotpack.backends.cpu.kernel_writer import REDUCTION_CLAUSE, REDUCTION_COMBINE, KernelWriter, accumulator, Block
from aotpack.ir.index import contiguous_strides
from aotpack.ir.kernel import FusedKernel, Reduce

#: Bytes of one partial result slot in a split reduction's workspace (accumulator, then NaN flag).
SLOT_BYTES = 16


def split_workspace_bytes(kernel: FusedKernel, split: int) -> int:
    """Workspace of a split reduction: one 16-byte slot per (output, row, segment), rounded up
    to the 64-byte workspace alignment."""
    slots = len(kernel.exprs) * math.prod(kernel.outer_shape) * split
    return -(-slots * SLOT_BYTES // 64) * 64


def _source(kernel: FusedKernel, red: Reduce, row_dependent: set) -> tuple[list, list, str]:
    """(lines outside the ``j`` loop, lines inside it, C++ value) of ``red``'s source.

    ``row_dependent`` are names that must stay inside the loop (column form: the row
    variables, which vary across the vector of outputs)."""
    writer = KernelWriter(kernel)
    writer.depends_on_j |= row_dependent
    block = Block()
    writer.stack = [writer.row_block, block]
    value = writer.value(red.source)
    return writer.row_lines, block.lines, value


def _combine(red: Reduce, acc: str, value: str, nan: str | None) -> list[str]:
    acc_type, _ = accumulator(red.kind, red.dtype)
    lines = [REDUCTION_COMBINE[red.kind].format(acc=acc, v=f"static_cast<{acc_type}>({value})")]
    if nan:
        lines.append(f"{nan} |= ({value} != {value});")
    return lines


def _result(red: Reduce, acc: str, nan: str | None) -> str:
    ctype = C_TYPES[red.dtype]
    result = f"static_cast<{ctype}>({acc} * {red.scale!r})" if red.scale != 1.0 else f"static_cast<{ctype}>({acc})"
    if nan:
        result = f"({nan} ? ap::limits<{ctype}>::quiet_NaN() : {result})"
    return result


def _tracks_nan(red: Reduce) -> bool:
    # max/min propagate NaN as torch does; a comparison-based combine would drop it
    return red.kind in ("max", "min") and red.dtype.is_floating_point


def _parallel_for(block_dim: int, items: int, schedule: str = "static") -> list[str]:
    if block_dim <= 1 or items <= 1:
        return ["(void)num_threads;"]
    return [f"const int nthreads = num_threads > 0 && num_threads < {block_dim} ? num_threads : {block_dim};",
            f"#pragma omp parallel for num_threads(nthreads) schedule({schedule})"]


def column_loops(kernel: FusedKernel, tiling) -> list[str]:
    """The column form: work items = (leading rows, block of ``col_block`` last-dim rows)."""
    outer = tuple(kernel.outer_shape)
    last = len(outer) - 1
    width_total, block = outer[-1], min(tiling.col_block, outer[-1])
    prefix = outer[:-1]
    prefix_rows = math.prod(prefix)
    blocks = -(-width_total // block)
    items = prefix_rows * blocks
    row_names = {f"i{k}" for k in range(len(outer))}
    lines = _parallel_for(tiling.block_dim, items)
    lines.append(f"for (int64_t item = 0; item < {items}; ++item) {{")
    body = [f"const int64_t p = item / {blocks};",
            f"const int64_t c0 = (item % {blocks}) * {block};",
            f"const int64_t width = ap::min_index({block}, {width_total} - c0);"]
    for k, (stride, size) in enumerate(zip(contiguous_strides(prefix), prefix)):
        if size > 1:  # as in the row form, loads never name a size-1 row variable
            body.append(f"const int64_t i{k} = (p / {stride}) % {size};")
    for k, red in enumerate(kernel.exprs):
        acc_type, init = accumulator(red.kind, red.dtype)
        hoisted, inner, value = _source(kernel, red, row_names)
        acc, nan = f"acc{k}", (f"nan{k}" if _tracks_nan(red) else None)
        body += hoisted
        body.append(f"{acc_type} {acc}[{block}];")
        if nan:
            body.append(f"int {nan}[{block}];")
        body += [f"for (int64_t c = 0; c < width; ++c) {{",
                 f"  {acc}[c] = {init};" + (f" {nan}[c] = 0;" if nan else ""), "}"]
        simd = "#pragma omp simd" + (f" simdlen({tiling.simdlen})" if tiling.simdlen else "")
        if lane_sum.applies(red.kind, red.dtype, red.source.dtype, red.size):
            body += _column_chunks(acc, block, red.size, last, inner, value, simd)
        else:
            body += [f"for (int64_t j = 0; j < {red.size}; ++j) {{", "  " + simd,
                     "  for (int64_t c = 0; c < width; ++c) {",
                     f"    const int64_t i{last} = c0 + c;"]
            body += ["    " + line for line in inner]
            body += ["    " + line for line in _combine(red, f"{acc}[c]", value, f"{nan}[c]" if nan else None)]
            body += ["  }", "}"]
        body += ["for (int64_t c = 0; c < width; ++c) {",
                 f"  out{k}[p * {width_total} + c0 + c] = {_result(red, f'{acc}[c]', f'{nan}[c]' if nan else None)};",
                 "}"]
    lines += ["  " + line for line in body] + ["}"]
    return lines


#: Rows a float32 column sum adds in float before adding into its double accumulators.
COLUMN_CHUNK = 32
#: Rows a float32 column sum reads per pass over its partials, added pairwise (even; a chunk's
#: rows beyond a multiple of it take a one-row tail loop).
COLUMN_ROWS_PER_PASS = 4


def _column_chunks(acc: str, block: int, size: int, last: int, inner: list, value: str, simd: str) -> list[str]:
    """A float32 column sum's row loop: ``COLUMN_CHUNK`` rows at a time into float
    partials, each chunk then added into the double ``acc[c]``.

    A double accumulator per element costs a conversion and twice the L1 traffic of a
    float one (4096x4096 column sum at 2 threads: 2890-3680 us against 2610-3110 us).
    Each pass over the partials adds ``COLUMN_ROWS_PER_PASS`` rows, pairwise, so the
    partials are loaded and stored once per pass: one row per pass read 10.9 GB/s on one
    Zen 4 core, four rows 19.1 GB/s (the core's plain read: 21.0). Each element passes
    through at most ``COLUMN_CHUNK - 1`` float adds (with four-row passes, 2 + 7 + 1), so
    a chunk errs by at most ``31 * 2^-24`` (~2e-6) of its sum of magnitudes (Higham,
    section 4.2); chunks add in double, so 16M rows do not drift.
    """
    rows = COLUMN_ROWS_PER_PASS
    lines = [f"float part_{acc}[{block}];",
             f"for (int64_t jc = 0; jc < {size}; jc += {COLUMN_CHUNK}) {{",
             f"  const int64_t j_end = ap::min_index(jc + {COLUMN_CHUNK}, {size});",
             f"  for (int64_t c = 0; c < width; ++c) part_{acc}[c] = 0.0f;",
             "  int64_t jr = jc;",
             f"  for (; jr + {rows} <= j_end; jr += {rows}) {{",
             "    " + simd,
             "    for (int64_t c = 0; c < width; ++c) {",
             f"      const int64_t i{last} = c0 + c;"]
    for u in range(rows):  # each row's loads in a scope of its own `j`
        lines.append(f"      float row{u};")
        lines.append(f"      {{ const int64_t j = jr + {u};")
        lines += ["        " + line for line in inner]
        lines.append(f"        row{u} = {value}; }}")
    pairs = " + ".join(f"(row{u} + row{u + 1})" for u in range(0, rows, 2))
    lines += [f"      part_{acc}[c] = part_{acc}[c] + ({pairs});", "    }", "  }",
              "  for (; jr < j_end; ++jr) {",
              "    const int64_t j = jr;",
              "    " + simd,
              "    for (int64_t c = 0; c < width; ++c) {",
              f"      const int64_t i{last} = c0 + c;"]
    lines += ["      " + line for line in inner]
    lines += [f"      part_{acc}[c] = part_{acc}[c] + {value};", "    }", "  }",
              "  " + simd,
              f"  for (int64_t c = 0; c < width; ++c) {acc}[c] += static_cast<double>(part_{acc}[c]);",
              "}"]
    return lines


def split_loops(kernel: FusedKernel, tiling) -> list[str]:
    """The split form: work items = (row, segment of the row); partials in the workspace."""
    outer = tuple(kernel.outer_shape)
    rows, size, split = math.prod(outer), kernel.inner_size, tiling.split
    segment = -(-(-(-size // split)) // 16) * 16  # a multiple of 16 elements: whole vectors
    items = rows * split
    lines = ["char* const workspace = static_cast<char*>(launch->workspace);"]
    lines += _parallel_for(tiling.block_dim, items)
    body = [f"const int64_t r = item / {split};",
            f"const int64_t j_begin = ap::min_index((item % {split}) * {segment}, {size});",
            f"const int64_t j_end = ap::min_index(j_begin + {segment}, {size});"]
    for k, (stride, dim) in enumerate(zip(contiguous_strides(outer), outer)):
        if dim > 1:
            body.append(f"const int64_t i{k} = (r / {stride}) % {dim};")
    combine = []
    for k, red in enumerate(kernel.exprs):
        acc_type, init = accumulator(red.kind, red.dtype)
        hoisted, inner, value = _source(kernel, red, set())
        acc, nan = f"acc{k}", (f"nan{k}" if _tracks_nan(red) else None)
        slot = f"workspace + ({k * items} + item) * {SLOT_BYTES}"
        clauses = f"reduction({REDUCTION_CLAUSE[red.kind]}:{acc})" + (f" reduction(|:{nan})" if nan else "")
        clauses += f" simdlen({tiling.simdlen})" if tiling.simdlen else ""
        body += hoisted
        if lane_sum.applies(red.kind, red.dtype, red.source.dtype, size):  # float lanes, double chunks
            simdlen = f" simdlen({tiling.simdlen})" if tiling.simdlen else ""
            body += lane_sum.lane_sum_lines(acc, size, inner, value, simdlen, span=("j_begin", "j_end"))
        else:
            body += [f"{acc_type} {acc} = {init};"] + ([f"int {nan} = 0;"] if nan else [])
            body += [f"#pragma omp simd {clauses}", "for (int64_t j = j_begin; j < j_end; ++j) {"]
            body += ["  " + line for line in inner]
            body += ["  " + line for line in _combine(red, acc, value, nan)]
            body += ["}"]
        body += [f"*reinterpret_cast<{acc_type}*>({slot}) = {acc};",
                 f"*reinterpret_cast<int*>({slot} + 8) = {nan if nan else 0};"]
        # after the parallel loop: one thread folds the row's segments in order
        part, part_nan = f"part{k}", f"part_nan{k}"
        combine += [f"for (int64_t r = 0; r < {rows}; ++r) {{",
                    f"  {acc_type} {acc} = {init};", f"  int {part_nan} = 0;",
                    f"  for (int64_t s = 0; s < {split}; ++s) {{",
                    f"    const char* slot = workspace + ({k * items} + r * {split} + s) * {SLOT_BYTES};",
                    f"    const {acc_type} {part} = *reinterpret_cast<const {acc_type}*>(slot);",
                    f"    {part_nan} |= *reinterpret_cast<const int*>(slot + 8);",
                    "    " + REDUCTION_COMBINE[red.kind].format(acc=acc, v=part), "  }",
                    f"  out{k}[r] = {_result(red, acc, part_nan if nan else None)};", "}"]
    lines.append(f"for (int64_t item = 0; item < {items}; ++item) {{")
    lines += ["  " + line for line in body] + ["}"]
    return lines + combine
