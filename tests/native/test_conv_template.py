"""aotpack's direct-convolution template (``kernel_ir.ConvKernel``,
``backends/cpu/conv_template``) and batch-norm folding (``gemm_match``/``gemm_lowering``):
the tilings offered, every tiling of odd-shaped convolutions with each epilogue, strides,
padding and dilation, compiled and launched against torch (float32:
|ours - torch| <= 1e-5 + 1e-4 * |torch|), and a CNN block built end to end."""
from __future__ import annotations

import dataclasses

import pytest
import safetensors.torch
import torch
import torch.nn.functional as F

from aotpack import backends
from aotpack.tune import autotune
from aotpack.tune import choice_cache
from aotpack.lower import gemm_match
from aotpack.archive import layout
from aotpack.archive import reader
from aotpack.backends.cpu import conv_template, toolchain
from aotpack.backends.cpu.conv_template import ConvTiling
from aotpack.backends.cpu.toolchain import KERNEL_FLAGS, O2_MARK, CpuToolchain, kernel_flags
from aotpack.build import build
from aotpack.tune.candidates import shortlist
from aotpack.config import Settings
from aotpack.frontend.export import export_model, load_model_file
from aotpack.ir.graph import Buffer, contiguous_strides
from aotpack.ir.template_kernels import ConvKernel
from aotpack.backends.cpu.weights import GEMM_PANEL, pack_panels, pad_bias
from helpers import EAGER_EPILOGUES, MODELS, assert_native_parity, compile_tilings, fixed_timing

BLOCK = MODELS / "conv_bn_block.py"
ATOL, RTOL = 1e-5, 1e-4



def _buffer(name: str, shape: tuple) -> Buffer:
    return Buffer(name, shape, contiguous_strides(shape), torch.float32, "input")


