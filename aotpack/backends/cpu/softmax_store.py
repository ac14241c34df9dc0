"""The stored-exp softmax form (``Tiling.online == 2``, ``kernel_ir.softmax_output``).

For a kernel writing ``exp(A - M) / S`` with ``M = max(A)``, ``S = sum(exp(A - M))``, one
chunked sweep per row computes the running max ``m`` and the rescaled sum (as
``KernelWriter._online_pair``) and also stores ``exp(A - m_c)`` into the output, ``m_c``
being the running max when chunk ``c`` was read; a second pass over the output multiplies
chunk ``c`` by ``exp(m_c - M) / S``. The input is read once and ``exp`` runs once per
element (the three-sweep form reads the row three times and runs ``exp`` twice).

The exp loop runs in blocks of ``PREFETCH_BLOCK`` elements, each prefetching the next
chunk's lines of the input and the output (``_prefetch_lines``; the streamed variant below
writes no output there and prefetches the input only), and its ``exp`` is
``ap::exp_nonpositive`` (the argument is ``a - running max <= 0``).

The streamed variant (``Tiling.stream``, ``streams``) keeps a row's ``exp`` values in a
buffer on the thread's stack and writes the scaled row with non-temporal stores
(``ap_store_scaled_streaming``): a plain store first reads the output line into the cache,
so a softmax too big for the caches moves 3 bytes per output byte where this moves 2
(docs/measurements.md, "Non-temporal stores").

Rows of more than ``ONLINE_CHUNK`` elements defer each row's scaled store into the next
row's exp loop (``KernelBody.thread_lines``: a thread keeps two row buffers and the pending
row's factors; its last row is stored after its loop, then one fence). Stored in a pass of
its own, the row's writes waited while ``exp`` ran and the reads waited while the row was
written; interleaved, the compute-bound exp loop also carries the previous row's writes and
(``STREAM_PREFETCH_LOCALITY``) the next row's reads (docs/measurements.md, "Deferred row
stores"). The pending blocks go in mirrored order (``_mirrored_block_lines``).
It is offered only for outputs of at least ``STREAM_MIN_BYTES`` (a smaller output would be
in the cache for the kernel that reads it next); PGO picks between the two.

Special values give eager's results: a chunk read while every element so far is -inf
stores 0 with ``m_c = -inf`` (factor 0 when ``M`` is finite, NaN when the whole row is
-inf); a NaN or +inf makes ``S`` NaN and so every output NaN.
"""
from __future__ import annotations

import re

import torch

from aotpack.backends.cpu.formulas import C_TYPES
from aotpack.backends.cpu.kernel_writer import (
    ONLINE_CHUNK, SIMDLEN_MARK, KernelBody, KernelWriter, accumulator, Block, chunk_max_lines,
)
from aotpack.ir.kernel import FusedKernel, Load, Piecewise, softmax_output, walk

#: Most chunks per row (their running maxes live on the stack: 16 KiB of float32).
MAX_CHUNKS = 4096
#: Elements per block of the exp loop: the next chunk's cache lines are prefetched once a block.
PREFETCH_BLOCK = 64
#: Bytes of a cache line (x86-64, AArch64).
LINE_BYTES = 64
#: Longest row the streamed variant buffers on the stack (32 KiB of float32 per thread).
STREAM_MAX_ROW = 8192
#: Smallest output the streamed variant is offered for: above the L2 of a core and a
#: fair share of a server's L3, so the next kernel would read it from memory anyway.
STREAM_MIN_BYTES = 16 << 20
#: Elements per chunk of the streamed variant (a 4096-wide row is one chunk, and the exp
#: loop prefetches the next row): 4096 x 4096 at 1 thread 9.6-9.9 against 10.3-10.5 ms
#: in chunks of ``ONLINE_CHUNK`` (a chunk of x and of the row buffer fill Zen 4's 32 KiB L1).
STREAM_CHUNK = 4096
#: The streamed variant's row buffer.
ROW_BUFFER = "row_exp"
#: ``__builtin_prefetch`` locality of the streamed variant's next-row input lines: 2
#: (``prefetcht1``, toward L2) leaves L1 to the two row buffers.
STREAM_PREFETCH_LOCALITY = 2


