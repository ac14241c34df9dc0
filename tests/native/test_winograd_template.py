"""aotpack's Winograd F(2x2, 3x3) convolution (``kernel_ir.WinogradConvKernel``,
``backends/cpu/winograd_template``, the ``winograd`` variant of ``gemm_lowering``): the filter
transform, the tilings offered, every tiling of odd-shaped convolutions (partial tiles, tail
channels, partial blocks, batches, offsets, every padding it takes) with each epilogue compiled
and launched against torch (float32: |ours - torch| <= 1e-4 + 1e-4 * |torch|: the transforms
add a few roundings per output), and which convolutions get the variant."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aotpack import backends
from aotpack.lower import gemm_lowering
from aotpack.backends.cpu import winograd_template
from aotpack.ir.graph import Buffer, contiguous_strides
from aotpack.ir.template_kernels import WinogradConvKernel
from aotpack.backends.cpu.weights import WINOGRAD_G, winograd_weights
from test_conv_template import assert_every_tiling_matches

ATOL, RTOL = 1e-4, 1e-4


def _buffer(name: str, shape: tuple) -> Buffer:
    return Buffer(name, shape, contiguous_strides(shape), torch.float32, "input")


def _kernel(x_shape, c_out, padding=(1, 1), epilogue="none", bias=True, x_offset=0,
            residual_offset=0) -> WinogradConvKernel:
    n, c_in, h, w = x_shape
    probe = WinogradConvKernel("probe", "probe", tuple(x_shape), c_out, padding, (), ())
    out_shape = (n, c_out, *probe.out_hw)
    inputs = [_buffer("x", (x_offset + n * c_in * h * w,)), _buffer("u", (16, c_in, c_out))]
    if bias:
        inputs.append(_buffer("bias", (c_out,)))
    if epilogue in ("add", "add_relu"):
        inputs.append(_buffer("residual", (residual_offset + n * c_out * out_shape[2] * out_shape[3],)))
    return WinogradConvKernel(f"winograd_{epilogue}_0", f"winograd_{epilogue}", tuple(x_shape), c_out, padding,
                              tuple(inputs), (_buffer("out", out_shape),), epilogue=epilogue, has_bias=bias,
                              x_offset=x_offset, residual_offset=residual_offset)


@pytest.mark.unit
def test_the_filter_transform_is_g_w_g_transposed():
    weight = torch.randn(5, 3, 3, 3, dtype=torch.float32)
    u = winograd_weights(weight)
    g = torch.tensor(WINOGRAD_G, dtype=torch.float64)
    assert u.shape == (16, 3, 5) and u.is_contiguous() and u.dtype == torch.float32
    for co, ci in ((0, 0), (4, 2), (2, 1)):
        expected = (g @ weight[co, ci].double() @ g.T).reshape(16).float()
        assert torch.equal(u[:, ci, co], expected)


@pytest.mark.unit
def test_tilings_default_first_and_blocks_whole_register_tiles():
    kernel = _kernel((1, 64, 56, 56), 64)
    tilings = winograd_template.solve(kernel, 2, vector_bytes=64)
    first = tilings[0]
    # 784 tiles: 13 blocks of 64 (v and m of 64 tiles: 16 x 128 x 64 floats = 512 KiB)
    assert (first.block_dim, first.tiles, first.mr, first.nr) == (2, 64, 12, 32)
    assert first.tiling_repr == "cpu_winograd;block_dim=2;tiles=64;mr=12;nr=32;vector_bytes=64"
    # the zero-bordered image (64 planes of 58 x 58), then a block per thread (32 rows one line longer)
    assert first.workspace == (64 * 58 * 58 + 34 + 14) * 4 + 2 * 16 * (128 * 64 + 32) * 4
    assert [t.block_dim for t in tilings[:2]] == [2, 1]
    assert all(t.tiles % t.nr == 0 for t in tilings) and len(set(tilings)) == len(tilings)
    # 14 x 14 outputs of 256 channels: 49 tiles, 32 KiB per tile: blocks of 16 tiles (AVX2's
    # register tile, 512 KiB), two of 32 at AVX-512's (the fewest tiles a block takes)
    small = _kernel((1, 256, 14, 14), 256)
    avx2, avx512 = (winograd_template.solve(small, 1, vector_bytes=v)[0] for v in (32, 64))
    assert (avx2.tiles, avx2.mr, avx2.nr, avx2.vector_bytes) == (16, 6, 16, 32)
    assert (avx512.tiles, avx512.mr, avx512.nr, avx512.vector_bytes) == (32, 12, 32, 64)
    # 16 x 16 outputs: 64 tiles fit one block, but threads share an image's blocks: one each
    tiny = _kernel((1, 64, 16, 16), 64)
    assert [(t.block_dim, t.tiles) for t in winograd_template.solve(tiny, 2, vector_bytes=64)[:2]] == [(2, 32), (1, 64)]
    with pytest.raises(ValueError, match="nr=24 is not a multiple of the 16 lanes of a 64-byte vector"):
        winograd_template.make_tiling(kernel, 1, 48, 4, 24, vector_bytes=64)


# (x_shape, c_out, padding, epilogue, bias, x_offset, residual_offset): odd output sizes cut the
# last tile row and column; c_out off the register tile leaves a tail of channels; a batch of 2
CASES = [
    ((1, 16, 9, 11), 13, (1, 1), "none", True, 0, 0),
    ((2, 17, 15, 8), 24, (1, 1), "relu", False, 5, 0),
    ((1, 16, 12, 12), 20, (0, 0), "add", True, 0, 3),
    ((2, 20, 13, 17), 12, (2, 2), "add_relu", True, 7, 11),
    ((1, 16, 10, 21), 9, (1, 0), "hardswish", True, 0, 0),
    ((1, 24, 16, 16), 40, (1, 1), "sigmoid", True, 0, 0),
]


def _tilings(kernel) -> list:
    wide = [winograd_template.make_tiling(kernel, 2, 32, 12, 32, vector_bytes=64),
            winograd_template.make_tiling(kernel, 1, 96, 8, 48, vector_bytes=64),
            winograd_template.make_tiling(kernel, 2, 16, 4, 16, vector_bytes=64)]
    return list(dict.fromkeys(winograd_template.solve(kernel, 2) + wide))


@pytest.mark.native
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{'x'.join(map(str, c[0]))}-{c[1]}-p{c[2][0]}{c[2][1]}-{c[3]}")
def test_every_tiling_matches_torch(case, tmp_path):
    x_shape, c_out, padding, epilogue, has_bias, x_offset, r_offset = case
    kernel = _kernel(x_shape, c_out, padding, epilogue, has_bias, x_offset, r_offset)
    generator = torch.Generator().manual_seed(c_out * 100 + x_shape[1])
    x_store = torch.randn(kernel.inputs[0].shape, generator=generator)
    x = x_store[x_offset:].view(x_shape)
    weight = torch.randn(c_out, x_shape[1], 3, 3, generator=generator) / (9 * x_shape[1]) ** 0.5
    bias = torch.randn(c_out, generator=generator) if has_bias else None
    tensors = [x_store, winograd_weights(weight)] + ([bias] if has_bias else [])
    y = F.conv2d(x, weight, bias, 1, padding)
    assert_every_tiling_matches(kernel, _tilings(kernel), tensors, y, generator, r_offset, tmp_path, ATOL, RTOL)


class _Match:
    """The parts of a ``gemm_match.GemmMatch`` the variant reads."""

    def __init__(self, stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1, epilogue="relu"):
        self.gemm = type("Node", (), {"args": (None, None, None, stride, padding, dilation, False, (0, 0), groups)})
        self.epilogue = epilogue


class _Lowering:
    def __init__(self, weight: torch.Tensor):
        self.constant_tensors = {"w": weight}
        self.constants = [Buffer("w", tuple(weight.shape), contiguous_strides(weight.shape), torch.float32,
                                 "constant")]
        self.kernels = []

    def pack_weight(self, kind: str, tensor: torch.Tensor) -> torch.Tensor:
        return backends.get("cpu").weight_transform(kind)(tensor)


def _variant(x_shape, c_out=32, kernel=3, **match):
    weight = torch.randn(c_out, x_shape[1], kernel, kernel)
    lw = _Lowering(weight)
    stride, padding = match.get("stride", (1, 1)), match.get("padding", (1, 1))
    out_hw = [(s + 2 * p - kernel) // st + 1 for s, p, st in zip(x_shape[2:], padding, stride)]
    x = (_buffer("x", x_shape), tuple(x_shape), contiguous_strides(x_shape), 0)
    out = _buffer("out", (x_shape[0], c_out, *out_hw))
    return gemm_lowering.winograd_variant(lw, _Match(**match), x, lw.constants[0], None, None, out), lw


@pytest.mark.unit
def test_only_3x3_stride_1_convolutions_with_enough_tiles_and_channels_get_the_variant():
    variant, lw = _variant((1, 64, 56, 56))
    assert variant.name == "winograd" and [type(k).__name__ for k in lw.kernels] == ["WinogradConvKernel"]
    (kernel,) = lw.kernels
    assert kernel.tiles == (28, 28) and kernel.inputs[1].name == "w.winograd"
    assert torch.equal(lw.constant_tensors["w.winograd"], winograd_weights(lw.constant_tensors["w"]))
    assert _variant((1, 64, 56, 56), stride=(2, 2))[0] is None
    assert _variant((1, 64, 56, 56), dilation=(2, 2))[0] is None
    assert _variant((1, 64, 56, 56), groups=2)[0] is None
    assert _variant((1, 64, 56, 56), kernel=5, padding=(2, 2))[0] is None
    assert _variant((1, 64, 56, 56), epilogue="gelu")[0] is None
    assert _variant((1, 512, 7, 7))[0] is None  # 16 tiles: the transformed weight costs more than it saves
    assert _variant((1, 8, 56, 56))[0] is None  # 8 input channels
    assert _variant((1, 64, 9, 15))[0] is not None  # 5 x 8 = 40 tiles


@pytest.mark.unit
def test_a_bias_slice_gets_a_constant_of_its_own():
    bias = Buffer("b", (64,), (1,), torch.float32, "constant")
    assert gemm_lowering._bias_name((bias, (64,), (1,), 0)) == "b.conv_bias"
    assert gemm_lowering._bias_name((bias, (32,), (1,), 32)) == "b.conv_bias@32:[32]:[1]"
    assert gemm_lowering._bias_name((bias, (32,), (1,), 0)) != gemm_lowering._bias_name((bias, (32,), (1,), 32))
