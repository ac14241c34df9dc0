"""The implementations the CPU backend offers for a matched linear or convolution
(``Backend.gemm_variants``), in timing order.

The ATen variant is the match lowered as aotpack always did; the others reuse its buffers:
``mkl`` writes the ATen call's result buffer and runs the same epilogue kernel, ``onednn``
writes the epilogue's output buffer directly (post-ops); aotpack's own templates (GEMM,
direct, depthwise and Winograd convolution) come from ``lower.gemm_lowering``:

* ``mkl`` (linear, where torch has MKL): ``mkl::_mkl_linear`` on an MKL-packed weight,
  then the same epilogue kernel as ``aten``;
* ``onednn``: ``mkldnn::_linear_pointwise`` / ``_convolution_pointwise`` on a oneDNN
  blocked weight, the bias and epilogue fused as post-ops (``.binary`` for a residual).

Their packed weights are blocked layouts oneDNN/MKL choose for the CPU they run on (its
ISA): the archive ships the dense weight and model.cpp packs it at load with the op the
build used. The GEMM template's panels are aotpack's own layout, packed at build time.

A convolution offers the ATen variant only when none of aotpack's own kernels (direct,
depthwise, Winograd) applies. ATen runs the same oneDNN convolution as the ``onednn``
variant, without the fused post-ops or the packed weight, and then its own epilogue
kernel: on ResNet-18 (21 convolutions) and MobileNetV3-Small (54) it never won, and its
epilogue kernels were 32 of MobileNetV3-Small's kernel compiles and wrappers (Zen 3).
"""
from __future__ import annotations

import torch

from aotpack.ir.gemm import GemmVariant
from aotpack.ir.graph import ExternArg, ExternCall
from aotpack.lower.gemm_lowering import (GemmOperands, conv_template_variant, depthwise_variant, optional_arg,
                                        packed_weight, rows_view, template_variant, tensor_arg, whole, winograd_variant)

mkldnn = torch.ops.mkldnn


def variants(lw, m, ops: GemmOperands) -> list | None:
    """The variants of the matched ``m`` (a ``gemm_match.GemmMatch``) on ``ops``, or None
    (lowered as its ATen call alone): a linear's ATen, MKL, oneDNN and GEMM template; a
    convolution's oneDNN and aotpack's kernels (ATen where none applies)."""
    if m.kind == "linear":
        return _linear_variants(lw, m, ops.x, ops.weight, ops.bias, ops.other, ops.out, ops.gemm_out, ops.aten_steps)
    if m.kind == "conv2d":
        return _conv_variants(lw, m, ops.x, ops.weight, ops.bias, ops.other, ops.out, ops.aten_steps)
    return None


def _linear_variants(lw, m, x, weight, bias, other, out, gemm_out, aten_steps) -> list | None:
    rows = x[1][0]
    x_nd = x if len(out.shape) == 2 else rows_view(x, out.shape[:-1])
    if x_nd is None or tuple(out.shape[:-1]) != tuple(x_nd[1][:-1]):
        return None
    variants = [GemmVariant("aten", aten_steps, [])]
    template = template_variant(lw, m, x, weight, bias, other, out)
    if torch._C.has_mkl:
        packed = packed_weight(lw, weight, torch.ops.mkl._mkl_reorder_linear_weight.default, [ExternArg("int", rows)])
        call = ExternCall(torch.ops.mkl._mkl_linear.default,
                          [tensor_arg(x), tensor_arg(whole(packed.buffer)), tensor_arg(whole(weight)),
                           optional_arg(bias), ExternArg("int", rows)], [gemm_out])
        variants.append(GemmVariant("mkl", [call, *aten_steps[1:]], [packed]))
    if torch.backends.mkldnn.is_available():
        variants.append(_onednn_linear(lw, m, rows, x_nd, weight, bias, other, out))
    return variants + ([template] if template is not None else [])


def _onednn_linear(lw, m, rows, x_nd, weight, bias, other, out) -> GemmVariant:
    """oneDNN's linear on a weight it packs at load, bias and epilogue as post-ops."""
    packed = packed_weight(lw, weight, mkldnn._reorder_linear_weight.default, [ExternArg("int", rows)])
    w = tensor_arg(whole(packed.buffer))
    if other is not None:
        call = ExternCall(mkldnn._linear_pointwise.binary,
                          [tensor_arg(x_nd), tensor_arg(other), w, optional_arg(bias), ExternArg("string", "add")],
                          [out])
    else:
        call = ExternCall(mkldnn._linear_pointwise.default,
                          [tensor_arg(x_nd), w, optional_arg(bias), ExternArg("string", m.unary or "none"),
                           ExternArg("int_list", []), _algorithm(m.unary)], [out])
    return GemmVariant("onednn", [call], [packed])


def _algorithm(unary: str | None) -> ExternArg:
    """oneDNN's GELU flavour: ``none`` is the erf form (the one torch's gelu decomposes to)."""
    return ExternArg("string", "none") if unary == "gelu" else ExternArg("none", None)


def _conv_variants(lw, m, x, weight, bias, other, out, aten_steps) -> list | None:
    stride, padding, dilation, _transposed, output_padding, groups = m.gemm.args[3:9]
    if any(output_padding) or len(stride) != 2 or not torch.backends.mkldnn.is_available():
        return None
    ints = [ExternArg("int_list", list(padding)), ExternArg("int_list", list(stride)),
            ExternArg("int_list", list(dilation)), ExternArg("int", int(groups))]
    packed = packed_weight(lw, weight, mkldnn._reorder_convolution_weight.default,
                           [*ints, ExternArg("int_list", list(x[1]))])
    w = tensor_arg(whole(packed.buffer))
    if other is not None:
        call = ExternCall(mkldnn._convolution_pointwise.binary,
                          [tensor_arg(x), tensor_arg(other), w, optional_arg(bias), *ints,
                           ExternArg("string", "add"), ExternArg("none", None),
                           ExternArg("string", m.unary) if m.unary else ExternArg("none", None),
                           ExternArg("int_list", []), ExternArg("none", None)], [out])
    else:
        call = ExternCall(mkldnn._convolution_pointwise.default,
                          [tensor_arg(x), w, optional_arg(bias), *ints, ExternArg("string", m.unary or "none"),
                           ExternArg("int_list", []), _algorithm(m.unary)], [out])
    template = (conv_template_variant(lw, m, x, weight, bias, other, out)
                or depthwise_variant(lw, m, x, weight, bias, other, out))
    winograd = winograd_variant(lw, m, x, weight, bias, other, out)
    compiled = [v for v in (template, winograd) if v is not None]
    onednn = GemmVariant("onednn", [call], [packed])
    if compiled:  # ATen's convolution is oneDNN's without post-ops or a packed weight: it only loses
        return [onednn, *compiled]
    return [GemmVariant("aten", aten_steps, []), onednn]
