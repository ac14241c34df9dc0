"""Template kernels: GEMM, convolutions (direct, depthwise, Winograd), batched GEMM and fused
attention, each a fixed algorithm with shape and layout parameters (the fused-kernel IR is in
``ir.kernel``).

Every class derives from ``TemplateKernel``, which prints the kernel (``format``: the kind,
the name, then the class's ``describe()`` lines) and hashes that text with positional buffer
names into ``kernel_id``, so equal template kernels (repeated layers) share it. Weights such
a kernel reads in a layout of its own (GEMM panels, Winograd filters) are transformed by the
backend at build time (``Backend.weight_transform``); the kernel records only their shape.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import ClassVar

from aotpack.ir.epilogues import CONV_EPILOGUES, DEPTHWISE_EPILOGUES, GEMM_EPILOGUES


@dataclass(frozen=True, eq=False)
class TemplateKernel:
    """A template kernel: ``name`` (unique in the model), ``base_name`` (without the ordinal:
    the cache folder), and the fields its subclass declares; ``kind`` opens the printed form."""

    name: str
    base_name: str
    kind: ClassVar[str] = ""

    def describe(self) -> list[str]:
        """The printed form's lines after ``kind name``: the first continues that line
        (the loop domain), the others list operands and the output formula."""
        raise NotImplementedError

    def format(self, with_name: bool = True) -> str:
        """The kernel as text. ``with_name=False`` leaves out the name: the text
        ``kernel_id`` hashes (buffer names in it are positional already)."""
        first, *rest = self.describe()
        head = f"{self.kind} {self.name}" if with_name else self.kind
        return "\n".join([f"{head} {first}", *rest])

    @property
    def kernel_id(self) -> str:
        """sha256 (24 hex digits) of the printed kernel, without its name."""
        return hashlib.sha256(self.format(with_name=False).encode()).hexdigest()[:24]

    def __str__(self) -> str:
        return self.format()


@dataclass(frozen=True, eq=False)
class GemmKernel(TemplateKernel):
    """A GEMM template kernel: ``out[M, N] = epilogue(a[M, K] @ W^T + bias)``, float32.

    ``inputs`` are ``(a base, packed weight[, bias panels][, residual base])``:

    * ``a`` is read at ``a[a_offset + m * a_row_stride + k]`` (unit column stride);
    * the weight ``W[N, K]`` is packed at build time into ``ceil(N / panel)`` panels of
      ``panel`` columns, ``packed[p, k, j] = W[p * panel + j, k]`` (zeros past N);
    * the bias, when there is one, is padded with zeros to ``panels * panel``;
    * ``residual`` (epilogue ``add``) is read at ``offset + m * row_stride + n``.

    ``outputs`` is the contiguous ``out``. Like ``FusedKernel``, ``kernel_id`` hashes the
    printed form with positional buffer names, so equal GEMMs (repeated layers) share it.
    """

    kind: ClassVar[str] = "gemm"

    m: int
    n: int
    k: int
    inputs: tuple
    outputs: tuple
    epilogue: str = "none"
    has_bias: bool = False
    a_offset: int = 0
    a_row_stride: int = 0
    residual_offset: int = 0
    residual_row_stride: int = 0
    panel: int = 16  # columns per weight panel: the backend's packing (``Backend.weight_transform``)

    @property
    def panels(self) -> int:
        """Panels of the packed weight, ``ceil(n / panel)``."""
        return -(-self.n // self.panel)

    @property
    def flops(self) -> int:
        """Multiply-adds counted twice: ``2 * M * N * K``."""
        return 2 * self.m * self.n * self.k

    def describe(self) -> list[str]:
        """The printed form after ``kind name``: the GEMM, its operands' layouts and its epilogue."""
        lines = [f"[m<{self.m}, n<{self.n}, k<{self.k}]",
                 f"  in0: float32 a[m, k] at {self.a_offset} + m*{self.a_row_stride} + k",
                 f"  in1: float32 weight panels [{self.panels}, {self.k}, {self.panel}]"]
        if self.has_bias:
            lines.append(f"  in2: float32 bias [{self.panels * self.panel}]")
        if GEMM_EPILOGUES[self.epilogue].reads_residual:
            lines.append(f"  in{len(self.inputs) - 1}: float32 residual[m, n] at {self.residual_offset} + "
                         f"m*{self.residual_row_stride} + n")
        y = "a @ weight" + (" + bias" if self.has_bias else "")
        lines.append(f"  out0: float32[{self.m}, {self.n}] = {GEMM_EPILOGUES[self.epilogue].text} where y = {y}")
        return lines


