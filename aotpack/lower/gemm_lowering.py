"""Lower one ``gemm_match.GemmMatch`` into a ``gemm.GemmStep`` with its variants.

The ATen variant is the match lowered as aotpack always did (the ATen call, then the
epilogue realised by a fused kernel); the backend chooses which variants a match gets
(``Backend.gemm_variants``: extern library calls, aotpack's template kernels built here),
each writing the same output buffer, so later steps never know which one ran.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from aotpack.ir.gemm import GemmStep, GemmVariant, PackedWeight
from aotpack.ir.graph import Buffer, ExternArg, ExternCall, KernelCall, contiguous_strides
from aotpack.ir.template_kernels import ConvKernel, DepthwiseConvKernel, GemmKernel, WinogradConvKernel
from aotpack.ir.epilogues import CONV_EPILOGUES, DEPTHWISE_EPILOGUES, GEMM_EPILOGUES



@dataclass(frozen=True)
class GemmOperands:
    """What a backend's ``gemm_variants`` builds a matched linear/convolution's variants from:
    ``x`` (view parts ``(base, shape, strides, offset)``), ``weight`` (a constant ``Buffer``),
    ``bias``/``other`` (view parts of the bias and the residual, or None), ``out`` (the
    epilogue's output buffer, contiguous), ``gemm_out`` (the ATen call's result buffer) and
    ``aten_steps`` (the ATen call, then its epilogue kernels: the ``aten`` variant's steps)."""

    x: tuple
    weight: Buffer
    bias: tuple | None
    other: tuple | None
    out: Buffer
    gemm_out: Buffer
    aten_steps: list


def whole(buf: Buffer) -> tuple:
    """View parts ``(buf, shape, strides, 0)`` of all of ``buf``."""
    return buf, buf.shape, buf.strides, 0


def tensor_arg(parts) -> ExternArg:
    """An extern call's tensor argument: the view ``parts``."""
    return ExternArg("tensor", parts)


def optional_arg(parts) -> ExternArg:
    """An extern call's optional tensor argument: the view ``parts``, or None."""
    return ExternArg("none", None) if parts is None else ExternArg("tensor", parts)


def rows_view(parts: tuple, leading: tuple) -> tuple | None:
    """The 2-D view ``parts`` (M x K) with its rows split as ``leading`` (prod = M)."""
    base, (m, k), (row_stride, col_stride), offset = parts
    if math.prod(leading) != m:
        return None
    strides = tuple(s * row_stride for s in contiguous_strides(leading))
    return base, tuple(leading) + (k,), strides + (col_stride,), offset


def lower(lw, m):
    """The match's value: the output buffer of a new ``GemmStep`` appended to ``lw.steps``,
    or (when the shapes do not fit) the plainly lowered value.

    Args:
        lw: the ``lowering.Lowerer`` (its steps, kernels, counter and packed weights grow).
        m: the ``GemmMatch`` whose last node is being lowered.
    """
    weight = lw.env[m.weight]
    if not (isinstance(weight, Buffer) and weight.kind == "constant"):
        return lw.lower_nodes(m.nodes)
    x = lw.read_parts(lw.operand(m.x))
    bias = lw.strided(lw.operand(m.bias)) if m.bias is not None else None
    other = lw.strided(lw.operand(m.residual)) if m.residual is not None else None
    replaced = ()
    if m.batch_norm is not None:
        folded = _fold_batch_norm(lw, m, weight, bias)
        if folded is None:
            return lw.lower_nodes(m.nodes)
        weight, bias, replaced = folded
    outer, lw.steps = lw.steps, []
    result = lw.lower_nodes(m.nodes) if m.batch_norm is None else _lower_folded_conv(lw, m, x, weight, bias)
    out_parts = lw.strided(result)
    aten_steps, lw.steps = lw.steps, outer
    out, gemm_out = out_parts[0], lw.env[m.gemm]
    fits = (out_parts == whole(out) and out.strides == contiguous_strides(out.shape)
            and isinstance(gemm_out, Buffer) and aten_steps and isinstance(aten_steps[0], ExternCall)
            and aten_steps[0].outputs == [gemm_out])
    variants = lw.backend.gemm_variants(lw, m, GemmOperands(x, weight, bias, other, out, gemm_out, aten_steps)) \
        if fits else None
    if not variants:
        lw.steps.extend(aten_steps)
        return result
    if all(v.name != "aten" for v in variants):  # its epilogue kernel is never launched: not compiled
        dropped = {id(s.kernel) for s in aten_steps if isinstance(s, KernelCall)}
        lw.kernels[:] = [k for k in lw.kernels if id(k) not in dropped]
    if m.kind == "linear":
        shape = f"{x[1][0]}x{x[1][1]}x{weight.shape[0]}"
    else:
        shape = f"{list(x[1])}*{list(weight.shape)}"
    lw.steps.append(GemmStep(f"{m.kind}_{m.gemm.name}_{m.epilogue}", m.kind, shape, m.epilogue, variants, out,
                             replaced=replaced))
    return result


def _constant_values(lw, parts: tuple | None) -> torch.Tensor | None:
    """The build-time values of a view of a constant (None for None)."""
    if parts is None:
        return None
    base, shape, strides, offset = parts
    return torch.as_strided(lw.constant_tensors[base.name], shape, strides, offset)


def _fold_batch_norm(lw, m, weight: Buffer, bias: tuple | None) -> tuple | None:
    """(folded weight, folded bias view, constants they replace) of a convolution followed
    by an eval-mode batch norm, or None when a statistic or the bias is not a constant.

    ``BN(conv(x, W) + b) = conv(x, W * s) + (b - mean) * s + beta`` with
    ``s = gamma / sqrt(var + eps)`` per output channel (the standard inference-time
    folding), computed in float64 and stored as float32.
    """
    bn = m.batch_norm
    stats = [lw.env[a] if a is not None else None for a in bn.args[1:5]]
    if any(s is not None and not (isinstance(s, Buffer) and s.kind == "constant") for s in stats):
        return None
    if bias is not None and bias[0].kind != "constant":
        return None
    gamma, beta, mean, var = (lw.constant_tensors[s.name].double() if s is not None else None for s in stats)
    eps = float(bn.args[6]) if len(bn.args) > 6 else 1e-5
    scale = (var + eps).rsqrt() * (gamma if gamma is not None else 1.0)
    dense = lw.constant_tensors[weight.name].double()
    shift = (_constant_values(lw, bias).double() if bias is not None else torch.zeros_like(mean)) - mean
    folded_bias = shift * scale + (beta if beta is not None else 0.0)
    norm = stats[2].name.removesuffix(".running_mean")  # the batch norm module's name: "layer1.bn1"
    folded = _constant(lw, f"{weight.name}.folded_{norm}",
                       (dense * scale.view(-1, *[1] * (dense.dim() - 1))).float().contiguous())
    new_bias = _constant(lw, f"{norm}.folded_bias", folded_bias.float().contiguous())
    replaced = tuple(b for b in [weight, *stats, bias[0] if bias is not None else None] if b is not None)
    return folded, whole(new_bias), replaced


def _lower_folded_conv(lw, m, x, weight: Buffer, bias: tuple):
    """The ATen form of a batch-norm-folded convolution: ``aten.convolution`` on the
    folded weight and bias, then the epilogue nodes lowered as usual."""
    stride, padding, dilation, transposed, output_padding, groups = m.gemm.args[3:9]
    val = m.gemm.meta["val"]
    lw.counter += 1
    gemm_out = Buffer(f"buf{lw.counter}", tuple(val.shape), tuple(val.stride()), val.dtype, "extern")
    lw.steps.append(ExternCall(torch.ops.aten.convolution.default,
                               [tensor_arg(x), tensor_arg(whole(weight)), tensor_arg(bias),
                                ExternArg("int_list", list(stride)), ExternArg("int_list", list(padding)),
                                ExternArg("int_list", list(dilation)), ExternArg("bool", bool(transposed)),
                                ExternArg("int_list", list(output_padding)), ExternArg("int", int(groups))],
                               [gemm_out]))
    lw.env[m.gemm] = gemm_out
    lw.env[m.batch_norm] = (gemm_out, None, None)  # its getitem 0 reads the folded result
    return lw.lower_nodes(list(m.nodes[m.nodes.index(m.batch_norm) + 1:]))


def packed_weight(lw, weight: Buffer, op, extra: list) -> PackedWeight:
    """A weight an extern library packs at load (``op(weight, *extra)``, an opaque tensor),
    appended to ``lw.packed``."""
    buf = Buffer(f"packed{len(lw.packed)}_{weight.name}", weight.shape, weight.strides, weight.dtype, "packed")
    packed = PackedWeight(buf, op, [tensor_arg(whole(weight)), *extra])
    lw.packed.append(packed)
    return packed


def _row_stride(parts: tuple) -> int | None:
    """The one row stride of ``parts`` seen as rows x its last dimension (unit column
    stride), or None when its leading dimensions do not collapse into rows."""
    _base, shape, strides, _offset = parts
    if not shape or strides[-1] != 1 and shape[-1] != 1:
        return None
    if len(shape) == 1:
        return shape[0]
    for k in range(len(shape) - 2):
        if shape[k] != 1 and strides[k] != strides[k + 1] * shape[k + 1]:
            return None
    return strides[-2]


def _constant(lw, name: str, tensor: torch.Tensor) -> Buffer:
    """A constant computed at build time (packed panels): shipped in the weights like any other.

    Equal values under one name are shared (a weight read by two steps packs once); other
    values under a name already taken (a shared batch norm after two convolutions with their
    own biases, two linears on different slices of one bias) get ``<name>@<k>``."""
    base, k = name, 1
    while name in lw.constant_tensors and not _same_values(lw.constant_tensors[name], tensor):
        name, k = f"{base}@{k}", k + 1
    if name not in lw.constant_tensors:
        lw.constants.append(Buffer(name, tuple(tensor.shape), contiguous_strides(tensor.shape), tensor.dtype,
                                   "constant"))
        lw.constant_tensors[name] = tensor
    return next(b for b in lw.constants if b.name == name)


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def template_variant(lw, m, x, weight, bias, other, out) -> GemmVariant | None:
    """aotpack's own GEMM (``kernel_ir.GemmKernel``, its tilings tuned like any kernel's),
    the epilogue in its register tile, on weight panels packed now; None when the
    operands' layouts do not fit it (strided columns, a computed bias)."""
    epilogue = m.epilogue
    (rows, depth), row_stride = x[1], _row_stride(x)
    if epilogue not in GEMM_EPILOGUES or row_stride is None:
        return None
    if bias is not None and not (bias[0].kind == "constant" and bias[0].dtype == torch.float32):
        return None
    residual_stride = _row_stride(other) if other is not None else 0
    if residual_stride is None:
        return None
    n = weight.shape[0]
    dense = lw.constant_tensors[weight.name]
    panels = _constant(lw, f"{weight.name}.gemm_panels", lw.pack_weight("gemm_panels", dense))
    inputs = [x[0], panels]
    if bias is not None:
        base, shape, strides, offset = bias
        values = torch.as_strided(lw.constant_tensors[base.name], shape, strides, offset).reshape(n)
        inputs.append(_constant(lw, f"{base.name}.gemm_bias", lw.pack_weight("gemm_bias", values)))
    if other is not None:
        inputs.append(other[0])
    # named by position, not lw.counter: offering the template renames no other buffer or kernel
    kernel = GemmKernel(f"gemm_{epilogue}_{len(lw.kernels)}", f"gemm_{epilogue}", rows, n, depth, tuple(inputs), (out,),
                        epilogue=epilogue, has_bias=bias is not None, a_offset=x[3], a_row_stride=row_stride,
                        residual_offset=other[3] if other is not None else 0,
                        residual_row_stride=residual_stride, panel=panels.shape[-1])
    lw.kernels.append(kernel)
    return GemmVariant("template", [KernelCall(kernel)], [],
                       panels=((panels, weight, lw.weight_transform("gemm_panels")),))


def _contiguous_from(parts: tuple) -> bool:
    """``parts`` is a dense row-major block of its base (any offset)."""
    _base, shape, strides, _offset = parts
    return all(st == want or size == 1 for size, st, want in zip(shape, strides, contiguous_strides(shape)))


def _bias_name(bias: tuple) -> str:
    """The padded bias constant's name: ``<bias>.conv_bias``, with the view's offset, size and
    stride where the bias is a part of its constant (two convolutions reading different slices
    of one constant must not share the first one's values)."""
    base, shape, strides, offset = bias
    whole = offset == 0 and tuple(shape) == tuple(base.shape) and tuple(strides) == tuple(base.strides)
    return f"{base.name}.conv_bias" if whole else f"{base.name}.conv_bias@{offset}:{list(shape)}:{list(strides)}"


def _dense_conv_applies(m, x, bias, other, out) -> bool:
    """Whether aotpack's dense (groups 1) convolution kernels, the direct template and
    Winograd, take this match: an epilogue they have, a contiguous 4-D ``x``, a residual laid
    out like ``out``, a constant bias."""
    groups = m.gemm.args[8]
    if groups != 1 or m.epilogue not in CONV_EPILOGUES or not _contiguous_from(x) or len(x[1]) != 4:
        return False
    if other is not None and (not _contiguous_from(other) or tuple(other[1]) != tuple(out.shape)):
        return False
    return bias is None or bias[0].kind == "constant"


def _dense_conv_inputs(lw, x, weight: Buffer, bias, other, c_out: int) -> tuple:
    """A dense convolution kernel's inputs: ``(x base, weight[, padded bias][, residual base])``."""
    inputs = [x[0], weight]
    if bias is not None:
        padded = lw.pack_weight("gemm_bias", _constant_values(lw, bias).reshape(c_out))
        inputs.append(_constant(lw, _bias_name(bias), padded))
    if other is not None:
        inputs.append(other[0])
    return tuple(inputs)


def conv_template_variant(lw, m, x, weight, bias, other, out) -> GemmVariant | None:
    """aotpack's own convolution (``kernel_ir.ConvKernel``, tuned like any kernel) on
    weight panels packed now; None when it does not apply (``_dense_conv_applies``)."""
    if not _dense_conv_applies(m, x, bias, other, out):
        return None
    stride, padding, dilation = m.gemm.args[3:6]
    dense = lw.constant_tensors[weight.name]
    c_out = dense.shape[0]
    panels = _constant(lw, f"{weight.name}.conv_panels", lw.pack_weight("gemm_panels", dense.reshape(c_out, -1)))
    kernel = ConvKernel(f"conv_{m.epilogue}_{len(lw.kernels)}", f"conv_{m.epilogue}", tuple(x[1]), c_out,
                        tuple(dense.shape[2:]), tuple(stride), tuple(padding), tuple(dilation),
                        _dense_conv_inputs(lw, x, panels, bias, other, c_out), (out,),
                        epilogue=m.epilogue, has_bias=bias is not None, x_offset=x[3],
                        residual_offset=other[3] if other is not None else 0, panel=panels.shape[-1])
    lw.kernels.append(kernel)
    return GemmVariant("template", [KernelCall(kernel)], [])


def depthwise_variant(lw, m, x, weight, bias, other, out) -> GemmVariant | None:
    """aotpack's own depthwise conv (``kernel_ir.DepthwiseConvKernel``, its tilings tuned
    like any kernel's), bias and epilogue fused, reading ``x`` and the dense weight as they
    are; None unless the conv is depthwise (groups == C_in == C_out, one filter each) with
    an epilogue the template has and a float32 bias."""
    stride, padding, dilation, _transposed, _output_padding, groups = m.gemm.args[3:9]
    (batch, channels, h, w), (c_out, per_group, kh, kw) = x[1], weight.shape
    depthwise = groups == channels == c_out and per_group == 1
    if other is not None or not depthwise or m.epilogue not in DEPTHWISE_EPILOGUES:
        return None
    if bias is not None and not (bias[0].dtype == torch.float32 and len(bias[1]) == 1):
        return None
    inputs = (x[0], weight) + ((bias[0],) if bias is not None else ())
    kernel = DepthwiseConvKernel(f"dwconv_{m.epilogue}_{len(lw.kernels)}", f"dwconv_{m.epilogue}", batch, channels,
                                 (h, w), tuple(out.shape[2:]), (kh, kw), tuple(stride), tuple(padding),
                                 tuple(dilation), inputs, (out,), epilogue=m.epilogue, has_bias=bias is not None,
                                 x_offset=x[3], x_strides=tuple(x[2]), weight_strides=tuple(weight.strides),
                                 bias_offset=bias[3] if bias is not None else 0,
                                 bias_stride=bias[2][0] if bias is not None else 1)
    lw.kernels.append(kernel)
    return GemmVariant("template", [KernelCall(kernel)], [])


#: A Winograd variant needs at least this many 2x2 output tiles per image: on fewer the
#: transformed weight (16/9 the dense one) streams for too little work (docs/measurements.md,
#: "Winograd needs enough tiles").
WINOGRAD_MIN_TILES = 32
#: ... and this many input channels: the transforms cost per element what the GEMM saves
#: per channel pair, so a thin layer gains nothing.
WINOGRAD_MIN_CHANNELS = 16


def winograd_variant(lw, m, x, weight, bias, other, out) -> GemmVariant | None:
    """aotpack's F(2x2, 3x3) Winograd convolution (``kernel_ir.WinogradConvKernel``) on
    filters transformed now (an input of +-inf gives NaN in the outputs its tiles reach, where
    the direct convolution gives +-inf: see that class); None unless the direct template would
    take it (``_dense_conv_applies``) and it is 3x3, stride 1, dilation 1, padding <= 2, with at
    least ``WINOGRAD_MIN_TILES`` output tiles and ``WINOGRAD_MIN_CHANNELS`` input channels."""
    stride, padding, dilation = m.gemm.args[3:6]
    if not _dense_conv_applies(m, x, bias, other, out):
        return None
    if tuple(weight.shape[2:]) != (3, 3) or tuple(stride) != (1, 1) or tuple(dilation) != (1, 1):
        return None
    (oh, ow) = out.shape[2:]
    if max(padding) > 2 or x[1][1] < WINOGRAD_MIN_CHANNELS or -(-oh // 2) * -(-ow // 2) < WINOGRAD_MIN_TILES:
        return None
    dense = lw.constant_tensors[weight.name]
    c_out = dense.shape[0]
    u = _constant(lw, f"{weight.name}.winograd", lw.pack_weight("winograd", dense))
    kernel = WinogradConvKernel(f"winograd_{m.epilogue}_{len(lw.kernels)}", f"winograd_{m.epilogue}", tuple(x[1]),
                                c_out, tuple(padding), _dense_conv_inputs(lw, x, u, bias, other, c_out), (out,),
                                epilogue=m.epilogue, has_bias=bias is not None, x_offset=x[3],
                                residual_offset=other[3] if other is not None else 0)
    lw.kernels.append(kernel)
    return GemmVariant("winograd", [KernelCall(kernel)], [])
