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
from typing import TYPE_CHECKING, Iterator, Union

import torch

from aotpack.ir.index import Index

if TYPE_CHECKING:
    from aotpack.ir.graph import Buffer


@dataclass(frozen=True)
class Load:
    """``buffer[index]``: ``index`` is the element offset (strides already applied)."""

    buffer: "Buffer"
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


def input_buffers(exprs) -> list[Buffer]:
    """Buffers the expressions load, in first-use (evaluation) order."""
    found: list[Buffer] = []
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


# ----------------------------------------------------------------------------- GEMM kernel

#: Columns per panel of a GEMM template's packed weight (``GemmKernel``): 16 float32 are
#: two 256-bit or one 512-bit vector, so one k step of a panel is one or two vector loads.
GEMM_PANEL = 16

#: The epilogues a GEMM template applies to ``y = x @ W^T + bias`` (names as oneDNN's
#: post-ops, which ``gemm_match`` finds): the formula each computes, as eager decomposes it.
GEMM_EPILOGUES = {
    "none": "y",
    "relu": "relu(y)",
    "gelu": "(y * 0.5) * (erf(y * sqrt(0.5)) + 1)",
    "tanh": "tanh(y)",
    "sigmoid": "sigmoid(y)",
    "swish": "y * sigmoid(y)",
    "hardswish": "y * clamp(y + 3, 0, 6) / 6",
    "hardsigmoid": "clamp(y + 3, 0, 6) / 6",
    "add": "y + residual",
}