def applies(kernel: FusedKernel) -> bool:
    """Whether ``kernel`` is a softmax this form renders."""
    found = softmax_output(kernel)
    return found is not None and -(-found[1].size // ONLINE_CHUNK) <= MAX_CHUNKS


def streams(kernel: FusedKernel) -> bool:
    """Whether the streamed variant applies: a float32 softmax of rows of at most
    ``STREAM_MAX_ROW`` elements writing at least ``STREAM_MIN_BYTES``."""
    if not applies(kernel) or kernel.outputs[0].dtype != torch.float32:
        return False
    size = softmax_output(kernel)[1].size
    return size <= STREAM_MAX_ROW and kernel.rows * size * 4 >= STREAM_MIN_BYTES


def build_body(kernel: FusedKernel, stream: bool = False) -> KernelBody:
    """The per-row lines of the stored form (no separate write loop); ``stream``: the
    streamed variant (``streams(kernel)`` must hold)."""
    maximum, total = softmax_output(kernel)
    ctx = KernelWriter(kernel)
    ctype, out_type = C_TYPES[maximum.dtype], C_TYPES[kernel.outputs[0].dtype]
    acc_type, _ = accumulator("sum", total.dtype)
    size = total.size
    chunk = min(size, STREAM_CHUNK if stream else ONLINE_CHUNK)
    chunks = -(-size // chunk)
    block_max = Block()
    ctx.stack = [ctx.row_block, block_max]
    value_max = ctx.value(maximum.source)
    block_exp = Block()
    ctx.stack = [ctx.row_block, block_exp]
    ctx.reductions[maximum] = "om"
    ctx.depends_on_j.add("om")
    value_exp = ctx.value(total.source)
    chunk_type = "float" if maximum.dtype == torch.float32 else acc_type
    inf = f"ap::limits<{ctype}>::infinity()"
    nan = f"ap::limits<{ctype}>::quiet_NaN()"
    out = f"{ROW_BUFFER}[j]" if stream else f"out0[r * {size} + j]"
    args = [(f"in{k}", C_TYPES[buf.dtype], False) for k, buf in enumerate(kernel.inputs)]
    args += [(f"out{k}", C_TYPES[buf.dtype], True) for k, buf in enumerate(kernel.outputs)]
    if size <= ONLINE_CHUNK:
        head = [f"alignas(64) float {ROW_BUFFER}[{size}];"] if stream else []
        lines = _one_chunk_lines(size, block_max.lines, value_max, block_exp.lines, value_exp,
                                 ctype, out_type, chunk_type, inf, nan, out, stream)
        return KernelBody(args, ctx.row_lines + head + lines, [], False, True)
    head = ([f"float* const {ROW_BUFFER} = {ROW_BUFFER}_pair[parity];", "parity ^= 1;"] if stream else [])
    lines = [f"{ctype} om = -{inf};", f"{acc_type} os = 0;", "int onan = 0;", f"{ctype} chunk_max[{chunks}];",
             f"for (int64_t c = 0; c < {chunks}; ++c) {{",
             f"  const int64_t jc = c * {chunk};"]
    lines += chunk_max_lines(ctype, acc_type, chunk, size, block_max.lines, value_max, "om", "os", "onan")
    lines += ["  chunk_max[c] = om;",
              f"  if (om == -{inf}) {{  // all -inf so far: 0 now, scaled to eager's 0 or NaN below",
              f"    #pragma omp simd{SIMDLEN_MARK}",
              f"    for (int64_t j = jc; j < jc_end; ++j) {out} = 0;"]
    lines += ["    " + line for line in (_pending_store_lines("jc", "jc_end - jc") if stream else [])]
    lines += ["    continue;", "  }",
              # a chunk's sum in float (vector lanes, <= ONLINE_CHUNK / lanes adds each: error
              # ~1e-7 relative, as ATen's cascade), the chunks' sums in the double accumulator
              f"  {chunk_type} cs = 0;"]
    body = [line for line in block_exp.lines]
    body += [f"{out} = static_cast<{out_type}>({value_exp});"]
    lines += _exp_loop(kernel, total, size, chunk, body, value_exp, chunk_type, stream)
    lines += [f"  os += static_cast<{acc_type}>(cs);", "}",
              f"const {acc_type} total = onan ? {nan} : static_cast<{acc_type}>(static_cast<{ctype}>(os));",
              f"const {acc_type} final_max = onan ? {nan} : static_cast<{acc_type}>(om);",
              f"for (int64_t c = 0; c < {chunks}; ++c) {{"]
    factor = (f"static_cast<{out_type}>(ap::exp(static_cast<{acc_type}>(chunk_max[c]) - final_max) / total);")
    if stream:  # stored while the next row's exp runs (or by the thread's last lines)
        lines += [f"  pending_factor[c] = {factor}", "}",
                  f"pending_out = out0 + r * {size};", f"pending_exp = {ROW_BUFFER};"]
        return KernelBody(args, ctx.row_lines + head + lines, [], False, True,
                          thread_lines=_thread_lines(size, chunks, out_type),
                          thread_end_lines=_thread_end_lines(size, chunk, chunks))
    lines += [f"  const int64_t jc = c * {chunk};",
              f"  const int64_t jc_end = ap::min_index(jc + {chunk}, {size});",
              f"  const {out_type} factor = {factor}"]
    lines += ["  " + line for line in _scale_lines(size, "jc", "jc_end", out, stream)] + ["}"]
    return KernelBody(args, ctx.row_lines + lines, [], False, True)


def _thread_lines(size: int, chunks: int, out_type: str) -> tuple[str, ...]:
    """A thread's state for the streamed chunked form: two row buffers (this row's
    ``exp`` values and the previous row's, whose scaled store is pending) and the pending
    row's output, buffer and per-chunk factors."""
    return (f"alignas(64) float {ROW_BUFFER}_pair[2][{size}];", "int64_t parity = 0;",
            f"{out_type}* pending_out = nullptr;  // the previous row's output, stored during this row",
            "const float* pending_exp = nullptr;", f"{out_type} pending_factor[{chunks}];")


def _thread_end_lines(size: int, chunk: int, chunks: int) -> tuple[str, ...]:
    """Store the thread's last pending row, then order its streaming stores before the
    kernel returns."""
    lines = [f"for (int64_t c = 0; c < {chunks}; ++c) {{",
             f"  const int64_t jc = c * {chunk};",
             f"  const int64_t jc_end = ap::min_index(jc + {chunk}, {size});"]
    lines += ["  " + line for line in _pending_store_lines("jc", "jc_end - jc")] + ["}"]
    return tuple(lines + ["ap_stream_fence();"])


def _mirrored_block_lines(exact: bool) -> list[str]:
    """Inside block ``jb`` of the exp loop: store the pending row's mirror block (the
    chunk's blocks last to first) while this row's blocks go first to last.

    A load whose address matches an earlier store's in bits 0-11 waits for that store
    (4 KiB aliasing). Storing the same block of the previous row as the one just read
    put the stores on the next block's loads whenever the output started less than a
    block past the input modulo 4 KiB (the runtime's buffer pool puts an output 64 bytes
    past a torch-allocated input): 4096 x 4096, kernel alone at 1 thread, 8.9 ms with the
    output 64 bytes past, 8.3 ms at 256, 6.7 ms at 0 and at 4 KiB. Mirrored, the distance
    changes by 512 bytes a block, so about one block in eight is near a load, at any
    offset (5.8-7.3 ms over offsets of 0, 64, 128, 256 bytes and 4 KiB)."""
    if exact:
        return [f"const int64_t pb = jc_end - {PREFETCH_BLOCK} - (jb - jc);"] + _pending_store_lines(
            "pb", str(PREFETCH_BLOCK))
    return ([f"const int64_t pb = jc + (jc_end - 1 - jc) / {PREFETCH_BLOCK} * {PREFETCH_BLOCK} - (jb - jc);"]
            + _pending_store_lines("pb", f"ap::min_index(pb + {PREFETCH_BLOCK}, jc_end) - pb"))


def _pending_store_lines(begin: str, count: str) -> list[str]:
    """``count`` elements from ``begin`` of chunk ``c`` of the pending row (if any): its
    ``exp`` values times the chunk's factor, written with non-temporal stores."""
    return [f"if (pending_out != nullptr) ap_store_scaled_streaming(pending_out + {begin}, pending_exp + {begin}, "
            f"pending_factor[c], {count});"]


def _scale_lines(size: int, begin: str, end: str, out: str, stream: bool) -> list[str]:
    """``out = out * factor`` over ``[begin, end)`` of row ``r``; streamed: the row buffer's
    values scaled into the output with non-temporal stores (the row ends with
    ``ap_stream_fence()``)."""
    if stream:
        return [f"ap_store_scaled_streaming(out0 + r * {size} + {begin}, {ROW_BUFFER} + {begin}, factor, "
                f"{end} - {begin});"]
    return [f"#pragma omp simd{SIMDLEN_MARK}", f"for (int64_t j = {begin}; j < {end}; ++j) {out} = {out} * factor;"]


def _one_chunk_lines(size: int, max_lines: list, value_max: str, exp_lines: list,
                     value_exp: str, ctype: str, out_type: str, sum_type: str, inf: str, nan: str,
                     out: str, stream: bool) -> list[str]:
    """A row of at most ``ONLINE_CHUNK`` elements: its max, then one loop storing ``exp(a - max)``
    and summing it, then the scale by ``1 / sum`` (a factor of NaN where the row is all -inf:
    the exp loop then stores nothing and the scale makes every element NaN).
    The chunked form's running-max rescaling and per-chunk factors (two scalar double
    ``exp`` calls a row) are all ``exp(0) = 1`` here: ViT's 6 x 197 x 197 attention softmax at
    1 thread took 181 us in that form. A row of -inf gives NaN (eager's 0 / 0), a NaN or +inf
    makes the sum NaN, as there (streamed, such a row's buffer is zeroed first: NaN * 0)."""
    lines = [f"{ctype} om = -{inf};", "int onan = 0;", "{", f"  const int64_t jc = 0, jc_end = {size};",
             f"  #pragma omp simd reduction(max:om) reduction(|:onan){SIMDLEN_MARK}",
             "  for (int64_t j = jc; j < jc_end; ++j) {"]
    lines += ["    " + line for line in max_lines]
    lines += [f"    om = om > {value_max} ? om : {value_max};", f"    onan |= ({value_max} != {value_max});", "  }"]
    lines += [f"  {sum_type} cs = 0;",
              f"  if (om != -{inf}) {{",
              f"    #pragma omp simd reduction(+:cs){SIMDLEN_MARK}",
              "    for (int64_t j = jc; j < jc_end; ++j) {"]
    lines += ["      " + line for line in exp_lines]
    lines += [f"      {out} = static_cast<{out_type}>({value_exp});", f"      cs = cs + {value_exp};", "    }", "  }"]
    if stream:
        lines += [f"  else {{ for (int64_t j = jc; j < jc_end; ++j) {out} = 0; }}"]
    lines += [f"  const {out_type} factor = onan || om == -{inf} ? {nan} : static_cast<{out_type}>("
              f"static_cast<{sum_type}>(1) / cs);"]
    lines += ["  " + line for line in _scale_lines(size, "jc", "jc_end", out, stream)]
    return lines + (["  ap_stream_fence();"] if stream else []) + ["}"]


def _prefetch_lines(kernel: FusedKernel, total, chunk: int, stream: bool = False) -> list[str]:
    """``__builtin_prefetch`` lines for the block starting at ``jb``: the same block of the
    next chunk (``chunk`` elements on), for every unit-stride load of the exp and for the
    output (as a write).

    Each chunk's max loop reads its input from memory and the exp loop after it is
    compute-bound, so without prefetches memory idles while ``exp`` runs and the core
    waits while the next chunk streams in (and the exp loop's stores wait on the output
    lines). One chunk ahead is the next chunk of the row, or at its end the next row's
    first chunk when rows are contiguous (elsewhere a hint on lines that are not read;
    prefetches never fault). 4096x4096 float32 softmax, kernel CPU time at 1 thread:
    19.5 against 25 ms without them (interleaved medians, busy 2-core host).
    """
    lines, seen = [], set()
    locality = STREAM_PREFETCH_LOCALITY if stream else 3
    targets = [] if stream else [("out0", f"r * {total.size} + jb", kernel.outputs[0].dtype.itemsize, 1)]
    names = {id(buf): f"in{k}" for k, buf in enumerate(kernel.inputs)}
    for node in walk(total.source):
        if isinstance(node, Piecewise):
            return []  # cat pieces read at offsets: leave them to the hardware prefetcher
        if not isinstance(node, Load):
            continue
        j_terms = [t for t in node.index.terms
                   if t[0] == "j" or (not isinstance(t[0], str) and "j" in t[0].operand.variables())]
        if [(t[0], t[1]) for t in j_terms] != [("j", 1)]:
            continue  # strided or div/mod in j: not a stream along the row
        index = re.sub(r"\bj\b", "jb", node.index.render())
        targets.append((names[id(node.buffer)], index, node.dtype.itemsize, 0))
    for name, index, itemsize, write in targets:
        if (name, index) in seen:
            continue
        seen.add((name, index))
        step = max(1, LINE_BYTES // itemsize)
        lines += [f"__builtin_prefetch({name} + ({index}) + {chunk + k}, {write}, {locality});"
                  for k in range(0, PREFETCH_BLOCK, step)]
    return lines


def _exp_loop(kernel: FusedKernel, total, size: int, chunk: int, body: list[str], value: str,
              sum_type: str, stream: bool = False) -> list[str]:
    """The chunk's exp loop over ``[jc, jc_end)`` around ``body`` (stores ``exp``), adding
    ``value`` into ``cs``: blocks of ``PREFETCH_BLOCK`` elements, each prefetching ahead
    (``_prefetch_lines``), when the chunk holds whole blocks; else one vector loop.

    The blocked loop adds into ``PREFETCH_BLOCK`` lane sums kept across the chunk's blocks
    (``cs_lanes``), folded into ``cs`` once after them: an ``omp simd reduction`` per block
    folded its vector lanes every 64 elements, and that horizontal sum was the loop's
    bottleneck (4096 x 4096 streamed softmax in the model, interleaved: 8681 against 7453 us
    at 1 thread, 4418 against 4227 us at 2)."""
    prefetch = _prefetch_lines(kernel, total, chunk, stream) if chunk >= PREFETCH_BLOCK else []
    if not prefetch:
        lines = ([f"  #pragma omp simd reduction(+:cs){SIMDLEN_MARK}", "  for (int64_t j = jc; j < jc_end; ++j) {"]
                 + ["    " + line for line in body + [f"cs = cs + {value};"]] + ["  }"])
        return lines + (["  " + line for line in _pending_store_lines("jc", "jc_end - jc")] if stream else [])
    exact = size % chunk == 0 and chunk % PREFETCH_BLOCK == 0  # constant trip counts: unrolled
    end = f"jb + {PREFETCH_BLOCK}" if exact else f"ap::min_index(jb + {PREFETCH_BLOCK}, jc_end)"
    lines = [f"  {sum_type} cs_lanes[{PREFETCH_BLOCK}] = {{}};",
             f"  for (int64_t jb = jc; jb < jc_end; jb += {PREFETCH_BLOCK}) {{"]
    lines += ["    " + line for line in prefetch]
    lines += [f"    #pragma omp simd{SIMDLEN_MARK}", f"    for (int64_t j = jb; j < {end}; ++j) {{"]
    lines += ["      " + line for line in body + [f"cs_lanes[j - jb] = cs_lanes[j - jb] + {value};"]]
    lines += ["    }"]
    if stream:  # the pending row's blocks in reverse order (see _mirrored_block_lines)
        lines += ["    " + line for line in _mirrored_block_lines(exact)]
    lines += ["  }", f"  for (int64_t lane = 0; lane < {PREFETCH_BLOCK}; ++lane) cs = cs + cs_lanes[lane];"]
    return lines
