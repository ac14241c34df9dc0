"""The epilogues template kernels apply to their result ``y``: name -> the formula it computes,
as eager decomposes it (the printed form of a template kernel shows the formula, so a
kernel's ``kernel_id`` changes with it). Names are oneDNN's post-op names, which
``gemm_match`` finds."""
from __future__ import annotations

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

#: The epilogues of a convolution template (``ConvKernel``): the GEMM's, less GELU (no CNN
#: here uses it after a conv), plus ``add_relu``, ResNet's ``relu(conv + residual)``.
CONV_EPILOGUES = {name: text for name, text in GEMM_EPILOGUES.items() if name != "gelu"}
CONV_EPILOGUES["add_relu"] = "relu(y + residual)"

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

