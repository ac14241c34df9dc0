"""The CPU direct-convolution template: tilings (TopN solver) and rendering of
``template_kernels.ConvKernel``.

The kernel (``templates/cpu_conv.cpp.j2``) is the GEMM template's register tile applied
to a convolution without an im2col matrix: per image, M = OH*OW output positions,
N = C_out, K = C_in*KH*KW. A tile of up to ``mr`` positions keeps one pointer per
position to its window in the input, so a tap's element is one broadcast at a constant
offset (stride and dilation cost nothing); the weight panel supplies 16 channels per
tap. Padding is done once per image by copying it into a zero-bordered ``workspace``.
Work items are (group of tiles, panel, tile): a group's input rows stay in L2 while
every panel passes over them. A long K (deep layers: 512 channels x 9 taps) is cut
into k blocks of ``kc`` input channels so a panel's block stays in L1 across the
group's tiles, as in the GEMM template; the partial sums of the earlier blocks wait
in the workspace, position-major so they load as vectors.

``layout`` ``nhwc`` copies each image channels-last instead (with the padding, even
where there is none): a tile's row then reads consecutive floats over the channels of
a tap, not one float per channel plane (a page apart in a 56x56 layer); the copy costs
a pass over the input, which a 1x1 convolution with little K may not repay.

``layout`` ``lanes`` renders a ``templates/cpu_lanes_conv*.cpp.j2`` instead: the GEMM
``out[N][positions] = W[N][K] @ x windows`` with the positions in the vector lanes. With
stride 1, one tap of consecutive positions of a row is consecutive floats of x, and over
the rows of the zero-bordered copy (width W + 2*pw) it is one constant offset for every
position: the kernel computes every position of those rows and stores only the OW valid
columns of each. So x's rows load as vectors, the epilogue runs on vectors and a
channel's outputs are stored contiguously, where the direct template stores each
position's channels a plane apart (a 56x56 plane is 12 KB). ``pointwise`` is the same
template for a 1x1 convolution without padding, which reads x in place: a 1x1
convolution with little K (MobileNet's expansions: 16 or 24 input channels) spends most
of the direct template's time in those stores. A strided convolution first splits the
zero-bordered image into its stride phases (rows i*s + a, columns j*s + b:
``lanes_phases``), so one tap of consecutive output positions is again consecutive
floats, of one phase. The register tile is ``mr`` channels x ``nr`` positions
(``mc`` = ``nr``, ``kc`` = C_in).

``layout`` ``rows`` is the ``lanes`` template without the whole-image copy, for a strided
convolution of stride 1 or 2 along the row: per output row, each thread stages the KH
input rows its windows read (per input channel, zero-bordered: ``staged_pitch`` floats
a row, a few KB that stay in L1) and a tile's positions lie within that row. A stride-2
row is staged as its two column phases (even padded columns, then odd ones), so a tap of
consecutive positions is one plain vector load. The phase copy of a strided ``lanes`` convolution
writes and reads back an image-sized workspace; in a model that image is cold (MobileNet's
stem: a 602 KB input read from L3 or memory, then 613 KB of phases).

Knobs (the tiling): ``mr``, ``mc`` (positions per group), ``kc``, ``layout``, ``block_dim``.
"""
from __future__ import annotations

from dataclasses import dataclass

from aotpack.backends.base import Candidate
from aotpack.backends.cpu.epilogue import scalar
from aotpack.backends.cpu.gemm_template import (L2_BLOCK_BYTES, LONG_K_BLOCK,
                                                PARALLEL_MIN_FLOPS, WHOLE_K_BLOCK_BYTES,
                                                VECTOR_BYTES, latency_rows, tile_choices, tile_width, wide_speedup,
                                                wide_suffix)
from aotpack.backends.cpu.toolchain import O2_MARK
from aotpack.config import MAX_TOPN
from aotpack.ir.template_kernels import ConvKernel
from aotpack.ir.epilogues import CONV_EPILOGUES
from aotpack.backends.cpu.templating import render