def _kernel(x_shape, c_out, kernel=(3, 3), stride=(1, 1), padding=(1, 1), dilation=(1, 1), epilogue="none",
            bias=True, x_offset=0, residual_offset=0) -> ConvKernel:
    n, c_in = x_shape[:2]
    panels = -(-c_out // GEMM_PANEL)
    probe = ConvKernel("probe", "probe", tuple(x_shape), c_out, kernel, stride, padding, dilation, (), ())
    out_shape = (n, c_out, *probe.out_hw)
    inputs = [_buffer("x", (x_offset + probe.x_shape[0] * c_in * x_shape[2] * x_shape[3],)),
              _buffer("w", (panels, probe.k, GEMM_PANEL))]
    if bias:
        inputs.append(_buffer("bias", (panels * GEMM_PANEL,)))
    if epilogue in ("add", "add_relu"):
        inputs.append(_buffer("residual", (residual_offset + n * c_out * probe.m,)))
    return ConvKernel(f"conv_{epilogue}_0", f"conv_{epilogue}", tuple(x_shape), c_out, kernel, stride, padding,
                      dilation, tuple(inputs), (_buffer("out", out_shape),), epilogue=epilogue, has_bias=bias,
                      x_offset=x_offset, residual_offset=residual_offset)


def _guarded_floats(count: int):
    """A float32 tensor of ``count`` elements whose last one ends exactly where a PROT_NONE
    page begins (an anonymous mmap; returned with it, which must outlive the tensor): a
    kernel that reads one float past the tensor faults."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    data_pages = -(-count * 4 // page)
    region = mmap.mmap(-1, (data_pages + 1) * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mprotect(ctypes.c_void_p(base + data_pages * page), ctypes.c_size_t(page), 0) == 0  # PROT_NONE
    offset = data_pages * page - count * 4
    return torch.frombuffer(region, dtype=torch.float32, count=count, offset=offset), region


def _launch_rows_on_guarded_input(x_shape, kernel_size, stride, padding, folder) -> None:
    """In a child process: every ``rows`` tiling of ``_tilings`` on a convolution whose input
    ends at a guard page, against torch (an assertion exits 1; a read past the input faults)."""
    kernel = _kernel(x_shape, 5, kernel_size, stride, padding, (1, 1), "relu", True, 0, 0)
    generator = torch.Generator().manual_seed(5)
    weight = torch.randn(5, x_shape[1], *kernel_size, generator=generator)
    bias = torch.randn(5, generator=generator)
    x, _region = _guarded_floats(kernel.inputs[0].shape[0])  # the region lives as long as x
    x.copy_(torch.randn(x.shape, generator=generator))
    tensors = [x, pack_panels(weight.reshape(5, -1)), pad_bias(bias)]
    y = F.conv2d(x.view(x_shape), weight, bias, stride, padding)
    rows = [t for t in _tilings(kernel) if t.layout == "rows"]
    assert rows
    assert_every_tiling_matches(kernel, rows, tensors, y, generator, 0, folder, ATOL, RTOL)


@pytest.mark.native
@pytest.mark.parametrize("x_shape, kernel_size, stride, padding", [
    ((2, 1, 33, 1), (1, 1), (2, 2), (0, 0)),  # one input column: the odd phase holds none
    ((1, 2, 40, 1), (3, 1), (2, 2), (1, 0)),
    ((1, 3, 12, 9), (3, 3), (2, 2), (1, 1)),
])
def test_rows_staging_reads_nothing_past_the_input(x_shape, kernel_size, stride, padding, tmp_path):
    """The stride-2 ``rows`` staging splits each input row into its even and odd columns;
    with one input column and no padding the odd phase holds none, and a bound computed
    with C++'s truncating division copied one float past the row (the input's last row:
    past the tensor). The input ends at a guard page, so such a read faults the child process."""
    import multiprocessing

    assert conv_template.rows_allowed(_kernel(x_shape, 5, kernel_size, stride, padding, (1, 1), "relu"))
    # spawn, not fork: a child forked from a process whose OpenMP pool already ran hangs in
    # its first parallel region
    child = multiprocessing.get_context("spawn").Process(
        target=_launch_rows_on_guarded_input, args=(x_shape, kernel_size, stride, padding, tmp_path))
    child.start()
    child.join(300)
    assert child.exitcode == 0, f"child exit code {child.exitcode} (-11: a read past the input)"


@pytest.mark.unit
@pytest.mark.parametrize("shape", [((1, 3, 224, 224), (7, 7), (2, 2), (3, 3), (1, 1)),
                                   ((2, 5, 9, 8), (5, 5), (1, 1), (2, 2), (2, 2)),
                                   ((1, 1, 6, 15), (3, 1), (1, 2), (1, 0), (1, 1))])
def test_output_size_is_torchs(shape):
    x_shape, kernel, stride, padding, dilation = shape
    conv = _kernel(x_shape, 4, kernel, stride, padding, dilation)
    expected = F.conv2d(torch.zeros(x_shape), torch.zeros(4, x_shape[1], *kernel), None, stride, padding, dilation)
    assert (conv.x_shape[0], conv.c_out, *conv.out_hw) == tuple(expected.shape)
    assert conv.k == x_shape[1] * kernel[0] * kernel[1] and conv.m == expected.shape[2] * expected.shape[3]


@pytest.mark.unit
def test_tilings_default_first_unique_with_their_workspace():
    deep = _kernel((1, 512, 7, 7), 512)  # K = 4608: a panel is 288 KiB, so k blocks of 56 channels
    options = conv_template.solve(deep, 2)
    image, partials = 512 * 9 * 9 * 4, 49 * 512 * 4
    # past LANES_FIRST_MAX_K the direct default leads and the lanes default (the padded image, one k block) follows
    assert options[:3] == [ConvTiling(block_dim=2, mr=6, mc=54, kc=56, layout="nchw", workspace=image + partials),
                           ConvTiling(block_dim=2, mr=4, mc=24, kc=512, layout="lanes", workspace=image, nr=24),
                           ConvTiling(block_dim=1, mr=6, mc=54, kc=56, layout="nchw", workspace=image + partials)]
    # channels-last is offered last: it won no race at --topn 3 (ResNet-18, MobileNetV3, ViT)
    assert options[-1] == ConvTiling(block_dim=2, mr=6, mc=54, kc=56, layout="nhwc", workspace=image + partials)
    assert options[0].tiling_repr == "cpu_conv;block_dim=2;mr=6;mc=54;kc=56;layout=nchw"
    assert len(set(options)) == len(options) and all(o.block_dim <= 2 for o in options)
    assert all(o.mc % o.mr == 0 for o in options if o.layout != "lanes")
    assert {o.kc for o in options} == {56, 512} and {o.mr for o in options} == {4, 6}
    whole = [o for o in options if o.kc == 512 and o.layout != "lanes"]
    assert [o.workspace for o in whole] == [image]  # one k block: no partial sums
    pointwise = _kernel((1, 8, 5, 5), 16, (1, 1), padding=(0, 0))
    unpadded = conv_template.solve(pointwise, 4)
    # 6400 flops: one thread; 25 positions: the pointwise layout first, then the direct default
    assert [(o.layout, o.block_dim, o.workspace) for o in unpadded[:4]] == [
        ("pointwise", 1, 0), ("nchw", 1, 0), ("pointwise", 4, 0), ("pointwise", 1, 0)]
    assert unpadded[0].tiling_repr == "cpu_conv;block_dim=1;mr=4;mc=24;kc=8;layout=pointwise;nr=24"
    assert (unpadded[3].mr, unpadded[3].nr) == (6, 16)  # the other AVX2 register tile
    assert unpadded[-1].layout == "nhwc" and unpadded[-1].workspace == 832  # the channels-last copy: 800 bytes, 64-aligned
    assert conv_template.solve(deep, 2, count=2) == options[:2]
    shallow = conv_template.solve(_kernel((1, 16, 12, 12), 16), 2)  # K = 144: lanes first
    assert [(o.layout, o.workspace) for o in shallow[:2]] == [("lanes", 16 * 14 * 14 * 4), ("nchw", 16 * 14 * 14 * 4)]
    assert shallow[0].tiling_repr == "cpu_conv;block_dim=1;mr=4;mc=24;kc=16;layout=lanes;nr=24"


@pytest.mark.unit
def test_only_the_direct_template_compiles_at_o2(tmp_path, monkeypatch):
    conv = _kernel((1, 16, 12, 12), 32)
    by_layout = {t.layout: t for t in conv_template.solve(conv, 2)}
    chain = CpuToolchain("x86-64")
    for layout, level in (("nchw", "-O2"), ("nhwc", "-O2"), ("lanes", "-O3")):
        source = conv_template.render_kernel(conv, by_layout[layout])
        flags = chain.command(tmp_path / "kernel.cpp", tmp_path / "kernel.so", "kernel", source)
        assert [f for f in flags if f.startswith("-O")] == [level], layout
    # the compile itself reads the mark from the source file
    seen = []
    monkeypatch.setattr(toolchain, "compile_so", lambda prefix, *rest: seen.append(prefix))
    for layout in ("nchw", "lanes"):
        (tmp_path / f"{layout}.cpp").write_text(conv_template.render_kernel(conv, by_layout[layout]))
        chain.compile_kernel(tmp_path / f"{layout}.cpp", tmp_path / f"{layout}.so")
    assert [[f for f in prefix if f.startswith("-O")] for prefix in seen] == [["-O2"], ["-O3"]]
    # the mark counts only in the leading comment: a kernel cannot be talked into -O2 by its body
    assert kernel_flags(f"// a kernel\nint x;\n{O2_MARK}\n") == KERNEL_FLAGS
    assert kernel_flags(f"// a kernel\n{O2_MARK}\nint x;\n")[0] == "-O2"


@pytest.mark.unit
def test_strided_lanes_split_the_image_into_its_phases():
    stem = _kernel((1, 3, 224, 224), 16, (3, 3), (2, 2), (1, 1))  # MobileNet's stem: strided 3x3, rows second
    # 2 x 2 phases of 112 + 1 rows and columns each (the taps reach one row, one column further)
    assert conv_template.lanes_phases(stem) == (2, 2, 113, 113)
    first, second, *rest = conv_template.solve(stem, 2, count=10)
    # rows: per thread 3 channels x 3 staged rows of 240 floats (the last 16-column tile's
    # 2 x 16 floats from column 192 + 2, past the 1 + 224 of a zero-bordered row)
    assert conv_template.staged_pitch(stem, 48) == 240
    assert (first.layout, second.layout, second.workspace) == ("nchw", "rows", 2 * 3 * 3 * 240 * 4)
    assert not second.copies(stem)
    phases = [o for o in rest if o.layout == "lanes"]
    assert [o.workspace for o in phases] == [-(-3 * 4 * 113 * 113 * 4 // 64) * 64] and phases[0].copies(stem)
    wide = _kernel((1, 16, 112, 112), 32, (3, 3), (2, 2), (1, 1))  # 16 channels: the phases, no rows
    assert not conv_template.rows_allowed(wide) and conv_template.solve(wide, 2)[1].layout == "lanes"
    downsample = _kernel((1, 64, 56, 56), 128, (1, 1), (2, 2), (0, 0))  # 1x1 s2: one phase of 28 x 28, lanes first
    assert conv_template.lanes_phases(downsample) == (1, 1, 28, 28)
    assert conv_template.solve(downsample, 2)[0].layout == "lanes"
    dilated = _kernel((1, 8, 20, 20), 8, (3, 3), (2, 2), (2, 2), (2, 2))  # strided and dilated: no lanes
    assert conv_template.lanes_layout(dilated) is None
    patches = _kernel((1, 3, 224, 224), 384, (16, 16), (16, 16), (0, 0))  # ViT's patch embedding
    assert conv_template.lanes_layout(patches) is None
    assert [o.layout for o in conv_template.solve(patches, 2)] == ["nchw"] * 5 + ["nhwc"]
    assert conv_template.lanes_layout(_kernel((1, 3, 224, 224), 64, (8, 8), (8, 8), (0, 0))) == "lanes"


@pytest.mark.unit
def test_groups_keep_their_input_rows_within_half_the_l2():
    conv = _kernel((1, 64, 56, 56), 64)  # a padded input row of all channels: 64 * 58 * 4 bytes
    tiling = conv_template.solve(conv, 1)[0]
    rows_per_group = tiling.mc // 56 + 3  # output rows of a group + the window's other rows
    assert rows_per_group * 64 * 58 * 4 <= 256 * 1024 + 2 * 64 * 58 * 4
    assert tiling.mc % 6 == 0 and tiling.mc < conv.m


@pytest.mark.unit
def test_kernel_id_hashes_the_convolution_not_its_name():
    base = _kernel((1, 8, 9, 9), 16)
    assert base.kernel_id == ConvKernel(**{**base.__dict__, "name": "other"}).kernel_id
    ids = {base.kernel_id, _kernel((1, 8, 9, 9), 16, epilogue="relu").kernel_id,
           _kernel((1, 8, 9, 9), 16, stride=(2, 2)).kernel_id, _kernel((1, 8, 9, 9), 16, bias=False).kernel_id,
           _kernel((1, 8, 9, 9), 16, x_offset=3).kernel_id}
    assert len(ids) == 5
    assert str(base).splitlines()[0] == ("conv2d conv_none_0 [n<1, m<81, n_out<16, k<72] kernel [3, 3] "
                                         "stride [1, 1] padding [1, 1] dilation [1, 1]")


CASES = [  # x shape, C_out, kernel, stride, padding, dilation, epilogue, bias, x offset, residual offset
    ((2, 3, 13, 11), 5, (3, 3), (1, 1), (1, 1), (1, 1), "relu", True, 3, 0),
    ((1, 8, 7, 9), 17, (1, 1), (2, 2), (0, 0), (1, 1), "none", False, 0, 0),
    ((1, 16, 10, 10), 33, (3, 3), (2, 2), (1, 1), (1, 1), "add_relu", True, 0, 2),
    ((2, 5, 9, 8), 16, (5, 5), (1, 1), (2, 2), (2, 2), "sigmoid", True, 0, 0),
    ((2, 1, 6, 15), 7, (3, 1), (1, 2), (1, 0), (1, 1), "add", True, 1, 1),
    ((1, 40, 5, 5), 20, (3, 3), (1, 1), (1, 1), (1, 1), "tanh", True, 0, 0),
    ((1, 3, 20, 20), 8, (7, 7), (2, 2), (3, 3), (1, 1), "swish", False, 0, 0),
    # pointwise: 63 positions (a 15-lane tail), 13 channels (a short channel tile), batch 2
    ((2, 5, 9, 7), 13, (1, 1), (1, 1), (0, 0), (1, 1), "hardswish", True, 2, 0),
    ((1, 24, 8, 8), 40, (1, 1), (1, 1), (0, 0), (1, 1), "add_relu", True, 0, 3),
    ((1, 3, 4, 5), 16, (1, 1), (1, 1), (0, 0), (1, 1), "hardsigmoid", False, 0, 0),
    # lanes: rows of a padded copy (a tile across rows, 2 dropped columns), batch 2 with a
    # residual; no padding; a padded 1x3; dilation 2; a 3x1 whose rows need no dropping
    ((2, 7, 11, 13), 20, (3, 3), (1, 1), (1, 1), (1, 1), "add_relu", True, 1, 2),
    ((1, 9, 10, 12), 17, (3, 3), (1, 1), (0, 0), (1, 1), "relu", False, 0, 0),
    ((1, 6, 5, 19), 24, (1, 3), (1, 1), (0, 1), (1, 1), "hardswish", True, 0, 0),
    ((1, 4, 12, 12), 9, (3, 3), (1, 1), (2, 2), (2, 2), "none", True, 0, 0),
    ((1, 5, 9, 17), 33, (3, 1), (1, 1), (1, 0), (1, 1), "add", False, 0, 0),
    # strided lanes (the strided cases above have them too): a 4x4 patchify (16 phases, no
    # dropped column), a 2x2 stride 2 padding rows only, batch 2; stride 3 (a 3x3 phase grid)
    ((1, 3, 16, 20), 12, (4, 4), (4, 4), (0, 0), (1, 1), "sigmoid", True, 0, 0),
    # a wide patchify (ViT's 16x16): its NCHW tiling unrolls 4 of a row's 10 taps at a time
    ((1, 3, 20, 30), 16, (10, 10), (10, 10), (0, 0), (1, 1), "none", True, 0, 0),
    ((2, 4, 11, 9), 10, (2, 2), (2, 2), (1, 0), (1, 1), "relu", True, 0, 0),
    ((1, 5, 14, 17), 16, (3, 3), (3, 3), (1, 1), (1, 1), "add", True, 0, 1),
    # rows (staged rows; up to 4 channels): 100 output columns (48-wide tiles: 48 + 48 + 4;
    # 32-wide: three and a 4-column tail), stride 2, odd width; a 35-column row (one tile, a
    # 3-lane tail), batch 2 with a residual; a 5x5 stride (1, 2) whose padding reaches past two rows
    ((1, 2, 5, 199), 9, (3, 3), (2, 2), (1, 1), (1, 1), "hardswish", True, 0, 0),
    ((2, 3, 9, 70), 19, (3, 3), (2, 2), (1, 1), (1, 1), "add_relu", False, 2, 1),
    ((1, 4, 7, 8), 6, (5, 5), (1, 2), (3, 2), (1, 1), "relu", True, 0, 0),
]


def _tilings(kernel: ConvKernel) -> list[ConvTiling]:
    """The solver's, plus k blocks of 3 and 2 channels (partial sums through the
    workspace, a short last block), one-tile groups of 5- and 1-position tiles, and the
    channels-last copy with k blocks on 2 threads."""
    extra = [conv_template.make_tiling(kernel, 2, 6, 3, 6), conv_template.make_tiling(kernel, 1, 5, 64, 10),
             conv_template.make_tiling(kernel, 2, 1, 2, 1), conv_template.make_tiling(kernel, 2, 4, 3, 8, "nhwc")]
    wide = [conv_template.make_tiling(kernel, 2, 14, 3, vector_bytes=64),  # AVX-512 (AVX2 code without it)
            conv_template.make_tiling(kernel, 2, 10, 3, vector_bytes=64, nr=32),
            conv_template.make_tiling(kernel, 1, 8, kernel.x_shape[1], layout="nhwc", vector_bytes=64)]
    knobs = ((2, 8, 48, 64), (1, 12, 32, 64), (2, 4, 24, 32), (1, 6, 16, 32), (1, 3, 64, 64))
    lanes = [conv_template.lanes_tiling(kernel, *k) for k in knobs] if conv_template.lanes_layout(kernel) else []
    rows = [conv_template.lanes_tiling(kernel, *k, staged=True) for k in knobs] if conv_template.rows_allowed(kernel) else []
    return list(dict.fromkeys(conv_template.solve(kernel, 2) + extra + wide + lanes + rows))


@pytest.mark.native
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{'x'.join(map(str, c[0]))}-{c[1]}-k{c[2][0]}{c[2][1]}-{c[6]}")
def test_every_tiling_matches_torch(case, tmp_path):
    x_shape, c_out, kernel_size, stride, padding, dilation, epilogue, has_bias, x_offset, r_offset = case
    kernel = _kernel(x_shape, c_out, kernel_size, stride, padding, dilation, epilogue, has_bias, x_offset, r_offset)
    generator = torch.Generator().manual_seed(c_out * 100 + x_shape[1])
    x_store = torch.randn(kernel.inputs[0].shape, generator=generator)
    x = x_store[x_offset:].view(x_shape)
    weight = torch.randn(c_out, x_shape[1], *kernel_size, generator=generator)
    bias = torch.randn(c_out, generator=generator) if has_bias else None
    tensors = [x_store, pack_panels(weight.reshape(c_out, -1))] + ([pad_bias(bias)] if has_bias else [])
    y = F.conv2d(x, weight, bias, stride, padding, dilation)
    assert_every_tiling_matches(kernel, _tilings(kernel), tensors, y, generator, r_offset, tmp_path, ATOL, RTOL)


def assert_every_tiling_matches(kernel, tilings, tensors, y, generator, r_offset, folder, atol, rtol):
    """Compile ``tilings`` of a convolution ``kernel``, launch each on ``tensors`` (plus a fresh
    residual storage from ``generator`` for the ``add`` epilogues, read from ``r_offset``) and
    compare its output, first filled with NaN, with the kernel's epilogue of ``y``."""
    residual = None
    if kernel.epilogue in ("add", "add_relu"):
        r_store = torch.randn(kernel.inputs[-1].shape, generator=generator)
        residual = r_store[r_offset:].view(y.shape)
        tensors = tensors + [r_store]
    expected = EAGER_EPILOGUES[kernel.epilogue](y, residual)
    launcher = compile_tilings(kernel, tilings, folder)
    for tiling in tilings:
        out = torch.full(expected.shape, float("nan"))
        launcher.launch(tiling.kernel_key, tensors + [out])
        torch.testing.assert_close(out, expected, atol=atol, rtol=rtol, msg=lambda text: f"{tiling}: {text}")