@dataclass(frozen=True, eq=False)
class GemmKernel:
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

    name: str
    base_name: str
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
    panel: int = GEMM_PANEL

    @property
    def panels(self) -> int:
        """Panels of the packed weight, ``ceil(n / panel)``."""
        return -(-self.n // self.panel)

    @property
    def flops(self) -> int:
        """Multiply-adds counted twice: ``2 * M * N * K``."""
        return 2 * self.m * self.n * self.k

    @property
    def kernel_id(self) -> str:
        """sha256 (24 hex digits) of the printed kernel, buffer names positional."""
        return hashlib.sha256(self.format(with_name=False).encode()).hexdigest()[:24]

    def format(self, with_name: bool = True) -> str:
        """The kernel as text: the GEMM, its operands' layouts and its epilogue."""
        head = f"gemm {self.name}" if with_name else "gemm"
        lines = [f"{head} [m<{self.m}, n<{self.n}, k<{self.k}]",
                 f"  in0: float32 a[m, k] at {self.a_offset} + m*{self.a_row_stride} + k",
                 f"  in1: float32 weight panels [{self.panels}, {self.k}, {self.panel}]"]
        if self.has_bias:
            lines.append(f"  in2: float32 bias [{self.panels * self.panel}]")
        if self.epilogue == "add":
            lines.append(f"  in{len(self.inputs) - 1}: float32 residual[m, n] at {self.residual_offset} + "
                         f"m*{self.residual_row_stride} + n")
        y = "a @ weight" + (" + bias" if self.has_bias else "")
        lines.append(f"  out0: float32[{self.m}, {self.n}] = {GEMM_EPILOGUES[self.epilogue]} where y = {y}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


#: The epilogues of a convolution template (``ConvKernel``): the GEMM's, less GELU (no CNN
#: here uses it after a conv), plus ``add_relu``, ResNet's ``relu(conv + residual)``.
CONV_EPILOGUES = {name: text for name, text in GEMM_EPILOGUES.items() if name != "gelu"}
CONV_EPILOGUES["add_relu"] = "relu(y + residual)"


def conv_output_lines(kernel, conv: str, c_out: int) -> list[str]:
    """The printed form's residual input (epilogues ``add``, ``add_relu``) and output lines of
    a dense convolution kernel (``ConvKernel``, ``WinogradConvKernel``); ``conv`` names the
    convolution in the output's formula."""
    n = kernel.x_shape[0]
    oh, ow = kernel.out_hw
    lines = []
    if kernel.epilogue in ("add", "add_relu"):
        lines.append(f"  in{len(kernel.inputs) - 1}: float32 residual[{n}, {c_out}, {oh}, {ow}] contiguous "
                     f"at {kernel.residual_offset}")
    y = conv + (" + bias" if kernel.has_bias else "")
    return lines + [f"  out0: float32[{n}, {c_out}, {oh}, {ow}] = {CONV_EPILOGUES[kernel.epilogue]} where y = {y}"]


@dataclass(frozen=True, eq=False)
class ConvKernel:
    """A direct 2-D convolution template kernel, float32, NCHW, groups 1:
    ``out[n, co, oh, ow] = epilogue(sum over ci, kh, kw of W[co, ci, kh, kw] *
    x[n, ci, oh*sh - ph + kh*dh, ow*sw - pw + kw*dw] + bias[co])``, zero outside ``x``.

    Per image it is a GEMM with M = OH*OW output positions, N = C_out and
    K = C_in*KH*KW taps (no im2col matrix: a register tile's rows read ``x`` at each
    position's window). ``inputs`` are ``(x base, weight panels[, bias][, residual base])``:

    * ``x`` is contiguous NCHW from ``x_offset``; with padding, the kernel copies each
      image into a zero-bordered ``[C_in, H + 2ph, W + 2pw]`` workspace first;
    * the weight ``W`` viewed as ``[C_out, K]`` is packed at build time into GEMM panels
      (``pack_panels``), the bias padded like a GEMM's (``pad_bias``);
    * ``residual`` (epilogues ``add``, ``add_relu``) is contiguous like ``out``, from
      ``residual_offset``.

    ``outputs`` is the contiguous ``out[N, C_out, OH, OW]``. ``kernel_id`` hashes the
    printed form with positional buffer names, so equal convolutions share it.
    """

    name: str
    base_name: str
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
    panel: int = GEMM_PANEL

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

    @property
    def kernel_id(self) -> str:
        """sha256 (24 hex digits) of the printed kernel, buffer names positional."""
        return hashlib.sha256(self.format(with_name=False).encode()).hexdigest()[:24]

    def format(self, with_name: bool = True) -> str:
        """The kernel as text: the convolution, its operands' layouts and its epilogue."""
        head = f"conv2d {self.name}" if with_name else "conv2d"
        n, c, h, w = self.x_shape
        lines = [f"{head} [n<{n}, m<{self.m}, n_out<{self.n}, k<{self.k}] kernel {list(self.kernel_size)} "
                 f"stride {list(self.stride)} padding {list(self.padding)} dilation {list(self.dilation)}",
                 f"  in0: float32 x[{n}, {c}, {h}, {w}] contiguous at {self.x_offset}",
                 f"  in1: float32 weight panels [{self.panels}, {self.k}, {self.panel}]"]
        if self.has_bias:
            lines.append(f"  in2: float32 bias [{self.panels * self.panel}]")
        return "\n".join(lines + conv_output_lines(self, "conv(x, weight)", self.n))

    def __str__(self) -> str:
        return self.format()


def pack_panels(weight: torch.Tensor, panel: int = GEMM_PANEL) -> torch.Tensor:
    """``weight[N, K]`` as GEMM panels ``[ceil(N / panel), K, panel]`` (``GemmKernel``), contiguous."""
    n, k = weight.shape
    panels = -(-n // panel)
    padded = torch.zeros(panels * panel, k, dtype=weight.dtype)
    padded[:n] = weight
    return padded.view(panels, panel, k).transpose(1, 2).contiguous()


def pad_bias(bias: torch.Tensor, panel: int = GEMM_PANEL) -> torch.Tensor:
    """``bias[N]`` zero-padded to ``ceil(N / panel) * panel`` (``GemmKernel``)."""
    n = bias.shape[0]
    padded = torch.zeros(-(-n // panel) * panel, dtype=bias.dtype)
    padded[:n] = bias
    return padded


#: Winograd F(2x2, 3x3) transforms (Lavin & Gray 2016): a 2x2 output tile is
#: ``A^T [(G g G^T) . (B^T d B)] A`` for the 3x3 filter g and the 4x4 input patch d.
WINOGRAD_G = ((1.0, 0.0, 0.0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0.0, 0.0, 1.0))


def winograd_weights(weight: torch.Tensor) -> torch.Tensor:
    """``weight[C_out, C_in, 3, 3]`` (float32) transformed for ``WinogradConvKernel``:
    ``u[xi, ci, co] = (G g G^T)[xi]`` of the filter ``g = W[co, ci]`` (``xi = 4a + b``,
    ``WINOGRAD_G``), ``[16, C_in, C_out]`` float32, contiguous; computed in float64."""
    g = torch.tensor(WINOGRAD_G, dtype=torch.float64)
    u = g @ weight.to(torch.float64) @ g.T  # [C_out, C_in, 4, 4]
    return u.permute(2, 3, 1, 0).reshape(16, weight.shape[1], weight.shape[0]).to(torch.float32).contiguous()


@dataclass(frozen=True, eq=False)
class WinogradConvKernel:
    """A 3x3, stride-1, dilation-1 convolution (float32, NCHW, groups 1) by Winograd's
    F(2x2, 3x3): ``out[n, co, oh, ow] = epilogue(conv(x, W)[n, co, oh, ow] + bias[co])``,
    the same result as ``ConvKernel`` up to rounding for finite inputs, with 16 multiplies per
    2x2 output tile and channel pair instead of 36. Not for infinities: the transforms add
    and subtract the elements of a 4x4 patch, so one +-inf in it gives NaN (inf - inf) in the
    tile's outputs where the direct convolution gives +-inf, and inputs near the float32
    range can overflow in them (NaN inputs give NaN where the direct form does).

    ``inputs`` are ``(x base, u[, bias][, residual base])``: ``x`` contiguous NCHW from
    ``x_offset``; ``u`` the filters transformed at build time (``winograd_weights``:
    ``[16, C_in, C_out]``); the bias ``[C_out]``; the residual (epilogues ``add``,
    ``add_relu``) contiguous like ``out``, from ``residual_offset``. ``outputs`` is the
    contiguous ``out[N, C_out, OH, OW]``.
    """

    name: str
    base_name: str
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

    @property
    def kernel_id(self) -> str:
        """sha256 (24 hex digits) of the printed kernel, buffer names positional."""
        return hashlib.sha256(self.format(with_name=False).encode()).hexdigest()[:24]

    def format(self, with_name: bool = True) -> str:
        """The kernel as text: the convolution, its operands' layouts and its epilogue."""
        head = f"winograd_conv2d {self.name}" if with_name else "winograd_conv2d"
        n, c, h, w = self.x_shape
        lines = [f"{head} F(2x2,3x3) [n<{n}, tiles<{self.tiles[0]}x{self.tiles[1]}, c_out<{self.c_out}, "
                 f"c_in<{c}] padding {list(self.padding)}",
                 f"  in0: float32 x[{n}, {c}, {h}, {w}] contiguous at {self.x_offset}",
                 f"  in1: float32 transformed weight u[16, {c}, {self.c_out}]"]
        if self.has_bias:
            lines.append(f"  in2: float32 bias [{self.c_out}]")
        return "\n".join(lines + conv_output_lines(self, "conv3x3(x, weight)", self.c_out))

    def __str__(self) -> str:
        return self.format()


# ----------------------------------------------------------------------------- batched GEMM kernel


@dataclass(frozen=True, eq=False)
class BmmKernel:
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

    name: str
    base_name: str
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
    panel: int = GEMM_PANEL

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

    @property
    def kernel_id(self) -> str:
        """sha256 (24 hex digits) of the printed kernel, buffer names positional."""
        return hashlib.sha256(self.format(with_name=False).encode()).hexdigest()[:24]

    def format(self, with_name: bool = True) -> str:
        """The kernel as text: the batched GEMM and its operands' layouts."""
        head = f"bmm {self.name}" if with_name else "bmm"
        batch = ", ".join(f"b{d}<{s}" for d, s in enumerate(self.batch_shape))
        lines = [f"{head} [{batch}, m<{self.m}, n<{self.n}, k<{self.k}]"]
        for name, index, offset, strides, inner in (("a", 0, self.a_offset, self.a_strides, "m, k"),
                                                    ("b", self.b_input, self.b_offset, self.b_strides, "k, n")):
            terms = [f"b{d}*{s}" for d, s in enumerate(strides[:-2])]
            terms += [f"{v}*{s}" for v, s in zip(inner.split(", "), strides[-2:])]
            lines.append(f"  in{index}: float32 {name}[b, {inner}] at {offset} + {' + '.join(terms)}")
        lines.append(f"  out0: float32[{self.batch}, {self.m}, {self.n}] = a @ b")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


# ----------------------------------------------------------------------------- fused attention kernel


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
class AttentionKernel:
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

    name: str
    base_name: str
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

    @property
    def kernel_id(self) -> str:
        """sha256 (24 hex digits) of the printed kernel, buffer names positional."""
        return hashlib.sha256(self.format(with_name=False).encode()).hexdigest()[:24]

    def format(self, with_name: bool = True) -> str:
        """The kernel as text: shapes, operand layouts and the score ops."""
        head = f"attention {self.name}" if with_name else "attention"
        batch = ", ".join(f"b{d}<{s}" for d, s in enumerate(self.batch_shape))
        lines = [f"{head} [{batch}, m<{self.m}, n<{self.n}, d<{self.d}, dv<{self.dv}]"]
        for label, operand, inner in (("q", self.q, "m, d"), ("k", self.k, "n, d"), ("v", self.v, "n, dv")):
            terms = [f"b{d}*{s}" for d, s in enumerate(operand.strides[:-2])]
            terms += [f"{v}*{s}" for v, s in zip(inner.split(", "), operand.strides[-2:])]
            lines.append(f"  in{operand.input}: float32 {label}[b, {inner}] at {operand.offset} + {' + '.join(terms)}")
        lines.extend(f"  {op.format()}" for op in self.ops)
        lines.append(f"  out0: float32[{self.batch}, {self.m}, {self.dv}] = softmax_n(s) @ v")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


# ----------------------------------------------------------------------------- depthwise conv

#: The epilogues a depthwise convolution template applies to ``y = conv(x, W) + bias`` (names
#: as oneDNN's post-ops, which ``gemm_match`` finds), each as eager decomposes it.
DEPTHWISE_EPILOGUES = {
    "none": "y",
    "relu": "relu(y)",
    "hardswish": "y * clamp(y + 3, 0, 6) / 6",
    "hardsigmoid": "clamp(y + 3, 0, 6) / 6",
    "sigmoid": "sigmoid(y)",
    "swish": "y * sigmoid(y)",
}


@dataclass(frozen=True, eq=False)
class DepthwiseConvKernel:
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

    name: str
    base_name: str
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

    @property
    def kernel_id(self) -> str:
        """sha256 (24 hex digits) of the printed kernel, buffer names positional."""
        return hashlib.sha256(self.format(with_name=False).encode()).hexdigest()[:24]

    def format(self, with_name: bool = True) -> str:
        """The kernel as text: the convolution, its operands' layouts and its epilogue."""
        (kh, kw), (oh, ow) = self.kernel_hw, self.out_hw
        head = f"depthwise_conv {self.name}" if with_name else "depthwise_conv"
        s = self.x_strides
        lines = [f"{head} [n<{self.batch}, c<{self.channels}, oh<{oh}, ow<{ow}; kh<{kh}, kw<{kw}] "
                 f"stride {list(self.stride)} padding {list(self.padding)} dilation {list(self.dilation)}",
                 f"  in0: float32 x[n, c, {self.in_hw[0]}, {self.in_hw[1]}] at {self.x_offset} + "
                 f"n*{s[0]} + c*{s[1]} + h*{s[2]} + w*{s[3]}",
                 f"  in1: float32 weight[{self.channels}, 1, {kh}, {kw}] strides {list(self.weight_strides)}"]
        if self.has_bias:
            lines.append(f"  in2: float32 bias[c] at {self.bias_offset} + c*{self.bias_stride}")
        y = "depthwise_conv(x, weight)" + (" + bias" if self.has_bias else "")
        lines.append(f"  out0: float32[{self.batch}, {self.channels}, {oh}, {ow}] = "
                     f"{DEPTHWISE_EPILOGUES[self.epilogue]} where y = {y}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()