@dataclass(frozen=True)
class ConvTiling(Candidate):
    """Knobs of one convolution template static kernel (see the module docstring).
    ``workspace``: the image copy (``image_region``) and, with more than one k block, the
    partial sums (``M x panels*16`` floats)."""

    block_dim: int
    mr: int
    mc: int
    kc: int
    layout: str = "nchw"
    workspace: int = 0
    vector_bytes: int = 32
    nr: int = 16

    @property
    def tiling_repr(self) -> str:
        """``tiling_repr``: every knob, canonical (``vector_bytes`` and ``nr`` only off their
        AVX2 defaults)."""
        return (f"cpu_conv;block_dim={self.block_dim};mr={self.mr};mc={self.mc};kc={self.kc};"
                f"layout={self.layout}{wide_suffix(self.vector_bytes)}{'' if self.nr == 16 else f';nr={self.nr}'}")

    def copies(self, kernel: ConvKernel) -> bool:
        """Whether a launch copies the image first (padding, the channels-last layout, or a
        strided ``lanes`` convolution's phases): whether ``image_region`` takes any bytes.
        ``rows`` stages rows as it goes instead."""
        return self.layout != "rows" and image_region(kernel, self.layout) > 0


def _group_positions(kernel: ConvKernel, mr: int) -> int:
    """Positions per group, a multiple of ``mr``: the fewest groups whose input rows
    (``C_in`` planes x the rows their windows span) fit ``L2_BLOCK_BYTES``, the tiles
    split evenly among them."""
    c_in, w = kernel.x_shape[1], kernel.x_shape[3]
    oh, kh, sh, pw, dh = (kernel.out_hw[0], kernel.kernel_size[0], kernel.stride[0], kernel.padding[1],
                          kernel.dilation[0])
    row_bytes = c_in * (w + 2 * pw) * 4
    window_rows = (kh - 1) * dh + 1
    input_rows_that_fit = max(window_rows + sh, L2_BLOCK_BYTES // row_bytes)
    out_rows = max(1, (input_rows_that_fit - window_rows) // sh + 1)
    tiles = -(-kernel.m // mr)
    groups = -(-oh // min(oh, out_rows))
    return -(-tiles // groups) * mr


def lanes_phases(kernel: ConvKernel) -> tuple[int, int, int, int]:
    """``(phase_rows, phase_cols, hq, wq)``: how a ``lanes`` convolution reads x. A stride
    s splits the zero-bordered image into phases (rows i * s + a, columns j * s + b), of
    which a stride-s, dilation-1 window touches min(k, s) per axis; a phase keeps the
    ``oh + (kh - 1) * dh // sh`` rows (``ow + ...`` columns) its taps reach. Stride 1: one
    phase, the zero-bordered image itself."""
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = kernel.kernel_size, kernel.stride, kernel.dilation, kernel.out_hw
    return (1 if sh == 1 else min(kh, sh), 1 if sw == 1 else min(kw, sw),
            oh + (kh - 1) * dh // sh, ow + (kw - 1) * dw // sw)


def image_region(kernel: ConvKernel, layout: str) -> int:
    """Bytes the image copy takes at the workspace's start (64-byte aligned): the padded
    image, in any layout (a strided ``lanes`` convolution: its phases, ``lanes_phases``);
    none for ``nchw``, ``lanes`` or ``pointwise`` of stride 1 without padding (read in place)."""
    (ph, pw), (c, h, w) = kernel.padding, kernel.x_shape[1:]
    if layout == "lanes" and kernel.stride != (1, 1):
        phase_rows, phase_cols, hq, wq = lanes_phases(kernel)
        return -(-(c * phase_rows * phase_cols * hq * wq * 4) // 64) * 64
    if layout in ("nchw", "lanes", "pointwise") and not (ph or pw):
        return 0
    return -(-(c * (h + 2 * ph) * (w + 2 * pw) * 4) // 64) * 64


#: float32 lanes of the widest vector a ``rows`` tile loads (AVX-512): staged rows are
#: sized for it, so a narrower fallback fits them too.
STAGED_MAX_LANES = 16


def staged_pitch(kernel: ConvKernel, positions: int) -> int:
    """Floats per staged row of a ``rows`` convolution with ``positions``-wide tiles, a
    multiple of ``STAGED_MAX_LANES``: the zero-bordered input row (W + pw), and every
    float a row's last two tiles load: whole vectors of lanes from column ``ow0 + tap``
    (stride 1) or, with stride 2, from column ``ow0 + tap / 2`` of the tap's column phase;
    the two phases are the two halves of the pitch, so the reach is counted in padded
    columns (``stride`` x positions) and each half covers its phase's."""
    kw, sw, dw, ow = kernel.kernel_size[1], kernel.stride[1], kernel.dilation[1], kernel.out_hw[1]
    lanes = STAGED_MAX_LANES
    tiles = -(-ow // positions)
    reach = 0
    for tile in range(max(0, tiles - 2), tiles):
        start, count = tile * positions, min(positions, ow - tile * positions)
        reach = max(reach, (start + -(-count // lanes) * lanes) * sw + (kw - 1) * dw)
    floats = max(kernel.x_shape[3] + kernel.padding[1], reach)
    return -(-floats // lanes) * lanes


def staged_bytes(kernel: ConvKernel, positions: int, block_dim: int) -> int:
    """Workspace of a ``rows`` convolution: per thread, C_in x KH staged rows."""
    floats = kernel.x_shape[1] * kernel.kernel_size[0] * staged_pitch(kernel, positions)
    return block_dim * -(-(floats * 4) // 64) * 64


#: ``rows`` only for images of up to this many channels (RGB stems). Measured at 1 thread
#: (AVX-512) against the phase copy, warm caches: MobileNet's 3x3 stride-2 stem 0.93x
#: (in the model, where its input and phases are cold, 322 -> 206 us), ResNet's 7x7 one
#: 0.89x; 16 channels (3x3 s2 at 112x112) 1.09x and 64 (a 1x1 s2 downsample) 1.44x, where
#: restaging each row per output row and the row tiles' idle lanes (28 columns: 32 lanes)
#: cost more than the copy.
ROWS_MAX_CHANNELS = 4


def rows_allowed(kernel: ConvKernel) -> bool:
    """Whether ``layout`` ``rows`` applies: a strided ``lanes`` convolution (``lanes_layout``)
    of stride 1 or 2 along the row with at most ``ROWS_MAX_CHANNELS`` input channels. Not
    a stride-1 one, whose copy only pads (ResNet's 3x3 stride-1 layers: 1.04-1.14x the
    padded ``lanes`` form)."""
    return (lanes_layout(kernel) == "lanes" and kernel.stride != (1, 1) and kernel.stride[1] in (1, 2)
            and kernel.x_shape[1] <= ROWS_MAX_CHANNELS)


def partial_bytes(kernel: ConvKernel, kc: int) -> int:
    """Bytes of the partial sums: none with one k block."""
    return 0 if kc >= kernel.x_shape[1] else kernel.m * kernel.panels * kernel.panel * 4


def _default_kc(kernel: ConvKernel) -> int:
    """Input channels per k block: all of them while a panel's K x 16 floats fit
    ``WHOLE_K_BLOCK_BYTES`` (as the GEMM template), else ``LONG_K_BLOCK`` taps' worth."""
    c_in, taps = kernel.x_shape[1], kernel.k // kernel.x_shape[1]
    if kernel.k * kernel.panel * 4 <= WHOLE_K_BLOCK_BYTES:
        return c_in
    return max(1, LONG_K_BLOCK // taps)


def make_tiling(kernel: ConvKernel, block_dim: int, mr: int, kc: int, mc: int | None = None,
                layout: str = "nchw", vector_bytes: int = VECTOR_BYTES, nr: int = 16) -> ConvTiling:
    """The tiling with these knobs, ``mc`` by default from ``_group_positions`` and the
    workspace it needs (``kc`` capped at C_in)."""
    kc = min(kc, kernel.x_shape[1])
    return ConvTiling(block_dim=block_dim, mr=mr, mc=mc or _group_positions(kernel, mr), kc=kc, layout=layout,
                      workspace=image_region(kernel, layout) + partial_bytes(kernel, kc), vector_bytes=vector_bytes,
                      nr=nr if kernel.panels > 1 else 16)


#: ``lanes`` / ``pointwise`` register tiles (channels, positions) per vector width, the default
#: first: accumulators + one vector of x per lane group + a broadcast within the 32 (16) registers.
LANES_TILES = {64: ((8, 48), (12, 32)), 32: ((4, 24), (6, 16))}


#: ``lanes`` / ``pointwise`` need at least this many positions (an AVX-512 vector): fewer
#: (the one position of a squeeze-excite block) leave most lanes empty, where the direct
#: template's short tiles do well.
LANES_MIN_POSITIONS = 16


#: A ``lanes`` convolution's tiling goes first up to this K (C_in x taps); past it the direct
#: default does. Measured at 1 thread (AVX-512): 16-32 channels x 9 taps, lanes 0.8-0.9x
#: the direct template; 64 x 9 level; 128 x 9, 1.15x.
LANES_FIRST_MAX_K = 576


#: ``lanes`` only for kernels up to this many taps wide. The template unrolls a kernel row
#: whole (its window offsets constants), so compile time grows with the width, and wide
#: kernels lose anyway: ViT-S/16's 16x16 stride-16 patch embedding compiled in 0.43 s (0.15 s
#: for the direct template's candidates, at -O2) and ran 1.30x / 1.45x the direct ``nchw``
#: tiling at 1 / 2 threads (1351 / 937 against 1041 / 647 us, AVX-512); unrolling the row
#: only 8 deep compiled in 0.19 s but ran slower still.
LANES_MAX_KERNEL_WIDTH = 8


def lanes_layout(kernel: ConvKernel) -> str | None:
    """``pointwise`` (1x1, stride 1, no padding), ``lanes`` (any other convolution whose
    strided axes have dilation 1: ``lanes_phases``) or ``None`` (fewer than
    ``LANES_MIN_POSITIONS`` positions, a kernel wider than ``LANES_MAX_KERNEL_WIDTH``, or an
    axis both strided and dilated)."""
    if (kernel.m < LANES_MIN_POSITIONS or kernel.kernel_size[1] > LANES_MAX_KERNEL_WIDTH
            or any(s > 1 and d > 1 for s, d in zip(kernel.stride, kernel.dilation))):
        return None
    if kernel.kernel_size == (1, 1) and kernel.stride == (1, 1) and kernel.padding == (0, 0):
        return "pointwise"
    return "lanes"


def lanes_tiling(kernel: ConvKernel, block_dim: int, channels: int, positions: int,
                 vector_bytes: int, staged: bool = False) -> ConvTiling:
    """The ``lanes`` (``pointwise``) tiling of ``channels`` x ``positions`` register tiles;
    its workspace is the zero-bordered copy of one image, if the convolution pads. With
    ``staged`` (where ``rows_allowed``): the ``rows`` layout, its workspace each thread's
    staged rows."""
    if staged:
        return ConvTiling(block_dim=block_dim, mr=channels, mc=positions, kc=kernel.x_shape[1], layout="rows",
                          workspace=staged_bytes(kernel, positions, block_dim), vector_bytes=vector_bytes,
                          nr=positions)
    layout = lanes_layout(kernel)
    return ConvTiling(block_dim=block_dim, mr=channels, mc=positions, kc=kernel.x_shape[1], layout=layout,
                      workspace=image_region(kernel, layout), vector_bytes=vector_bytes, nr=positions)


def _lanes_options(kernel: ConvKernel, threads: int, device_limit: int, vector_bytes: int) -> list:
    """The ``lanes`` / ``pointwise`` default and its variants (other thread count, other
    tile), or none."""
    if lanes_layout(kernel) is None:
        return []
    (channels, positions), other = LANES_TILES[vector_bytes]
    other_threads = device_limit if threads == 1 else 1
    if rows_allowed(kernel):  # the staged rows first, the image copy's form after
        options = [lanes_tiling(kernel, threads, channels, positions, vector_bytes, staged=True),
                   lanes_tiling(kernel, threads, channels, positions, vector_bytes)]
        if device_limit > 1:
            options.append(lanes_tiling(kernel, other_threads, channels, positions, vector_bytes, staged=True))
        options.append(lanes_tiling(kernel, threads, *other, vector_bytes, staged=True))
        return options
    options = [lanes_tiling(kernel, threads, channels, positions, vector_bytes)]
    if device_limit > 1:
        options.append(lanes_tiling(kernel, other_threads, channels, positions, vector_bytes))
    options.append(lanes_tiling(kernel, threads, *other, vector_bytes))
    return options


def _lanes_first(kernel: ConvKernel, lanes_default: ConvTiling) -> bool:
    """Whether the ``lanes`` default leads: a 1x1 convolution, or a stride-1 one with K up to
    ``LANES_FIRST_MAX_K``. A strided one copies its phases first, a pass over the image that
    only a 1x1 repays everywhere. Measured at 1 thread: ResNet's 1x1 s2 downsample (K 64)
    0.80x the best direct tiling (AVX-512), 0.81x (AVX2); MobileNet's 3x3 s2 stem (K 27)
    0.93x (AVX-512) but 1.09x (AVX2); 7x7 s2 (K 147) and 3x3 s2 (K 576) 1.09-1.36x."""
    if lanes_default.layout == "pointwise" or kernel.kernel_size == (1, 1):
        return True
    return kernel.stride == (1, 1) and kernel.k <= LANES_FIRST_MAX_K


def solve(kernel: ConvKernel, device_limit: int, count: int = MAX_TOPN,
          vector_bytes: int = VECTOR_BYTES) -> list[ConvTiling]:
    """Candidate tilings of ``kernel``, the heuristic default first, at most ``count``.

    The default: the register tile (``mr`` x ``nr``) from ``tile_choices`` (6 x 16 AVX2,
    10 x 32 AVX-512 at ``vector_bytes`` 64),
    groups from ``_group_positions``, k blocks from ``_default_kc``, all ``device_limit``
    threads unless the convolution is under ``PARALLEL_MIN_FLOPS``. Then one knob at a
    time: the other thread count, the other ``mr``, the whole K or blocks of half as many
    channels, one group of every tile; the channels-last layout last of all. A convolution that
    ``lanes_layout`` accepts adds the ``lanes`` / ``pointwise`` tilings: first, then the direct
    default, then the rest of both, where ``_lanes_first``; else the direct default first
    and the ``lanes`` default second.
    """
    threads = 1 if kernel.flops < PARALLEL_MIN_FLOPS else max(1, device_limit)
    c_in = kernel.x_shape[1]
    kc = _default_kc(kernel)
    vector_bytes = tile_width(vector_bytes)
    (mr, nr), (other_mr, other_nr) = tile_choices(vector_bytes)
    wide = {"vector_bytes": vector_bytes, "nr": nr}
    options = [make_tiling(kernel, threads, mr, kc, **wide)]
    if device_limit > 1:
        options.append(make_tiling(kernel, device_limit if threads == 1 else 1, mr, kc, **wide))
    options.append(make_tiling(kernel, threads, other_mr, kc, vector_bytes=vector_bytes, nr=other_nr))
    other_kc = c_in if kc < c_in else (c_in // 2 if kernel.k >= 256 else 0)
    if other_kc:
        options.append(make_tiling(kernel, threads, mr, other_kc, **wide))
    options.append(make_tiling(kernel, threads, mr, kc, -(-kernel.m // mr) * mr, **wide))
    lanes = _lanes_options(kernel, threads, device_limit, vector_bytes)
    if lanes and _lanes_first(kernel, lanes[0]):
        options = [lanes[0], options[0], *lanes[1:], *options[1:]]
    elif lanes:
        options = [options[0], lanes[0], *options[1:], *lanes[1:]]
    # Channels-last comes last: it won none of 11 races it ran in at --topn 3 (ResNet-18 at
    # 1 and 2 threads, MobileNetV3-Small's stem, ViT-S/16's patch embedding; AVX-512), at
    # 1.09-3.2x the winner's time, and each one was a 0.16-0.29 s compile.
    options.append(make_tiling(kernel, threads, mr, kc, layout="nhwc", **wide))
    unique = list(dict.fromkeys(options))
    return unique[:min(count, MAX_TOPN)]


#: The layouts the ``templates/cpu_lanes_conv*.cpp.j2`` render (positions in the vector lanes);
#: the others (``nchw``, ``nhwc``) are the direct template's.
LANES_LAYOUTS = ("lanes", "pointwise", "rows")

#: Bytes per us the image copy (padding, channels-last, stride phases) moves. Its source is the
#: previous layer's output, still in L2/L3: ResNet-18's 1x1 stride-2 downsample (a 200 KB phase
#: copy) ran its ``lanes`` tiling in 73 us against the direct one's 82, which 10 GB/s would
#: have put 1.4x behind.
COPY_BYTES_PER_US = 20e3


#: ns per output element (one thread) of the direct template's stores: a tile holds positions
#: x 16 channels, and each position's 16 results go to 16 channel planes, a float each. Fitted
#: on MobileNetV3-Small's 1x1 convolutions at 56x56 and 28x28 at 1 thread (Zen 4), where the
#: compute is small: the direct tilings ran 0.6-0.7 ns per output element beyond the compute
#: estimate (1.9-2.5x the ``pointwise`` winner, which stores whole vectors of one plane).
DIRECT_STORE_NS = 0.6


def estimate_us(kernel: ConvKernel, tiling: ConvTiling, gflops: float = 80.0) -> float:
    """Guess in us: flops at ``gflops`` per thread (a little under the GEMM template's 90,
    for the window reads), tiles under the latency bound (``latency_rows``) costing as many,
    a ``lanes`` / ``pointwise`` tiling's computed-but-dropped positions (``lanes_waste``) as
    much as the kept ones, the direct template's scattered stores (``direct_store_us``), plus
    ~2 us per parallel region and the image copy at ``COPY_BYTES_PER_US``."""
    rows = latency_rows(kernel.m, tiling.mr, tiling.vector_bytes, tiling.nr)
    compute = kernel.flops * rows * lanes_waste(kernel, tiling) / (
        gflops * wide_speedup(tiling.vector_bytes) * 1e3 * tiling.block_dim)
    copy = kernel.x_shape[0] * image_region(kernel, tiling.layout) / COPY_BYTES_PER_US
    return compute + direct_store_us(kernel, tiling) + copy + (2.0 if tiling.block_dim > 1 else 0.0)


def direct_store_us(kernel: ConvKernel, tiling: ConvTiling) -> float:
    """us the direct template (``nchw``, ``nhwc``) spends storing its N x M outputs per
    image at ``DIRECT_STORE_NS`` each, split over the threads; 0 for the layouts that store
    vectors along a plane (``lanes``, ``pointwise``, ``rows``). It matters where K is small:
    MobileNetV3-Small's expanding 1x1s at 56x56 (K = 16) store 226k floats for 7 MFLOP."""
    if tiling.layout in LANES_LAYOUTS:
        return 0.0
    return kernel.x_shape[0] * kernel.n * kernel.m * DIRECT_STORE_NS / 1e3 / tiling.block_dim


def lanes_waste(kernel: ConvKernel, tiling: ConvTiling) -> float:
    """Positions a ``lanes`` / ``pointwise`` tiling computes per output position (>= 1; 1 for
    the other layouts): it computes whole rows of the zero-bordered image (of a stride phase:
    ``lanes_phases``) and whole tiles of ``nr`` positions, and keeps the OH x OW valid ones.
    Small images waste most. With the 48-position tiles this Zen 3 host's tilings use
    (``vector_bytes`` 64): a 7x7 output computes 2 tiles for 49 positions (1.96), where
    ResNet-18's stride-2 3x3, stride-1 3x3 and 1x1 convolutions measured 1.8-2.7x the direct
    template's time; a 14x14 stride-2 one 1.22 (measured 1.2-1.3x); a 28x28 stride-2 one
    (phase rows of 29) 1.04 (0.9-1.08x). A stride-1 padded 3x3 at 28x28 computes rows of 30:
    1.10."""
    if tiling.layout not in ("lanes", "pointwise"):
        return 1.0
    oh, ow = kernel.out_hw
    row = lanes_phases(kernel)[3] if tiling.layout == "lanes" else ow
    computed = oh * row
    return -(-computed // tiling.nr) * tiling.nr / (oh * ow)


def render_kernel(kernel: ConvKernel, tiling: ConvTiling) -> str:
    """C++ source of ``kernel`` compiled with ``tiling`` (a ``cpu_lanes_conv`` template for
    the ``lanes``, ``pointwise`` and ``rows`` layouts, ``_lanes_template``; else ``cpu_conv.cpp.j2``)."""
    (n, c_in, h, w), (oh, ow) = kernel.x_shape, kernel.out_hw
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel.kernel_size, kernel.stride, kernel.padding, kernel.dilation
    epilogue = CONV_EPILOGUES[kernel.epilogue]
    shared = dict(  # what both templates take
        tiling_repr=tiling.tiling_repr, batch=n, c_in=c_in, h=h, w=w, m=kernel.m, n=kernel.n, panel=kernel.panel,
        vector_bytes=tiling.vector_bytes, mr=tiling.mr, nr=tiling.nr, block_dim=tiling.block_dim,
        x_offset=kernel.x_offset, has_bias=kernel.has_bias, has_residual=epilogue.reads_residual,
        residual_offset=kernel.residual_offset, epilogue_expr=scalar(epilogue),
        epilogue_text=f"{epilogue.text} where y = conv(x, W){' + bias' if kernel.has_bias else ''}",
        optional_helpers=[])
    window = dict(oh=oh, ow=ow, kh=kh, kw=kw, ph=ph, pw=pw, dh=dh, dw=dw, workspace=tiling.workspace,
                  copy=tiling.copies(kernel))
    if tiling.layout in LANES_LAYOUTS:
        phase_rows, phase_cols, hq, wq = lanes_phases(kernel)
        staged, strided = tiling.layout == "rows", (sh, sw) != (1, 1)
        # dense: a tile's positions are consecutive positions of out (a staged tile's lie in one row)
        return render(_lanes_template(staged, strided), **shared, **window, sh=sh, sw=sw, strided=strided,
                      phase_rows=phase_rows, phase_cols=phase_cols, hq=hq, wq=wq, dense=staged or wq == ow,
                      pitch=staged_pitch(kernel, tiling.nr) if staged else 0)
    return render("cpu_conv.cpp.j2", **shared, **window, sh=sh, sw=sw, k=kernel.k, panels=kernel.panels,
                  mc=tiling.mc, kc=tiling.kc, padded_bytes=image_region(kernel, tiling.layout),
                  partial_bytes=partial_bytes(kernel, tiling.kc), nhwc=tiling.layout == "nhwc",
                  tap_unroll=_tap_unroll(kw, tiling.layout), o2_mark=O2_MARK)


def _lanes_template(staged: bool, strided: bool) -> str:
    """The lanes convolution's template for how its tiles read x: rows staged as they go
    (layout ``rows``), the image's stride phases (a strided ``lanes``), or the image itself or
    its zero-bordered copy (``lanes`` of stride 1, ``pointwise``). Each extends
    ``cpu_lanes_conv.cpp.j2``."""
    if staged:
        return "cpu_lanes_conv_rows.cpp.j2"
    return "cpu_lanes_conv_phases.cpp.j2" if strided else "cpu_lanes_conv_image.cpp.j2"


def _tap_unroll(kw: int, layout: str) -> int:
    """Taps of a kernel row unrolled (``#pragma GCC unroll``): all of them, except 4 for a
    wide NCHW row. ViT-S/16's 16x16 patch convolution: the NCHW candidate compiled in 0.49
    against 0.70 s and ran level (552 against 549 us, interleaved, Zen 3); NHWC ran 2.6x
    slower at 4, so it keeps its full unroll."""
    return 4 if layout == "nchw" and kw > 8 else 16
