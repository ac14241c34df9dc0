"""Ops that used to run as extern ATen calls now fuse, and match eager through the runtime.

Each model (``tests/models/``) puts many ops on odd sizes (7x13, 3x257, 1x1), transposed
and step-sliced inputs, float32 and int64; the build's kernels.ir must hold no extern
call for them, and the outputs must match eager: float outputs within 1e-5 abs + 1e-5
relative (var/std: two passes, double accumulators; transcendentals from libmvec),
integer outputs exactly, NaN where eager has NaN, +-inf equal.
"""
import pytest

from aotpack.tune import autotune
from aotpack.tune import choice_cache
from aotpack.commands import report
from aotpack.build import build
from aotpack.config import Settings
from aotpack.archive.layout import KERNEL_IR_PATH
from aotpack.archive.writer import read_members
from helpers import MODELS, assert_native_parity, fixed_timing


TOLERANCE = 1e-5


def _externs(archive) -> list[str]:
    """The ATen ops the archive still calls (not fused), one entry per op."""
    text = read_members(archive)[KERNEL_IR_PATH].decode()
    return [e["op"] for e in report.extern_calls(text)]


def test_activations_and_tensor_clamp_fuse(build_model, tmp_path):
    path = MODELS / "activation_zoo.py"
    result = build_model(path)
    assert _externs(result.archive) == []
    assert_native_parity(result.archive, path, tmp_path, atol=TOLERANCE, rtol=TOLERANCE)


def test_rounding_division_and_remainder_fuse(build_model, tmp_path):
    path = MODELS / "division_zoo.py"
    result = build_model(path)
    # only the integer division by an integer tensor (ATen raises on a zero divisor)
    assert _externs(result.archive) == ["aten.div.Tensor_mode"]
    assert_native_parity(result.archive, path, tmp_path, atol=TOLERANCE, rtol=TOLERANCE)


@pytest.mark.filterwarnings(r"ignore:var\(\)")  # eager warns on the correction >= N cases
def test_variance_and_integer_reductions_fuse(build_model, tmp_path):
    path = MODELS / "reduction_stats.py"
    result = build_model(path)
    assert _externs(result.archive) == ["aten.var.correction"]  # var(x, 0): a leading dim
    assert_native_parity(result.archive, path, tmp_path, atol=TOLERANCE, rtol=TOLERANCE)


def test_mobilenet_block_relu6_and_hardswish_fuse(tmp_path, cache_dir, monkeypatch):
    """With oneDNN picked for every conv (pinned: the GEMM steps' timings decide otherwise),
    only the convolutions stay extern: hardswish is a post-op, and ReLU6, which oneDNN does
    not fuse here, joins the kernels that read it (the squeeze-excite mean and scale, the
    head's clamp)."""
    monkeypatch.setattr(autotune, "time_functions", lambda fns, *_: fixed_timing([1.0 + i for i in range(len(fns))]))
    monkeypatch.setattr(choice_cache, "read_all", lambda *args: {})
    monkeypatch.setattr(choice_cache, "write_all", lambda *args: None)
    path = MODELS / "mobilenet_block.py"
    result = build(path, tmp_path / "out", settings=Settings.from_env(topn=1, cache_dir=cache_dir))
    assert _externs(result.archive) == ["mkldnn._convolution_pointwise.default",
                                        "mkldnn._convolution_pointwise.binary"]
    assert [k["name"].rsplit("_", 1)[0] for k in result.manifest["kernels"]] == [
        "fused_hardtanh_mean", "fused_hardtanh_mul", "fused_hardtanh"]
    assert_native_parity(result.archive, path, tmp_path, atol=TOLERANCE, rtol=TOLERANCE)


def test_residual_add_is_written_by_the_next_layer_norm_kernel(build_model, tmp_path):
    path = MODELS / "residual_norm.py"
    result = build_model(path)
    text = read_members(result.archive)[KERNEL_IR_PATH].decode()
    assert report.launch_sites(text) == 2  # 3 with the residual sum as a kernel of its own
    # one kernel writes LayerNorm(h) * 3 and h; the second reads h
    two_outputs = [block for block in text.split("\n\n") if "\n  out1: float32[4, 17, 256] = " in block]
    assert len(two_outputs) == 1
    assert_native_parity(result.archive, path, tmp_path, atol=TOLERANCE, rtol=TOLERANCE)


