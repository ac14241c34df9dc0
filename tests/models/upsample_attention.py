"""Composite ops the decomposition table keeps whole: bilinear and nearest interpolate
(upsample) and masked scaled-dot-product attention. The one-pass export must keep them as
the public export + run_decompositions does."""
import torch
import torch.nn.functional as F


class UpsampleAttention(torch.nn.Module):
    def forward(self, x, q):
        up = F.interpolate(x, scale_factor=2, mode="bilinear").relu() + F.interpolate(x, scale_factor=2)
        mask = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).tril()
        return up, F.scaled_dot_product_attention(q, q, q, attn_mask=mask)


def model():
    return UpsampleAttention()


def example_inputs():
    return torch.randn(1, 3, 8, 8), torch.randn(1, 2, 4, 8)
