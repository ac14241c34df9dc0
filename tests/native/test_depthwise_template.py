"""aotpack's depthwise conv template (``kernel_ir.DepthwiseConvKernel``,
``backends/cpu/depthwise_template``): the staged workspace, the tilings offered, the
matcher's hardswish/hardsigmoid epilogues, and every tiling (both layouts) of odd-sized depthwise convs
with each epilogue, strides 1/2, 3x3/5x5, with and without bias, on offset and strided
inputs, compiled and launched against ``F.conv2d`` (float32: |ours - torch| <= 1e-5 +
1e-5 * |torch|); plus a whole model built with the template winning every conv."""
from __future__ import annotations

import dataclasses
import subprocess

import pytest
import torch
import torch.nn.functional as F

from aotpack import backends
from aotpack.tune import autotune
from aotpack.tune import choice_cache
from aotpack.lower import gemm_match
from aotpack.lower import lowering
from aotpack.backends.cpu import depthwise_template
from aotpack.backends.cpu.depthwise_template import DepthwiseTiling
from aotpack.backends.cpu.toolchain import CXX, KERNEL_FLAGS
from aotpack.build import build
from aotpack.config import Settings
from aotpack.frontend.export import export_model, load_model_file
from aotpack.ir.gemm import gemm_steps
from aotpack.ir.graph import Buffer, contiguous_strides
from aotpack.ir.template_kernels import DepthwiseConvKernel
from aotpack.archive.layout import KERNEL_IR_PATH
from aotpack.archive.writer import read_members
from helpers import MODELS, assert_native_parity, compile_tilings, fixed_timing

ATOL, RTOL = 1e-5, 1e-5
ZOO = MODELS / "depthwise_zoo.py"

EPILOGUES = {
    "none": lambda y: y,
    "relu": F.relu,
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "sigmoid": torch.sigmoid,
    "swish": F.silu,
}


def _buffer(name: str, shape: tuple) -> Buffer:
    return Buffer(name, shape, contiguous_strides(shape), torch.float32, "input")