def test_vit_block_matches_eager(build_model, tmp_path):
    """Residual adds after a projection are the GEMM steps' epilogues (whichever
    implementation PGO picks); the block as a whole matches eager."""
    path = MODELS / "vit_block.py"
    assert_native_parity(build_model(path).archive, path, tmp_path, atol=1e-4, rtol=1e-4)


def test_cat_and_flip_fuse_into_their_consumers(build_model, tmp_path):
    """cat is a Piecewise read and flip a reversed index: no ATen call, no copy kernel
    of their own, and parity on every case of the zoo (float32 within 1e-5)."""
    path = MODELS / "cat_flip_zoo.py"
    result = build_model(path)
    text = read_members(result.archive)[KERNEL_IR_PATH].decode()
    assert _externs(result.archive) == []
    assert "piecewise[" in text and " - (" in text  # the cat selects and the flip reversal
    assert_native_parity(result.archive, path, tmp_path, atol=TOLERANCE, rtol=TOLERANCE)


def test_an_inner_cat_cut_into_column_tiles_matches_eager(tmp_path):
    """A cat along j cut at 40, run in column tiles of 32 (a tile straddles the cut) on 1
    and 2 threads, and whole: each j segment is clipped to the tile (exact: float32 copies)."""
    import torch

    from aotpack.backends.cpu.tiling import Tiling
    from helpers import compile_tilings
    from helpers import lower_function as _lower

    a, b = torch.randn(3, 40), torch.randn(3, 50)
    graph = _lower(lambda a, b: torch.cat([a, b * 2.0], dim=1) + 1.0, a, b)
    (kernel,) = graph.kernels
    tilings = [Tiling(1, 32, 0, 0), Tiling(2, 32, 0, 0), Tiling(1, 90, 0, 0), Tiling(2, 16, 0, 0, row_block=2)]
    launcher = compile_tilings(kernel, tilings, tmp_path)
    expected = torch.cat([a, b * 2.0], dim=1) + 1.0
    for tiling in tilings:
        out = torch.full_like(expected, float("nan"))
        launcher.launch(tiling.kernel_key, [a, b, out])
        assert torch.equal(out, expected), tiling.tiling_repr


def test_relu_and_clamps_keep_nan_and_the_sign_of_zero_bit_for_bit(tmp_path):
    """relu, clamp with number bounds (one select per bound) and with a NaN bound, hardswish:
    NaN stays NaN, -0.0 stays -0.0 where eager keeps it, +-inf clamp: equal to eager bit for bit."""
    import torch
    import torch.nn.functional as F

    from aotpack.backends.cpu.tiling import Tiling
    from helpers import compile_tilings
    from helpers import lower_function as _lower

    special = torch.tensor([float("nan"), -0.0, 0.0, float("inf"), float("-inf"), -2.5, 0.5, 7.0, -3.0, 3.0])
    x = torch.cat([special, torch.linspace(-8, 8, 23)])  # 33: a vector tail

    def f(x):
        return (torch.relu(x), torch.clamp(x, -1.0, 1.0), torch.clamp(x, min=float("nan")), F.hardswish(x),
                F.relu6(x))
    graph = _lower(f, x)
    tilings = [Tiling(1, 33, 0, 0), Tiling(1, 16, 0, 0)]
    expected = f(x)
    for kernel in graph.kernels:
        launcher = compile_tilings(kernel, tilings, tmp_path / kernel.name)
        outs = [torch.full_like(x, 1234.0) for _ in kernel.outputs]
        for tiling in tilings:
            launcher.launch(tiling.kernel_key, [x] + outs)
            for out in outs:
                match = [e for e in expected if torch.equal(out.nan_to_num(99.0), e.nan_to_num(99.0))]
                assert match, f"{tiling.tiling_repr}: {out} matches no eager output"
                numbers = ~match[0].isnan()  # a NaN's sign bit carries no meaning
                assert torch.equal(out.isnan(), match[0].isnan())
                assert torch.equal(out[numbers].signbit(), match[0][numbers].signbit()), tiling.tiling_repr
