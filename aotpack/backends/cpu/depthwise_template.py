"""The CPU depthwise convolution template: tilings (TopN solver), workspace and rendering
of ``template_kernels.DepthwiseConvKernel``.

The kernel (``templates/cpu_depthwise_conv.cpp.j2``) works one (n, c) plane at a time.
It first stages the plane's input rows into the thread's workspace, zero-padded and, for
a column stride ``s``, split into ``s`` column phases (phase ``p`` holds padded columns
``p, p + s, ...``): each tap of an output vector is then one unit-stride load, and the
borders need no bounds check anywhere. Staging is one copy per input element, against
``KH * KW / s^2`` multiply-adds per input element (2.25 at 3x3 stride 2, 25 at 5x5 stride 1);
MobileNet's small planes (7x7, 14x14 under a 5x5 filter) would otherwise be mostly border.

Then blocks of ``rows`` output rows x ``vecs`` vectors of output columns are accumulated
in registers: every staged row a block reads is loaded once per tap column and feeds each
of the block's rows its filter covers (3x3 stride 1 at 4 rows: each load feeds up to 3
FMAs). A row's last vector is shifted left to end at the row's end (overlapping its
neighbour, whose lanes it recomputes identically); a row narrower than one vector spills
its spare lanes into the next rows, which are written after it. Planes are split across
``block_dim`` OpenMP threads as they come free.

Knobs (the tiling): ``rows``, ``vecs`` (``rows * vecs`` accumulator vectors of the 16
AVX2 registers), ``block_dim``, and ``vector_bytes`` (64: 16-lane AVX-512 vectors where
the target has them, offered next to the 8-lane default; a row under 16 columns wastes
most of a wide vector, so PGO decides). The workspace is ``block_dim`` staged planes.

``layout=channels`` (``templates/cpu_depthwise_channels.cpp.j2``) puts 8 channels in the
lanes instead, as ONNX Runtime's NCHWc and XNNPACK's NHWC depthwise kernels do: per group of
channels the planes are staged interleaved (``[padded row][padded column][channel]``) with
their filters, so a tap of 8 channels at one position is one vector load and one FMA and no
lane is spare on a 7- or 14-wide row; ``cols`` output positions of a row are the register
block, transposed back into the NCHW planes on the stack. Staging and the transpose cost a
scalar copy per input and output element, so it pays on 5x5 filters (25 FMAs an output)
more than on 3x3 stride 2 (2.25 an input); PGO decides, as for the other knobs.
"""
from __future__ import annotations

from dataclasses import dataclass

from aotpack.backends.base import Candidate
from aotpack.backends.cpu.epilogue import scalar, vector_body
from aotpack.config import MAX_TOPN
from aotpack.ir.template_kernels import DepthwiseConvKernel
from aotpack.ir.epilogues import DEPTHWISE_EPILOGUES
from aotpack.backends.cpu.templating import render

#: Bytes of one vector register the template computes in where the target has AVX (the
#: template falls back to 16, SSE, without it; the workspace is sized for the wider one).
VECTOR_BYTES = 32
LANES = VECTOR_BYTES // 4
#: Below this many flops one thread is the default (a parallel region costs ~1-2 us; PGO at
#: device limit 2 picked 2 threads for every MobileNetV3-Small depthwise conv, 0.9-2.4 Mflop,
#: 25-40 us against 33-70 us on one).
PARALLEL_MIN_FLOPS = 500_000
#: Most accumulator vectors a register block may hold (16 AVX2 registers, less the loaded
#: input vectors and a broadcast weight).
MAX_ACCUMULATORS = 12
#: Output positions per register block of ``layout=channels`` (one accumulator each).
CHANNELS_COLS = 8


@dataclass(frozen=True)
class DepthwiseTiling(Candidate):
    """Knobs of one depthwise conv template static kernel (see the module docstring);
    ``workspace`` is bytes (``workspace_bytes``)."""

    block_dim: int
    rows: int
    vecs: int
    workspace: int = 0
    vector_bytes: int = VECTOR_BYTES
    #: ``planes`` (a plane's columns in the lanes) or ``channels`` (8 channels in the lanes).
    layout: str = "planes"
    #: ``layout=channels``: output positions per register block (``rows``/``vecs`` are 0 there).
    cols: int = 0

    @property
    def tiling_repr(self) -> str:
        """``tiling_repr``: every knob, canonical (``vector_bytes`` only off the AVX2 default)."""
        wide = "" if self.vector_bytes == VECTOR_BYTES else f";vector_bytes={self.vector_bytes}"
        if self.layout == "channels":
            return f"cpu_depthwise_conv;block_dim={self.block_dim};layout=channels;cols={self.cols}{wide}"
        return f"cpu_depthwise_conv;block_dim={self.block_dim};rows={self.rows};vecs={self.vecs}{wide}"

    @property
    def lanes(self) -> int:
        """float32 lanes per vector."""
        return self.vector_bytes // 4