def _out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _kernel(n, c, h, w, k, s, epilogue="none", bias=True, d=1, x_strides=None, x_offset=0, store=None):
    """A depthwise conv with padding ``d * (k // 2)``; ``x`` read at ``x_offset`` with
    ``x_strides`` (contiguous by default) from a buffer of ``store`` floats."""
    p = d * (k // 2)
    oh, ow = _out_size(h, k, s, p, d), _out_size(w, k, s, p, d)
    strides = x_strides or contiguous_strides((n, c, h, w))
    inputs = [_buffer("x", (store or n * c * h * w,)), _buffer("w", (c, 1, k, k))] + ([_buffer("b", (c,))] * bias)
    return DepthwiseConvKernel(f"dwconv_{epilogue}_0", f"dwconv_{epilogue}", n, c, (h, w), (oh, ow), (k, k), (s, s),
                               (p, p), (d, d), tuple(inputs), (_buffer("out", (n, c, oh, ow)),), epilogue=epilogue,
                               has_bias=bias, x_offset=x_offset, x_strides=tuple(strides),
                               weight_strides=contiguous_strides((c, 1, k, k)))


@pytest.mark.unit
def test_workspace_holds_one_zero_padded_plane_per_phase_and_thread():
    # 13x13, 3x3 stride 1, padding 1: 15 staged rows of 16 floats (15 padded columns)
    small = _kernel(1, 8, 13, 13, 3, 1)
    assert (depthwise_template.staged_rows(small), depthwise_template.pitch(small)) == (15, 16)
    assert depthwise_template.workspace_bytes(small, 2) == 2 * 15 * 16 * 4
    # 112x112, 3x3 stride 2: 113 rows, two phases of 57 columns (pitch 64)
    stem = _kernel(1, 16, 112, 112, 3, 2)
    assert (depthwise_template.staged_rows(stem), depthwise_template.pitch(stem)) == (113, 64)
    assert depthwise_template.scratch_floats(stem) == 2 * 113 * 64
    # 7x7 under 5x5: the one 8-lane output vector reaches column 8 + 4 = 12 -> pitch 16
    assert depthwise_template.pitch(_kernel(1, 8, 7, 7, 5, 1)) == 16


@pytest.mark.unit
def test_tilings_default_first_unique_and_within_the_device_limit():
    big = _kernel(1, 240, 14, 14, 5, 1)  # 2.35 MFLOP: all threads first
    options = depthwise_template.solve(big, 2)
    assert options[0] == DepthwiseTiling(block_dim=2, rows=4, vecs=2, workspace=2 * 18 * 24 * 4)
    assert options[0].tiling_repr == "cpu_depthwise_conv;block_dim=2;rows=4;vecs=2"
    assert len(set(options)) == len(options) and all(o.block_dim <= 2 for o in options)
    assert all(o.workspace == depthwise_template.workspace_bytes(big, o.block_dim) for o in options if o.layout == "planes")
    assert {(o.rows, o.vecs) for o in options} == {(4, 2), (2, 2), (4, 1), (6, 2), (0, 0)}
    # second: 8 channels in the lanes, 8 positions a block, one staged 18 x 18 window and the
    # 25 filter taps per thread
    assert options[1] == DepthwiseTiling(block_dim=2, rows=0, vecs=0, layout="channels", cols=8,
                                         workspace=2 * 2800 * 4)  # (18 * 18 + 25) * 8 floats, to 64 bytes
    assert options[1].tiling_repr == "cpu_depthwise_conv;block_dim=2;layout=channels;cols=8"
    assert depthwise_template.solve(big, 2, count=2) == options[:2]
    narrow = depthwise_template.solve(_kernel(1, 96, 7, 7, 5, 1), 2)  # one vector per row; 0.24 MFLOP: 1 thread
    assert narrow[0] == DepthwiseTiling(block_dim=1, rows=4, vecs=1, workspace=11 * 16 * 4)
    assert [(o.block_dim, o.rows, o.vecs, o.cols) for o in narrow] == [
        (1, 4, 1, 0), (1, 0, 0, 7), (2, 4, 1, 0), (1, 2, 1, 0), (1, 6, 1, 0)]  # 7 columns: blocks of 7
    wide = depthwise_template.solve(big, 2, vector_bytes=64)  # 14 columns: the 8-lane default stays first
    assert [o.vector_bytes for o in wide[:2]] == [32, 64] and wide[1].workspace == 2 * 18 * 32 * 4
    assert wide[1].tiling_repr == "cpu_depthwise_conv;block_dim=2;rows=4;vecs=1;vector_bytes=64"
    stem = depthwise_template.solve(_kernel(1, 16, 112, 112, 3, 2), 2, vector_bytes=64)
    assert stem[0].vector_bytes == 64 and stem[0].vecs == 2
    one_row = depthwise_template.solve(_kernel(1, 3, 1, 5, 3, 2), 1)
    assert [(o.rows, o.vecs, o.cols) for o in one_row] == [(1, 1, 0), (0, 0, 3)]


@pytest.mark.unit
def test_kernel_id_hashes_the_conv_not_its_name():
    base = _kernel(1, 8, 13, 13, 3, 1)
    assert base.kernel_id == DepthwiseConvKernel(**{**base.__dict__, "name": "other"}).kernel_id
    ids = {base.kernel_id, _kernel(1, 8, 13, 13, 3, 2).kernel_id, _kernel(1, 8, 13, 13, 5, 1).kernel_id,
           _kernel(1, 8, 13, 13, 3, 1, "relu").kernel_id, _kernel(1, 8, 13, 13, 3, 1, bias=False).kernel_id,
           _kernel(1, 8, 13, 13, 3, 1, x_offset=1, store=8 * 169 + 1).kernel_id}
    assert len(ids) == 6
    lines = str(_kernel(1, 8, 13, 13, 5, 2, "hardswish")).splitlines()
    assert lines[0] == ("depthwise_conv dwconv_hardswish_0 [n<1, c<8, oh<7, ow<7; kh<5, kw<5] stride [2, 2] "
                        "padding [2, 2] dilation [1, 1]")
    assert lines[-1] == ("  out0: float32[1, 8, 7, 7] = y * clamp(y + 3, 0, 6) / 6 "
                         "where y = depthwise_conv(x, weight) + bias")


def _activation_matches(model: torch.nn.Module, example: tuple) -> list:
    ep = torch.export.export(model, example).run_decompositions()
    constants = {n.name for n in ep.graph.nodes if n.op == "placeholder" and n.name.startswith("p_")}
    return sorted((m.kind, m.unary) for m in gemm_match.find(ep.graph, constants).values())


@pytest.mark.unit
def test_matcher_finds_hardswish_and_hardsigmoid_after_convs_and_linears():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = torch.nn.Conv2d(4, 4, 3, groups=4), torch.nn.Conv2d(4, 4, 1)
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            h = F.hardsigmoid(self.conv2(F.hardswish(self.conv1(x))))
            return F.hardswish(self.fc(h.mean((2, 3))))

    found = _activation_matches(Net().eval(), (torch.randn(1, 4, 6, 6),))
    assert found == [("conv2d", "hardsigmoid"), ("conv2d", "hardswish"), ("linear", "hardswish")]

    class Shared(torch.nn.Module):  # y + 3 read twice: not a hardswish epilogue
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(4, 4, 3, groups=4)

        def forward(self, x):
            y = self.conv(x)
            t = y + 3
            return y * t.clamp(0, 6) / 6, t

    assert _activation_matches(Shared().eval(), (torch.randn(1, 4, 6, 6),)) == [("conv2d", None)]


CASES = [  # (N, C, H, W, K, stride, epilogue, bias, dilation, layout)
    (1, 5, 13, 13, 3, 1, "relu", True, 1, "contiguous"),
    (1, 4, 28, 28, 3, 2, "none", False, 1, "contiguous"),
    (2, 3, 7, 7, 5, 1, "hardswish", True, 1, "contiguous"),
    (1, 6, 13, 28, 5, 2, "hardsigmoid", True, 1, "offset rows"),  # rows 3 floats longer, offset 2
    (1, 3, 1, 1, 3, 1, "sigmoid", True, 1, "contiguous"),
    (1, 3, 2, 5, 5, 2, "swish", False, 1, "channels last"),
    (1, 4, 5, 2, 3, 2, "relu", True, 1, "channels last"),
    (1, 2, 28, 13, 5, 1, "hardswish", False, 1, "offset rows"),
    (1, 3, 13, 7, 3, 1, "none", True, 2, "contiguous"),  # dilation 2
    # 8 channels and more: the channels layout's transposed staging and store (groups of 8
    # and a tail group, rows of 13 and 30 columns, non-contiguous planes, strided columns)
    (2, 20, 13, 13, 3, 1, "relu", True, 1, "contiguous"),
    (1, 16, 17, 30, 5, 2, "hardswish", True, 1, "offset rows"),
    (1, 9, 11, 12, 3, 2, "none", False, 1, "channels last"),
]


def _input(case, generator) -> tuple[torch.Tensor, torch.Tensor, DepthwiseConvKernel]:
    """(storage, x view of it, kernel reading x from the storage) for ``case``'s layout."""
    n, c, h, w, k, s, epilogue, bias, d, layout = case
    if layout == "channels last":
        x = torch.randn(n, h, w, c, generator=generator).permute(0, 3, 1, 2)
        return x, x, _kernel(n, c, h, w, k, s, epilogue, bias, d, x_strides=x.stride(), store=x.numel())
    if layout == "offset rows":
        store = torch.randn(2 + n * c * h * (w + 3), generator=generator)
        x = store[2:].view(n, c, h, w + 3)[..., :w]
        return store, x, _kernel(n, c, h, w, k, s, epilogue, bias, d, x_strides=x.stride(), x_offset=2,
                                 store=store.numel())
    x = torch.randn(n, c, h, w, generator=generator)
    return x, x, _kernel(n, c, h, w, k, s, epilogue, bias, d)


def _extra_tilings(kernel: DepthwiseConvKernel) -> list[DepthwiseTiling]:
    """Row blocks of 1 and 3 rows (a remainder block on most heights), 3 vectors, 2 threads;
    channels in the lanes with blocks of 8 (the transposed store), 3 and 1 positions (a
    remainder block ending at the row's end) on 1 and 2 threads."""
    planes = [DepthwiseTiling(block_dim=b, rows=r, vecs=v, workspace=depthwise_template.workspace_bytes(kernel, b, 32 // 4 * (w // 32)),
                              vector_bytes=w)
              for b, r, v, w in ((1, 1, 1, 32), (2, 3, 3, 32), (1, 3, 2, 32), (2, 4, 2, 64))]  # 64: AVX-512 (AVX2 without it)
    return planes + [depthwise_template.channels_tiling(kernel, b, cols) for b, cols in ((2, 8), (1, 3), (2, 1))]



@pytest.mark.native
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}x{c[3]}-k{c[4]}s{c[5]}d{c[8]}-{c[6]}"
                                                      f"{'' if c[7] else '-nobias'}-{c[9].replace(' ', '_')}")