@pytest.mark.unit
def test_batch_norm_and_the_shared_residual_are_matched_once():
    program = export_model(load_model_file(BLOCK))
    constants = {s.arg.name for s in program.graph_signature.input_specs if s.kind.name != "USER_INPUT"}
    found = gemm_match.find(program.graph, constants)
    summary = sorted((m.weight.name, m.batch_norm is not None, m.epilogue) for m in found.values())
    # conv2 (with its batch norm) keeps the add shared with the downsample, which is matched alone
    assert summary == [("p_conv1_weight", True, "relu"), ("p_conv2_weight", True, "add_relu"),
                       ("p_dilated_weight", False, "sigmoid"), ("p_down_weight", False, "none"),
                       ("p_stem_weight", True, "relu")]


def _last_variant_wins(functions, device=None):
    """``autotune.time_functions`` stand-in: the last variant (the template) is fastest."""
    for fn in functions:
        fn()
    return fixed_timing([2.0] * (len(functions) - 1) + [1.0])


def _onednn_wins(functions, device=None):
    """The first variant (oneDNN for every convolution that has aotpack kernels) is fastest."""
    for fn in functions:
        fn()
    return fixed_timing([1.0] + [2.0] * (len(functions) - 1))


def _build(tmp_path, cache_dir, timing):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(autotune, "time_functions", timing)
        patch.setattr(choice_cache, "read_all", lambda *args: {})
        patch.setattr(choice_cache, "write_all", lambda *args: None)
        return build(BLOCK, tmp_path, settings=Settings.from_env(topn=2, cache_dir=cache_dir))