def conv_output_lines(kernel, conv: str, c_out: int) -> list[str]:
    """The printed form's residual input (epilogues ``add``, ``add_relu``) and output lines of
    a dense convolution kernel (``ConvKernel``, ``WinogradConvKernel``); ``conv`` names the
    convolution in the output's formula."""
    n = kernel.x_shape[0]
    oh, ow = kernel.out_hw
    lines = []
    if CONV_EPILOGUES[kernel.epilogue].reads_residual:
        lines.append(f"  in{len(kernel.inputs) - 1}: float32 residual[{n}, {c_out}, {oh}, {ow}] contiguous "
                     f"at {kernel.residual_offset}")
    y = conv + (" + bias" if kernel.has_bias else "")
    return lines + [f"  out0: float32[{n}, {c_out}, {oh}, {ow}] = {CONV_EPILOGUES[kernel.epilogue].text} where y = {y}"]


@dataclass(frozen=True, eq=False)
class ConvKernel(TemplateKernel):
    """A direct 2-D convolution template kernel, float32, NCHW, groups 1:
    ``out[n, co, oh, ow] = epilogue(sum over ci, kh, kw of W[co, ci, kh, kw] *
    x[n, ci, oh*sh - ph + kh*dh, ow*sw - pw + kw*dw] + bias[co])``, zero outside ``x``.

    Per image it is a GEMM with M = OH*OW output positions, N = C_out and
    K = C_in*KH*KW taps (no im2col matrix: a register tile's rows read ``x`` at each
    position's window). ``inputs`` are ``(x base, weight panels[, bias][, residual base])``:

    * ``x`` is contiguous NCHW from ``x_offset``; with padding, the kernel copies each
      image into a zero-bordered ``[C_in, H + 2ph, W + 2pw]`` workspace first;
    * the weight ``W`` viewed as ``[C_out, K]`` is packed at build time into GEMM panels
      (the backend's ``gemm_panels`` transform), the bias padded like a GEMM's (``gemm_bias``);
    * ``residual`` (epilogues ``add``, ``add_relu``) is contiguous like ``out``, from
      ``residual_offset``.

    ``outputs`` is the contiguous ``out[N, C_out, OH, OW]``. ``kernel_id`` hashes the
    printed form with positional buffer names, so equal convolutions share it.
    """

    kind: ClassVar[str] = "conv2d"

    x_shape: tuple  # (N, C_in, H, W)
    c_out: int
    kernel_size: tuple  # (KH, KW)
    stride: tuple
    padding: tuple
    dilation: tuple
    inputs: tuple
    outputs: tuple
    epilogue: str = "none"
    has_bias: bool = False
    x_offset: int = 0
    residual_offset: int = 0
    panel: int = 16  # columns per weight panel: the backend's packing (``Backend.weight_transform``)

    @property
    def out_hw(self) -> tuple:
        """(OH, OW): ``(H + 2p - d*(k - 1) - 1) // s + 1`` per dimension (as torch's conv2d)."""
        return tuple((size + 2 * p - d * (k - 1) - 1) // s + 1 for size, p, d, k, s in
                     zip(self.x_shape[2:], self.padding, self.dilation, self.kernel_size, self.stride))

    @property
    def m(self) -> int:
        """Output positions per image, OH*OW (the GEMM's M)."""
        return math.prod(self.out_hw)

    @property
    def n(self) -> int:
        """Output channels (the GEMM's N)."""
        return self.c_out

    @property
    def k(self) -> int:
        """Taps per output, C_in*KH*KW (the GEMM's K)."""
        return self.x_shape[1] * math.prod(self.kernel_size)

    @property
    def panels(self) -> int:
        """Panels of the packed weight, ``ceil(c_out / panel)``."""
        return -(-self.c_out // self.panel)

    @property
    def flops(self) -> int:
        """Multiply-adds counted twice: ``2 * N * M * C_out * K``."""
        return 2 * self.x_shape[0] * self.m * self.n * self.k

    @property
    def padded_bytes(self) -> int:
        """Bytes of one zero-bordered image (the workspace), 0 without padding."""
        if not any(self.padding):
            return 0
        (ph, pw), (c, h, w) = self.padding, self.x_shape[1:]
        return c * (h + 2 * ph) * (w + 2 * pw) * 4

    def describe(self) -> list[str]:
        """The printed form after ``kind name``: the convolution, its operands' layouts and its epilogue."""
        n, c, h, w = self.x_shape
        lines = [f"[n<{n}, m<{self.m}, n_out<{self.n}, k<{self.k}] kernel {list(self.kernel_size)} "
                 f"stride {list(self.stride)} padding {list(self.padding)} dilation {list(self.dilation)}",
                 f"  in0: float32 x[{n}, {c}, {h}, {w}] contiguous at {self.x_offset}",
                 f"  in1: float32 weight panels [{self.panels}, {self.k}, {self.panel}]"]
        if self.has_bias:
            lines.append(f"  in2: float32 bias [{self.panels * self.panel}]")
        return lines + conv_output_lines(self, "conv(x, weight)", self.n)


@dataclass(frozen=True, eq=False)
class WinogradConvKernel(TemplateKernel):
    """A 3x3, stride-1, dilation-1 convolution (float32, NCHW, groups 1) by Winograd's
    F(2x2, 3x3): ``out[n, co, oh, ow] = epilogue(conv(x, W)[n, co, oh, ow] + bias[co])``,
    the same result as ``ConvKernel`` up to rounding for finite inputs, with 16 multiplies per
    2x2 output tile and channel pair instead of 36. Not for infinities: the transforms add
    and subtract the elements of a 4x4 patch, so one +-inf in it gives NaN (inf - inf) in the
    tile's outputs where the direct convolution gives +-inf, and inputs near the float32
    range can overflow in them (NaN inputs give NaN where the direct form does).

    ``inputs`` are ``(x base, u[, bias][, residual base])``: ``x`` contiguous NCHW from
    ``x_offset``; ``u`` the filters transformed at build time (the backend's ``winograd`` transform:
    ``[16, C_in, C_out]``); the bias ``[C_out]``; the residual (epilogues ``add``,
    ``add_relu``) contiguous like ``out``, from ``residual_offset``. ``outputs`` is the
    contiguous ``out[N, C_out, OH, OW]``.
    """

    kind: ClassVar[str] = "winograd_conv2d"

    x_shape: tuple  # (N, C_in, H, W)
    c_out: int
    padding: tuple
    inputs: tuple
    outputs: tuple
    epilogue: str = "none"
    has_bias: bool = False
    x_offset: int = 0
    residual_offset: int = 0

    @property
    def out_hw(self) -> tuple:
        """(OH, OW) = (H + 2ph - 2, W + 2pw - 2)."""
        return tuple(size + 2 * p - 2 for size, p in zip(self.x_shape[2:], self.padding))

    @property
    def tiles(self) -> tuple:
        """(tile rows, tile columns) of 2x2 output tiles per image."""
        return tuple(-(-size // 2) for size in self.out_hw)

    @property
    def flops(self) -> int:
        """The direct convolution's multiply-adds counted twice, ``2 * N * OH*OW * C_out * C_in * 9``
        (what the kernel computes, so GFLOPS compare with ``ConvKernel``'s)."""
        n, c = self.x_shape[:2]
        return 2 * n * math.prod(self.out_hw) * self.c_out * c * 9

    def describe(self) -> list[str]:
        """The printed form after ``kind name``: the convolution, its operands' layouts and its epilogue."""
        n, c, h, w = self.x_shape
        lines = [f"F(2x2,3x3) [n<{n}, tiles<{self.tiles[0]}x{self.tiles[1]}, c_out<{self.c_out}, "
                 f"c_in<{c}] padding {list(self.padding)}",
                 f"  in0: float32 x[{n}, {c}, {h}, {w}] contiguous at {self.x_offset}",
                 f"  in1: float32 transformed weight u[16, {c}, {self.c_out}]"]
        if self.has_bias:
            lines.append(f"  in2: float32 bias [{self.c_out}]")
        return lines + conv_output_lines(self, "conv3x3(x, weight)", self.c_out)


@dataclass(frozen=True, eq=False)
class BmmKernel(TemplateKernel):
    """A batched GEMM of two runtime operands: ``out[b, m, n] = sum_k a[b, m, k] * b[b, k, n]``,
    float32 (``aten.bmm``/``mm`` of attention: ``q @ k^T``, ``weights @ v``).

    Both operands are strided views read in place, every stride a compile-time constant:
    ``a`` at ``a_offset + (batch index . a_strides[:-2]) + m * a_strides[-2] + k * a_strides[-1]``
    and ``b`` likewise with ``b_strides`` (``k``, then ``n``). ``batch_shape`` holds the batch
    dimensions (one, or two where the view's batch does not collapse, e.g. batch x heads of a
    transposed projection); its product is the batch size. ``inputs`` are the operands' base
    buffers, once each: ``b_input`` is the index of ``b``'s (0 where ``a`` and ``b`` share one, as
    ``q`` and ``k`` slices of one qkv projection do). ``outputs`` is the contiguous ``out``
    ``[batch, M, N]`` (any shape of those elements: a 2-D ``mm`` result too). ``kernel_id`` hashes
    the printed form with positional buffer names, so equal attention layers share it.
    """

    kind: ClassVar[str] = "bmm"

    batch_shape: tuple
    m: int
    n: int
    k: int
    inputs: tuple
    outputs: tuple
    a_offset: int
    a_strides: tuple
    b_offset: int
    b_strides: tuple
    b_input: int = 1
    panel: int = 16  # columns per weight panel: the backend's packing (``Backend.weight_transform``)

    @property
    def batch(self) -> int:
        """Batch size, ``prod(batch_shape)``."""
        return math.prod(self.batch_shape)

    @property
    def panels(self) -> int:
        """Panels of 16 columns of ``b`` per batch, ``ceil(n / panel)``."""
        return -(-self.n // self.panel)

    @property
    def flops(self) -> int:
        """Multiply-adds counted twice: ``2 * batch * M * N * K``."""
        return 2 * self.batch * self.m * self.n * self.k

    def describe(self) -> list[str]:
        """The printed form after ``kind name``: the batched GEMM and its operands' layouts."""
        batch = ", ".join(f"b{d}<{s}" for d, s in enumerate(self.batch_shape))
        lines = [f"[{batch}, m<{self.m}, n<{self.n}, k<{self.k}]"]
        for name, index, offset, strides, inner in (("a", 0, self.a_offset, self.a_strides, "m, k"),
                                                    ("b", self.b_input, self.b_offset, self.b_strides, "k, n")):
            terms = [f"b{d}*{s}" for d, s in enumerate(strides[:-2])]
            terms += [f"{v}*{s}" for v, s in zip(inner.split(", "), strides[-2:])]
            lines.append(f"  in{index}: float32 {name}[b, {inner}] at {offset} + {' + '.join(terms)}")
        lines.append(f"  out0: float32[{self.batch}, {self.m}, {self.n}] = a @ b")
        return lines


@dataclass(frozen=True)
class AttentionOperand:
    """One strided runtime tensor of an ``AttentionKernel``: ``inputs[input]`` read at
    ``offset + (batch index . strides[:-2]) + row * strides[-2] + column * strides[-1]``,
    its batch index unravelled row-major over ``batch_shape`` (a mask's own batch dimensions,
    0 strides where it broadcasts)."""

    input: int
    offset: int
    batch_shape: tuple
    strides: tuple


@dataclass(frozen=True)
class ScoreOp:
    """One step of the scores' epilogue, in the graph's order: ``mul``/``div`` by ``value``;
    ``add`` the float32 ``mask`` (``[batch, m, n]``); ``fill``: ``value`` where the bool ``mask``
    is true (``where(mask, value, s)``)."""

    kind: str
    value: float = 0.0
    mask: AttentionOperand | None = None

    def format(self) -> str:
        """The op as text (part of the kernel's printed form)."""
        if self.mask is None:
            return f"s = s {'*' if self.kind == 'mul' else '/'} {self.value!r}"
        m = self.mask
        terms = [f"b{d}*{s}" for d, s in enumerate(m.strides[:-2])] + [f"m*{m.strides[-2]}", f"n*{m.strides[-1]}"]
        at = f"in{m.input}[{'x'.join(map(str, m.batch_shape))}] at {m.offset} + {' + '.join(terms)}"
        return f"s = s + {at}" if self.kind == "add" else f"s = where({at}, {self.value!r}, s)"


@dataclass(frozen=True, eq=False)
class AttentionKernel(TemplateKernel):
    """Scaled-dot-product attention of runtime operands, float32, the scores never stored:
    ``out[b, m, :] = softmax_n(ops(q[b, m, :] . k[b, n, :])) @ v[b, n, :]`` (``attention_lowering``:
    ``bmm``, scale, masks, the decomposed softmax and ``bmm`` of one attention block).

    ``q`` (``[batch, m, d]``), ``k`` (``[batch, n, d]``, not transposed) and ``v``
    (``[batch, n, dv]``) are ``AttentionOperand``s over ``batch_shape`` (one dimension, or two
    where a head view's batch does not collapse); ``ops`` are the ``ScoreOp``s applied to each
    score before the softmax over ``n``. ``inputs`` are the base buffers, once each; ``outputs``
    the contiguous ``out`` ``[batch, m, dv]``. ``kernel_id`` hashes the printed form with
    positional buffer names, so equal attention layers share it.
    """

    kind: ClassVar[str] = "attention"

    batch_shape: tuple
    m: int
    n: int
    d: int
    dv: int
    inputs: tuple
    outputs: tuple
    q: AttentionOperand
    k: AttentionOperand
    v: AttentionOperand
    ops: tuple = ()

    @property
    def batch(self) -> int:
        """Batch size (batch x heads), ``prod(batch_shape)``."""
        return math.prod(self.batch_shape)

    @property
    def flops(self) -> int:
        """Multiply-adds of both products counted twice: ``2 * batch * m * n * (d + dv)``."""
        return 2 * self.batch * self.m * self.n * (self.d + self.dv)

    def describe(self) -> list[str]:
        """The printed form after ``kind name``: shapes, operand layouts and the score ops."""
        batch = ", ".join(f"b{d}<{s}" for d, s in enumerate(self.batch_shape))
        lines = [f"[{batch}, m<{self.m}, n<{self.n}, d<{self.d}, dv<{self.dv}]"]
        for label, operand, inner in (("q", self.q, "m, d"), ("k", self.k, "n, d"), ("v", self.v, "n, dv")):
            terms = [f"b{d}*{s}" for d, s in enumerate(operand.strides[:-2])]
            terms += [f"{v}*{s}" for v, s in zip(inner.split(", "), operand.strides[-2:])]
            lines.append(f"  in{operand.input}: float32 {label}[b, {inner}] at {operand.offset} + {' + '.join(terms)}")
        lines.extend(f"  {op.format()}" for op in self.ops)
        lines.append(f"  out0: float32[{self.batch}, {self.m}, {self.dv}] = softmax_n(s) @ v")
        return lines


@dataclass(frozen=True, eq=False)
class DepthwiseConvKernel(TemplateKernel):
    """A depthwise 2-D convolution template kernel, float32, NCHW:
    ``out[n, c, oh, ow] = epilogue(bias[c] + sum_{kh, kw} W[c, 0, kh, kw] *
    x[n, c, oh*stride_h - pad_h + kh*dilation_h, ow*stride_w - pad_w + kw*dilation_w])``,
    taps outside the input reading zero (groups == C_in == C_out, one filter per channel).

    ``inputs`` are ``(x base, weight[, bias base])``:

    * ``x`` is read at ``x_offset + n*s0 + c*s1 + h*s2 + w*s3`` for ``x_strides`` (s0..s3,
      elements), any layout;
    * the weight ``W[C, 1, KH, KW]`` (a whole constant) at ``c*w0 + kh*w2 + kw*w3`` for
      ``weight_strides`` (w0..w3);
    * the bias, when there is one, at ``bias_offset + c*bias_stride``.

    ``outputs`` is the contiguous ``out[N, C, OH, OW]``. Like ``GemmKernel``, ``kernel_id``
    hashes the printed form with positional buffer names, so equal convs share it.
    """

    kind: ClassVar[str] = "depthwise_conv"

    batch: int
    channels: int
    in_hw: tuple  # (H, W)
    out_hw: tuple  # (OH, OW)
    kernel_hw: tuple  # (KH, KW)
    stride: tuple
    padding: tuple
    dilation: tuple
    inputs: tuple
    outputs: tuple
    epilogue: str = "none"
    has_bias: bool = False
    x_offset: int = 0
    x_strides: tuple = ()
    weight_strides: tuple = ()
    bias_offset: int = 0
    bias_stride: int = 1

    @property
    def flops(self) -> int:
        """Multiply-adds counted twice: ``2 * N * C * OH * OW * KH * KW``."""
        return 2 * self.batch * self.channels * math.prod(self.out_hw) * math.prod(self.kernel_hw)

    def describe(self) -> list[str]:
        """The printed form after ``kind name``: the convolution, its operands' layouts and its epilogue."""
        (kh, kw), (oh, ow) = self.kernel_hw, self.out_hw
        s = self.x_strides
        lines = [f"[n<{self.batch}, c<{self.channels}, oh<{oh}, ow<{ow}; kh<{kh}, kw<{kw}] "
                 f"stride {list(self.stride)} padding {list(self.padding)} dilation {list(self.dilation)}",
                 f"  in0: float32 x[n, c, {self.in_hw[0]}, {self.in_hw[1]}] at {self.x_offset} + "
                 f"n*{s[0]} + c*{s[1]} + h*{s[2]} + w*{s[3]}",
                 f"  in1: float32 weight[{self.channels}, 1, {kh}, {kw}] strides {list(self.weight_strides)}"]
        if self.has_bias:
            lines.append(f"  in2: float32 bias[c] at {self.bias_offset} + c*{self.bias_stride}")
        y = "depthwise_conv(x, weight)" + (" + bias" if self.has_bias else "")
        lines.append(f"  out0: float32[{self.batch}, {self.channels}, {oh}, {ow}] = "
                     f"{DEPTHWISE_EPILOGUES[self.epilogue].text} where y = {y}")
        return lines