def output_vectors(kernel: DepthwiseConvKernel, lanes: int = LANES) -> int:
    """Vectors per output row (one for a row under one vector)."""
    return max(1, -(-kernel.out_hw[1] // lanes))


def pitch(kernel: DepthwiseConvKernel, lanes: int = LANES) -> int:
    """Floats per staged row of one phase, a multiple of ``lanes``: the phase's padded
    columns, and at least the last output vector's farthest tap."""
    (_h, w), (_oh, ow) = kernel.in_hw, kernel.out_hw
    stride, pad, dilation, kw = kernel.stride[1], kernel.padding[1], kernel.dilation[1], kernel.kernel_hw[1]
    columns = -(-(w + 2 * pad) // stride)
    reach = max(ow, lanes) + (kw - 1) * dilation // stride
    return -(-max(columns, reach) // lanes) * lanes


def staged_rows(kernel: DepthwiseConvKernel) -> int:
    """Padded input rows the output rows read: ``(OH - 1) * SH + (KH - 1) * DH + 1``."""
    return (kernel.out_hw[0] - 1) * kernel.stride[0] + (kernel.kernel_hw[0] - 1) * kernel.dilation[0] + 1


def scratch_floats(kernel: DepthwiseConvKernel, lanes: int = LANES) -> int:
    """Floats of workspace per thread: the staged plane's phases, rounded to 64 bytes."""
    floats = kernel.stride[1] * staged_rows(kernel) * pitch(kernel, lanes)
    return -(-floats // 16) * 16


def workspace_bytes(kernel: DepthwiseConvKernel, block_dim: int, lanes: int = LANES) -> int:
    """Bytes of workspace a tiling needs: one staged plane per thread."""
    return block_dim * scratch_floats(kernel, lanes) * 4


def channels_scratch_floats(kernel: DepthwiseConvKernel, lanes: int = LANES) -> int:
    """Floats of ``layout=channels`` workspace per thread: the staged window
    ``[(OH - 1) * SH + (KH - 1) * DH + 1][(OW - 1) * SW + (KW - 1) * DW + 1][lanes]`` and the
    group's filters ``[KH * KW][lanes]``, rounded to 64 bytes."""
    (_oh, ow), (kh, kw) = kernel.out_hw, kernel.kernel_hw
    cols = (ow - 1) * kernel.stride[1] + (kw - 1) * kernel.dilation[1] + 1
    floats = (staged_rows(kernel) * cols + kh * kw) * lanes
    return -(-floats // 16) * 16


def channels_tiling(kernel: DepthwiseConvKernel, block_dim: int, cols: int = CHANNELS_COLS) -> DepthwiseTiling:
    """A ``layout=channels`` tiling (8 channels in the lanes, ``cols`` positions a block; the
    workspace is sized for 8 lanes, so the tiling keeps the AVX2 ``vector_bytes``)."""
    return DepthwiseTiling(block_dim=block_dim, rows=0, vecs=0, layout="channels",
                           cols=max(1, min(cols, kernel.out_hw[1])),
                           workspace=block_dim * channels_scratch_floats(kernel) * 4)


def _tiling(kernel: DepthwiseConvKernel, block_dim: int, rows: int, vecs: int,
            vector_bytes: int = VECTOR_BYTES) -> DepthwiseTiling:
    lanes = vector_bytes // 4
    rows = max(1, min(rows, kernel.out_hw[0]))
    vecs = max(1, min(vecs, output_vectors(kernel, lanes), MAX_ACCUMULATORS // rows))
    return DepthwiseTiling(block_dim=block_dim, rows=rows, vecs=vecs,
                           workspace=workspace_bytes(kernel, block_dim, lanes), vector_bytes=vector_bytes)


def solve(kernel: DepthwiseConvKernel, device_limit: int, count: int = MAX_TOPN,
          vector_bytes: int = VECTOR_BYTES) -> list[DepthwiseTiling]:
    """Candidate tilings of ``kernel``, the heuristic default first, at most ``count``.

    The default: 4 rows x 2 vectors (each staged row feeds up to KH rows; 8 accumulators),
    all ``device_limit`` threads unless the conv is under ``PARALLEL_MIN_FLOPS``. With
    ``vector_bytes`` 64 (AVX-512), the default at 16 lanes comes first for rows of 16
    columns or more and second otherwise. Then the other thread count, 2 rows x 2
    vectors, 4 rows x 1 vector (a narrow row), 6 rows x 2. Clipped to the output's rows
    and vectors, duplicates dropped. The ``layout=channels`` form at the default's threads
    comes second, or third with a target's 16-lane default (first or second) in front of it.
    """
    threads = 1 if kernel.flops < PARALLEL_MIN_FLOPS else max(1, device_limit)
    options = [_tiling(kernel, threads, 4, 2), channels_tiling(kernel, threads)]
    if vector_bytes >= 64:
        wide = _tiling(kernel, threads, 4, 2, 64)
        options.insert(0 if kernel.out_hw[1] >= 16 else 1, wide)
    if device_limit > 1:
        options.append(_tiling(kernel, device_limit if threads == 1 else 1, 4, 2))
    options += [_tiling(kernel, threads, 2, 2), _tiling(kernel, threads, 4, 1), _tiling(kernel, threads, 6, 2)]
    unique = list(dict.fromkeys(options))
    return unique[:min(count, MAX_TOPN)]


def estimate_us(kernel: DepthwiseConvKernel, tiling: DepthwiseTiling, gflops: float = 30.0) -> float:
    """Guess in us: flops at ``gflops`` per thread over the lanes the vectors use (a row's
    spare lanes cost as much as used ones), plus ~2 us per parallel region."""
    ow, lanes = kernel.out_hw[1], tiling.lanes
    used = ow / (output_vectors(kernel, lanes) * lanes) if ow < lanes and tiling.layout == "planes" else 1.0
    compute = kernel.flops * LANES / (used * gflops * lanes * 1e3 * tiling.block_dim)
    return compute + (2.0 if tiling.block_dim > 1 else 0.0)


def _chunk(kernel: DepthwiseConvKernel, block_dim: int) -> int:
    """Planes per dynamic chunk: about 8 chunks per thread."""
    return max(1, kernel.batch * kernel.channels // (8 * block_dim))


def render_kernel(kernel: DepthwiseConvKernel, tiling: DepthwiseTiling) -> str:
    """C++ source of ``kernel`` compiled with ``tiling``."""
    (h, w), (oh, ow), (kh, kw) = kernel.in_hw, kernel.out_hw, kernel.kernel_hw
    bias = " + bias" if kernel.has_bias else ""
    channels = tiling.layout == "channels"
    epilogue = DEPTHWISE_EPILOGUES[kernel.epilogue]
    return render("cpu_depthwise_channels.cpp.j2" if channels else "cpu_depthwise_conv.cpp.j2",
                  tiling_repr=tiling.tiling_repr, cols=tiling.cols, n=kernel.batch, c=kernel.channels,
                  h=h, w=w, oh=oh, ow=ow, kh=kh, kw=kw, sh=kernel.stride[0], sw=kernel.stride[1],
                  ph=kernel.padding[0], pw=kernel.padding[1], dh=kernel.dilation[0], dw=kernel.dilation[1],
                  xs=kernel.x_strides, ws=kernel.weight_strides, x_offset=kernel.x_offset,
                  has_bias=kernel.has_bias, bias_offset=kernel.bias_offset, bias_stride=kernel.bias_stride,
                  pitch=pitch(kernel, tiling.lanes),
                  scratch_floats=(channels_scratch_floats if channels else scratch_floats)(kernel, tiling.lanes),
                  workspace=tiling.workspace, vector_bytes=tiling.vector_bytes, rows=tiling.rows, vecs=tiling.vecs,
                  block_dim=tiling.block_dim,
                  chunk=_chunk(kernel, tiling.block_dim), vector_lines=vector_body(epilogue),
                  lane_expr=scalar(epilogue, "t[j]"), epilogue_text=f"{epilogue.text} where y = depthwise_conv(x, W){bias}",
                  optional_helpers=[])