@pytest.mark.native
def test_template_block_folds_batch_norm_and_ships_panels_only(tmp_path, cache_dir):
    result = _build(tmp_path, cache_dir, _last_variant_wins)
    gemms = [c for c in result.manifest["choices"] if c["kind"] != "kernel"]
    assert [(g["epilogue"], g["winner"]) for g in gemms] == [
        ("relu", "template"), ("relu", "template"), ("none", "template"), ("add_relu", "template"),
        ("sigmoid", "template")]
    assert all(g["candidates"] == ["onednn", "template"] for g in gemms)
    stored = safetensors.torch.load(reader.read_all(result.archive)[layout.WEIGHTS_PATH])
    # neither the dense weights nor the batch norms' statistics: the folded weights' panels
    assert sorted((name, tuple(t.shape)) for name, t in stored.items()) == [
        ("bn1.folded_bias.conv_bias", (32,)), ("bn2.folded_bias.conv_bias", (32,)),
        ("conv1.weight.folded_bn1.conv_panels", (2, 72, 16)), ("conv2.weight.folded_bn2.conv_panels", (2, 180, 16)),
        ("dilated.bias.conv_bias", (16,)), ("dilated.weight.conv_panels", (1, 180, 16)),
        ("down.weight.conv_panels", (2, 8, 16)), ("stem.weight.folded_stem_bn.conv_panels", (1, 147, 16)),
        ("stem_bn.folded_bias.conv_bias", (16,))]
    assert_native_parity(result.archive, BLOCK, tmp_path, atol=ATOL, rtol=RTOL)


