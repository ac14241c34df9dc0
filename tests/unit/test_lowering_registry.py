"""The lowering's op registry (``lower/registry.py``), the template kernels' shared printed form
(``ir/template_kernels.TemplateKernel``) and the backend's weight transforms
(``Backend.weight_transform``)."""
from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest
import torch

from aotpack import backends
from aotpack.backends.base import Backend
from aotpack.backends.cpu import weights
from aotpack.ir.graph import Buffer
from aotpack.ir.template_kernels import GemmKernel
from aotpack.lower import lowering, ops, registry  # noqa: F401  (lowering registers every family)



def test_every_fusable_op_table_has_a_handler_and_an_op_is_claimed_once():
    tables = [ops.UNARY, ops.BINARY, ops.PARAMETRIC, ops.DIV_WITH_MODE, ops.REMAINDERS, ops.CLAMP_TENSOR,
              ops.COPIES, ops.VIEWS, ops.REDUCTIONS, ops.VARIANCES]
    assert all(registry.handler(op) is not None for table in tables for op in table)
    assert registry.handler(torch.ops.aten.convolution.default) is None  # an extern call
    unary = next(iter(ops.UNARY))
    with pytest.raises(ValueError, match="lowered twice"):
        registry.lowers(unary)(lambda lw, node: None)
    assert registry.handler(unary).__module__ == "aotpack.lower.pointwise"


def _gemm(name: str) -> GemmKernel:
    a = Buffer("a", (4, 6), (6, 1), torch.float32, "input")
    w = Buffer("w", (1, 6, 16), (96, 16, 1), torch.float32, "constant")
    out = Buffer("o", (4, 5), (5, 1), torch.float32, "kernel")
    return GemmKernel(name, "gemm_relu", 4, 5, 6, (a, w), (out,), epilogue="relu", a_row_stride=6)


def test_a_template_kernel_prints_kind_and_name_then_its_lines_and_hashes_the_text_without_the_name():
    kernel = _gemm("gemm_relu_3")
    assert str(kernel) == kernel.format() == "\n".join([
        "gemm gemm_relu_3 [m<4, n<5, k<6]",
        "  in0: float32 a[m, k] at 0 + m*6 + k",
        "  in1: float32 weight panels [1, 6, 16]",
        "  out0: float32[4, 5] = relu(y) where y = a @ weight"])
    assert kernel.format(with_name=False).startswith("gemm [m<4")
    assert kernel.kernel_id == hashlib.sha256(kernel.format(with_name=False).encode()).hexdigest()[:24]
    assert kernel.kernel_id == _gemm("gemm_relu_9").kernel_id  # repeated layers share it


def test_the_cpu_backend_supplies_its_weight_layouts_and_a_backend_without_them_says_so():
    cpu = backends.get("cpu")
    weight = torch.arange(40.0).reshape(20, 2)
    panels = cpu.weight_transform("gemm_panels")(weight)
    assert panels.shape == (2, 2, weights.GEMM_PANEL)
    assert torch.equal(panels[1, :, :4], weight[16:].T) and not panels[1, :, 4:].any()
    assert cpu.weight_transform("gemm_bias")(torch.ones(20)).shape == (32,)
    assert cpu.weight_transform("winograd")(torch.ones(3, 2, 3, 3)).shape == (16, 2, 3)
    with pytest.raises(KeyError, match="backend 'bare' has no weight transform 'gemm_panels'"):
        Backend.weight_transform(SimpleNamespace(name="bare"), "gemm_panels")  # the base class's answer