def test_every_tiling_matches_torch(case, tmp_path):
    n, c, h, w, k, s, epilogue, has_bias, d, _layout = case
    generator = torch.Generator().manual_seed(h * 100 + w)
    store, x, kernel = _input(case, generator)
    weight = torch.randn(c, 1, k, k, generator=generator)
    bias = torch.randn(c, generator=generator) if has_bias else None
    expected = EPILOGUES[epilogue](F.conv2d(x, weight, bias, s, d * (k // 2), d, c))
    tilings = list(dict.fromkeys(depthwise_template.solve(kernel, 2) + _extra_tilings(kernel)))
    launcher = compile_tilings(kernel, tilings, tmp_path)
    for tiling in tilings:
        out = torch.full(expected.shape, float("nan"))
        launcher.launch(tiling.kernel_key, [store, weight] + ([bias] if has_bias else []) + [out])
        torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL, msg=lambda text: f"{tiling}: {text}")


@pytest.mark.native
@pytest.mark.parametrize("march", ["x86-64", "x86-64-v3", "x86-64-v4"])  # SSE, AVX2, AVX-512
def test_both_layouts_compile_for_every_vector_width(march, tmp_path):
    """The suite's other native tests build for this host's -march only; each layout's
    source must also compile where the template falls back to 4-lane SSE vectors or has
    AVX-512 (the channels form's 8 x 8 transpose exists at 8 lanes only)."""
    kernel = _kernel(1, 20, 13, 13, 5, 2, "hardswish", True)
    for tiling in depthwise_template.solve(kernel, 2, vector_bytes=64):
        source = tmp_path / f"{tiling.kernel_key}.cpp"
        source.write_text(depthwise_template.render_kernel(kernel, tiling))
        result = subprocess.run([CXX, *KERNEL_FLAGS, f"-march={march}", "-fsyntax-only", str(source)],
                                capture_output=True, text=True)
        assert result.returncode == 0, f"{tiling.tiling_repr} at -march={march}:\n{result.stderr[:2000]}"


def _template_wins(functions, device=None):
    """``autotune.time_functions`` stand-in: the last variant (the template) is fastest."""
    for fn in functions:
        fn()
    return fixed_timing([2.0] * (len(functions) - 1) + [1.0])


@pytest.mark.native
def test_template_wins_every_depthwise_conv_of_a_model_and_matches_eager(tmp_path, cache_dir):
    """Every depthwise conv of the zoo (each epilogue, stride 2, 5x5, dilation, no bias, a
    column slice of the input read in place) runs the template; natively within 1e-5."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(autotune, "time_functions", _template_wins)
        patch.setattr(choice_cache, "read_all", lambda *args: {})
        patch.setattr(choice_cache, "write_all", lambda *args: None)
        result = build(ZOO, tmp_path / "out", settings=Settings.from_env(topn=1, cache_dir=cache_dir))
    gemms = [c for c in result.manifest["choices"] if c["kind"] != "kernel"]
    assert [g["epilogue"] for g in gemms] == ["relu", "hardswish", "hardsigmoid", "sigmoid", "swish", "none",
                                              "relu", "hardswish"]
    assert all(g["candidates"] == ["onednn", "template"] and g["winner"] == "template" for g in gemms)
    text = read_members(result.archive)[KERNEL_IR_PATH].decode()
    assert "x[n, c, 13, 11] at 2 + n*2028 + c*169 + h*13 + w*1" in text  # the slice, not a copy
    assert "aten.convolution" not in text
    assert_native_parity(result.archive, ZOO, tmp_path, atol=ATOL, rtol=RTOL)


@pytest.mark.unit
def test_a_grouped_conv_that_is_not_depthwise_gets_no_template():
    class Grouped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(4, 4, 3, groups=2)
            self.dw_multiplier = torch.nn.Conv2d(4, 8, 3, groups=4)  # two filters per channel

        def forward(self, x):
            return self.conv(x), self.dw_multiplier(x)

    model_file = dataclasses.replace(load_model_file(ZOO), module=Grouped().eval(),
                                     example_inputs=(torch.randn(1, 4, 6, 6),))
    graph = lowering.lower(export_model(model_file), backends.get("cpu"))
    assert [[v.name for v in step.variants] for step in gemm_steps(graph)] == [["aten", "onednn"]] * 2