@pytest.mark.native
def test_onednn_block_fuses_the_folded_bias_residual_and_relu_as_post_ops(tmp_path, cache_dir):
    result = _build(tmp_path, cache_dir, _onednn_wins)
    assert {g["winner"] for g in [c for c in result.manifest["choices"] if c["kind"] != "kernel"]} == {"onednn"}
    source = reader.read_all(result.archive)[layout.MODEL_SOURCE_PATH].decode()
    assert source.count('"mkldnn::_convolution_pointwise", "binary"') == 1  # the residual add + ReLU
    assert not result.manifest["kernels"]  # no epilogue kernel: every epilogue is a post-op
    assert_native_parity(result.archive, BLOCK, tmp_path, atol=ATOL, rtol=RTOL)


@pytest.mark.unit
def test_lanes_waste_counts_the_positions_a_lanes_tiling_computes_and_drops():
    """A ``lanes`` tiling computes whole zero-bordered rows (a stride phase's) in tiles of
    ``nr`` positions: 7x7 outputs of a padded 3x3 convolution are 7 rows of 9, 2 tiles of 48
    for 49 kept; a 1x1 at 56x56 computes 66 tiles for 3136 positions; other layouts waste
    nothing, and the estimate scales its compute by the waste."""
    small = _kernel((1, 512, 7, 7), 512)
    by_layout = {t.layout: t for t in conv_template.solve(small, 2)}
    lanes = dataclasses.replace(by_layout["lanes"], nr=48)
    assert conv_template.lanes_waste(small, lanes) == 96 / 49
    assert conv_template.lanes_waste(small, by_layout["nchw"]) == 1.0
    strided = _kernel((1, 256, 14, 14), 512, stride=(2, 2))               # phase rows of 7 + 1
    assert conv_template.lanes_waste(strided, lanes) == 96 / 49
    wide = _kernel((1, 16, 56, 56), 64, kernel=(1, 1), padding=(0, 0))
    pointwise = next(t for t in conv_template.solve(wide, 2) if t.layout == "pointwise")
    assert conv_template.lanes_waste(wide, dataclasses.replace(pointwise, nr=48)) == 66 * 48 / 3136
    no_waste = dataclasses.replace(lanes, layout="nchw")  # the same copy (padded image) and threads
    copy_and_region = conv_template.image_region(small, "lanes") / conv_template.COPY_BYTES_PER_US + 2.0
    direct_stores = conv_template.direct_store_us(small, no_waste)
    assert conv_template.estimate_us(small, lanes) - copy_and_region == pytest.approx(
        96 / 49 * (conv_template.estimate_us(small, no_waste) - direct_stores - copy_and_region))


