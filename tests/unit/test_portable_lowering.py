"""The portable backend without a compiler: what lowering offers it (no template kernels, so no
GEMM/bmm/attention choice) and what its renderer writes (plain C: no OpenMP, no vectors)."""
from __future__ import annotations

import torch

from aotpack import backends
from aotpack.ir import gemm
from aotpack.ir.kernel import FusedKernel
from aotpack.frontend.export import decomposition_table
from aotpack.lower.lowering import lower


class _Attention(torch.nn.Module):
    def forward(self, q, k, v, w):
        scores = torch.softmax(q @ k.transpose(-1, -2) * 0.125, dim=-1)
        return torch.nn.functional.linear(scores @ v, w).relu()


def _lower(*inputs, backend: str):
    ep = torch.export.export(_Attention(), inputs, strict=False).run_decompositions(decomposition_table())
    return lower(ep, backends.get(backend))


INPUTS = (torch.randn(4, 16, 8), torch.randn(4, 16, 8), torch.randn(4, 16, 8), torch.randn(8, 8))


def test_cpu_offers_template_kernels_where_portable_lowers_to_aten_calls_alone():
    cpu = _lower(*INPUTS, backend="cpu")
    assert gemm.gemm_steps(cpu), "the CPU backend should offer its bmm/attention/GEMM templates here"
    graph = _lower(*INPUTS, backend="portable")
    assert not gemm.gemm_steps(graph)
    assert graph.kernels and all(isinstance(k, FusedKernel) for k in graph.kernels)
    ops = {str(step.op) for step in graph.extern_calls()}
    assert any("bmm" in op for op in ops), ops


def test_portable_kernels_render_as_plain_c_with_double_sums():
    backend = backends.get("portable")
    graph = _lower(*INPUTS, backend="portable")
    for kernel in graph.distinct_kernels():
        (candidate,) = backend.solve(kernel, None, 1)
        source = backend.render_kernel(kernel, candidate)
        for banned in ("#pragma", "immintrin", "vector_size", "__builtin", "std::", "static_cast"):
            assert banned not in source, banned
        assert "aotpack_kernel_launch" in source
    softmax = [k for k in graph.distinct_kernels() if "exp" in k.format()]
    assert softmax and "double acc" in backend.render_kernel(softmax[0], backend.solve(softmax[0], None, 1)[0])
