"""The CPU backend's build-time weight transforms: the layouts its template kernels read.

``TRANSFORMS`` maps the kinds lowering asks for (``Backend.weight_transform``) to the
function that produces the layout: GEMM / direct-convolution weight panels, their padded
bias, and the Winograd F(2x2, 3x3) filter transform.
"""
from __future__ import annotations

import torch

#: Columns per panel of a GEMM template's packed weight (``GemmKernel``): 16 float32 are
#: two 256-bit or one 512-bit vector, so one k step of a panel is one or two vector loads.
GEMM_PANEL = 16


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


#: kind -> transform: ``gemm_panels`` (a ``[N, K]`` weight, also a convolution's viewed as
#: ``[C_out, C_in*KH*KW]``), ``gemm_bias`` (``[N]``), ``winograd`` (``[C_out, C_in, 3, 3]``).
TRANSFORMS = {"gemm_panels": pack_panels, "gemm_bias": pad_bias, "winograd": winograd_weights}