@pytest.mark.unit
def test_the_direct_templates_stores_make_a_small_k_pointwise_conv_far_behind():
    """The direct template stores each output element alone (0.6 ns each, split over the
    threads); the lanes layouts store vectors. So MobileNetV3-Small's 16 -> 72 1x1 at 56x56
    (226k outputs, 7 MFLOP) estimates its direct tilings over 1.4x the pointwise one and
    does not compile them (they measured 1.9-2.5x), while a 576 -> 96 1x1 at 7x7, where
    the direct template wins, keeps them."""
    expand = _kernel((1, 16, 56, 56), 72, kernel=(1, 1), padding=(0, 0))
    by_layout = {t.layout: t for t in conv_template.solve(expand, 1)}
    assert conv_template.direct_store_us(expand, by_layout["nchw"]) == pytest.approx(72 * 3136 * 0.6e-3)
    assert conv_template.direct_store_us(expand, dataclasses.replace(by_layout["nchw"], block_dim=2)) == \
        pytest.approx(72 * 3136 * 0.3e-3)
    assert conv_template.direct_store_us(expand, by_layout["pointwise"]) == 0.0
    cpu = backends.get("cpu")
    settings = Settings(device_limit=1, topn=3, tiny_kernel_us=0.0)
    kept = shortlist(expand, cpu, cpu.limits(settings), settings)
    assert [t.layout for t in kept] == ["pointwise", "pointwise"]
    project = _kernel((1, 576, 7, 7), 96, kernel=(1, 1), padding=(0, 0))
    assert "nchw" in [t.layout for t in shortlist(project, cpu, cpu.limits(settings), settings)]
