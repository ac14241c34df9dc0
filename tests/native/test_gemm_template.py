"""aotpack's GEMM template (``kernel_ir.GemmKernel``, ``backends/cpu/gemm_template``):
the packed weight layout, the tilings offered, and every tiling of odd-sized GEMMs with
each epilogue, on row-strided and offset operands, compiled and launched against torch
(float32: |ours - torch| <= 1e-5 + 1e-4 * |torch|; the summation order differs from MKL's)."""
from __future__ import annotations


import pytest
import safetensors.torch
import torch
import torch.nn.functional as F

from aotpack import backends
from aotpack.tune import autotune
from aotpack.tune import choice_cache
from aotpack.archive import layout
from aotpack.archive import reader
from aotpack.backends.cpu import gemm_template
from aotpack.backends.cpu.gemm_template import GemmTiling
from aotpack.config import Settings
from aotpack.ir.graph import Buffer, contiguous_strides
from aotpack.build import build
from aotpack.ir.template_kernels import GemmKernel
from aotpack.backends.cpu.weights import GEMM_PANEL, pack_panels, pad_bias
from helpers import EAGER_EPILOGUES, MODELS, SAMPLES, assert_native_parity, compile_tilings, fixed_timing

TIED = MODELS / "tied_weights.py"

ATOL, RTOL = 1e-5, 1e-4



def _buffer(name: str, shape: tuple) -> Buffer:
    return Buffer(name, shape, contiguous_strides(shape), torch.float32, "input")


def _kernel(m, k, n, epilogue="none", bias=True, a_pad=(0, 0), r_pad=0) -> GemmKernel:
    """A GEMM reading ``a`` at column offset a_pad[0] of rows a_pad[1] longer than K, and a
    residual of rows ``r_pad`` longer than N (offset 1)."""
    lda = k + a_pad[1]
    inputs = [_buffer("a", (m * lda + a_pad[0],)), _buffer("w", (-(-n // GEMM_PANEL), k, GEMM_PANEL))]
    if bias:
        inputs.append(_buffer("bias", (-(-n // GEMM_PANEL) * GEMM_PANEL,)))
    if epilogue == "add":
        inputs.append(_buffer("residual", (1 + m * (n + r_pad),)))
    return GemmKernel(f"gemm_{epilogue}_0", f"gemm_{epilogue}", m, n, k, tuple(inputs), (_buffer("out", (m, n)),),
                      epilogue=epilogue, has_bias=bias, a_offset=a_pad[0], a_row_stride=lda,
                      residual_offset=1 if epilogue == "add" else 0,
                      residual_row_stride=n + r_pad if epilogue == "add" else 0)


@pytest.mark.unit
def test_panels_hold_sixteen_columns_of_the_weight_per_k_zero_padded():
    weight = torch.arange(20 * 3, dtype=torch.float32).view(20, 3)  # N=20, K=3
    panels = pack_panels(weight)
    assert panels.shape == (2, 3, 16) and panels.is_contiguous()
    for n in range(32):
        for k in range(3):
            assert panels[n // 16, k, n % 16].item() == (weight[n, k].item() if n < 20 else 0.0)
    assert pad_bias(torch.tensor([1.0, 2.0])).tolist() == [1.0, 2.0] + [0.0] * 14


@pytest.mark.unit
def test_tilings_default_first_unique_and_within_the_device_limit():
    big = _kernel(32, 2048, 512)
    options = gemm_template.solve(big, 2)
    assert options[0] == GemmTiling(block_dim=2, mr=6, kc=2048, mc=36)  # K <= 2048: one k block; all rows
    assert len(set(options)) == len(options) and all(o.block_dim <= 2 and o.mc % o.mr == 0 for o in options)
    assert {o.kc for o in options} == {1024, 2048} and {o.mr for o in options} == {4, 6}
    assert gemm_template.solve(big, 2, count=2) == options[:2]
    tiny = _kernel(3, 8, 4)  # 192 flops: one thread first
    assert gemm_template.solve(tiny, 4)[0].block_dim == 1
    assert options[0].tiling_repr == "cpu_gemm;block_dim=2;mr=6;kc=2048;mc=36"
    longer = gemm_template.solve(_kernel(32, 4096, 64), 1)[0]  # K > 2048: k blocks of 512
    assert (longer.kc, longer.mc) == (512, 36)



@pytest.mark.unit
def test_avx512_tilings_take_taller_tiles_and_name_their_vector_width(monkeypatch):
    big = _kernel(32, 2048, 512)
    options = gemm_template.solve(big, 2, vector_bytes=64)
    assert options[0] == GemmTiling(block_dim=2, mr=10, kc=2048, mc=40, vector_bytes=64, nr=32)
    assert {(o.mr, o.nr) for o in options} == {(10, 32), (14, 16)} and {o.vector_bytes for o in options} == {64}
    assert options[0].tiling_repr == "cpu_gemm;block_dim=2;mr=10;kc=2048;mc=40;vector_bytes=64;nr=32"
    assert options[0].kernel_key != GemmTiling(block_dim=2, mr=10, kc=2048, mc=40, nr=32).kernel_key
    assert gemm_template.solve(_kernel(8, 64, 16), 1, vector_bytes=64)[0].nr == 16  # one panel: no pair
    # at one vector per row (16 columns of AVX-512) a 6-row tile is latency-bound: it costs 8 rows
    assert gemm_template.latency_rows(6, 14, 64) == 8 / 6 and gemm_template.latency_rows(6, 6, 32) == 1
    assert gemm_template.latency_rows(6, 10, 64, 32) == 1
    source = gemm_template.render_kernel(big, options[0])
    assert "#if defined(__AVX512F__)\n#define AP_VECTOR_BYTES 64\n#elif defined(__AVX__)\n#define AP_VECTOR_BYTES 32" in source
    backend = backends.get("cpu")
    for features, width in ((["avx2", "avx512f"], 64), (["avx", "avx2"], 32), (["sse4.2"], 16)):
        monkeypatch.setattr(type(backend), "target", lambda self, settings, f=features: {"march": "x", "features": f})
        assert backend.limits(Settings(device_limit=3)).vector_bytes == width
    assert backend.solve(big, backend.limits(Settings(device_limit=3)), 1)[0].vector_bytes == 32  # SSE: AVX2 knobs

@pytest.mark.unit
def test_rows_split_into_tiles_of_balanced_heights():
    assert gemm_template.tile_heights(32, 6) == [6, 6, 5, 5, 5, 5]
    assert gemm_template.tile_heights(13, 6) == [5, 4, 4]
    assert gemm_template.tile_heights(12, 6) == [6, 6] and gemm_template.tile_heights(1, 6) == [1]
    for m in range(1, 80):
        heights = gemm_template.tile_heights(m, 6)
        assert sum(heights) == m and len(heights) == -(-m // 6) and max(heights) - min(heights) <= 1


@pytest.mark.unit
def test_estimate_counts_a_tile_under_four_rows_as_four():
    kernel = _kernel(32, 512, 2048)
    balanced = gemm_template.estimate_us(kernel, GemmTiling(block_dim=1, mr=6, kc=512, mc=36))
    assert balanced == pytest.approx(kernel.flops / 90e3)  # 6 6 5 5 5 5: none latency-bound
    one_row = gemm_template.estimate_us(_kernel(1, 512, 2048), GemmTiling(block_dim=1, mr=6, kc=512, mc=6))
    assert one_row == pytest.approx(4 * 2 * 512 * 2048 / 90e3)


@pytest.mark.unit
def test_row_groups_fit_l2_and_share_the_tiles_evenly():
    # 512 rows, k block 256 floats: 256 rows fit 256 KiB, so two groups of 43 of the 86 tiles
    assert gemm_template.solve(_kernel(512, 256, 768), 1)[0].mc == 43 * 6
    # 128 rows x 1024: 64 rows fit, two groups of 11 tiles (not 10 + 10 + 2)
    assert gemm_template.solve(_kernel(128, 1024, 256), 1)[0].mc == 11 * 6


@pytest.mark.unit
def test_kernel_id_hashes_the_gemm_not_its_name():
    assert _kernel(7, 13, 5).kernel_id == GemmKernel(**{**_kernel(7, 13, 5).__dict__, "name": "other"}).kernel_id
    ids = {_kernel(7, 13, 5).kernel_id, _kernel(7, 13, 5, "relu").kernel_id, _kernel(7, 13, 6).kernel_id,
           _kernel(7, 13, 5, bias=False).kernel_id, _kernel(7, 13, 5, a_pad=(1, 2)).kernel_id}
    assert len(ids) == 5
    text = str(_kernel(7, 13, 5, "gelu"))
    assert text.splitlines()[0] == "gemm gemm_gelu_0 [m<7, n<5, k<13]"
    assert "erf" in text and "#include" not in gemm_template.render_kernel(
        _kernel(7, 13, 5), gemm_template.solve(_kernel(7, 13, 5), 1)[0]).split("namespace {")[1]


CASES = [  # (M, K, N, epilogue, bias, a_pad, r_pad): odd sizes, register-tile and panel tails
    (7, 13, 5, "relu", True, (3, 4), 0),
    (37, 70, 50, "gelu", True, (0, 0), 0),
    (1, 16, 16, "none", False, (0, 0), 0),
    (13, 33, 17, "add", True, (1, 0), 3),
    (5, 9, 33, "swish", True, (0, 1), 0),
    (6, 300, 20, "tanh", False, (0, 0), 0),
    (11, 24, 31, "sigmoid", True, (2, 5), 0),
    (9, 20, 18, "hardswish", True, (0, 0), 0),
    (4, 7, 3, "hardsigmoid", False, (1, 2), 0),
]


def _tilings(kernel: GemmKernel) -> list[GemmTiling]:
    """The solver's, plus short k blocks (partial sums through out) and one-tile row groups."""
    extra = [GemmTiling(block_dim=2, mr=6, kc=4, mc=6), GemmTiling(block_dim=1, mr=5, kc=7, mc=10),
             GemmTiling(block_dim=2, mr=1, kc=kernel.k, mc=1)]
    wide = gemm_template.solve(kernel, 2, 3, vector_bytes=64)[::2]  # AVX-512: mr 14 and mr 8 (AVX2 code without it)
    return list(dict.fromkeys(gemm_template.solve(kernel, 2) + extra + wide))



@pytest.mark.native
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{c[3]}")
def test_every_tiling_matches_torch(case, tmp_path):
    m, k, n, epilogue, has_bias, a_pad, r_pad = case
    kernel = _kernel(m, k, n, epilogue, has_bias, a_pad, r_pad)
    generator = torch.Generator().manual_seed(m * 1000 + n)
    a_store = torch.randn(kernel.inputs[0].shape, generator=generator)
    a = a_store[a_pad[0]:a_pad[0] + m * (k + a_pad[1])].view(m, k + a_pad[1])[:, :k]  # row-strided, offset
    weight = torch.randn(n, k, generator=generator)
    bias = torch.randn(n, generator=generator) if has_bias else None
    tensors = [a_store, pack_panels(weight)] + ([pad_bias(bias)] if has_bias else [])
    residual = None
    if epilogue == "add":
        r_store = torch.randn(kernel.inputs[-1].shape, generator=generator)
        residual = r_store[1:].view(m, n + r_pad)[:, :n]
        tensors.append(r_store)
    expected = EAGER_EPILOGUES[epilogue](F.linear(a, weight, bias), residual)
    tilings = _tilings(kernel)
    launcher = compile_tilings(kernel, tilings, tmp_path)
    for tiling in tilings:
        out = torch.full((m, n), float("nan"))
        launcher.launch(tiling.kernel_key, tensors + [out])
        torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL, msg=lambda text: f"{tiling}: {text}")


def _template_wins(functions, device=None):
    """``autotune.time_functions`` stand-in: the last variant (the template) is fastest."""
    for fn in functions:
        fn()
    return fixed_timing([2.0] * (len(functions) - 1) + [1.0])


@pytest.mark.native
def test_template_on_a_tied_weight_packs_at_load_and_ships_it_once(tmp_path, cache_dir):
    """lm_head shares the embedding: the archive holds the dense weight once, model.cpp
    packs the panels in create(), and the result matches eager natively."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(autotune, "time_functions", _template_wins)
        patch.setattr(choice_cache, "read_all", lambda *args: {})
        patch.setattr(choice_cache, "write_all", lambda *args: None)
        result = build(TIED, tmp_path, settings=Settings.from_env(topn=1, cache_dir=cache_dir))
    assert [g["winner"] for g in [c for c in result.manifest["choices"] if c["kind"] != "kernel"]] == ["template"]
    files = reader.read_all(result.archive)
    stored = set(safetensors.torch.load(files[layout.WEIGHTS_PATH]))
    assert stored == {"decoder.embed_tokens.weight", "norm1.weight", "norm1.bias"}
    source = files[layout.MODEL_SOURCE_PATH].decode()
    assert "pack_panels(Tensor(m.constants[0], false), 512, 64, 16, &m.packed[0]);" in source
    assert_native_parity(result.archive, TIED, tmp_path, atol=ATOL, rtol=RTOL)


@pytest.mark.native
def test_template_on_an_untied_weight_ships_build_time_panels_only(tmp_path, cache_dir):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(autotune, "time_functions", _template_wins)
        patch.setattr(choice_cache, "read_all", lambda *args: {})
        patch.setattr(choice_cache, "write_all", lambda *args: None)
        result = build(SAMPLES / "mlp.py", tmp_path, settings=Settings.from_env(topn=1, cache_dir=cache_dir))
    assert [g["winner"] for g in [c for c in result.manifest["choices"] if c["kind"] != "kernel"]] == ["template", "template"]
    files = reader.read_all(result.archive)
    stored = safetensors.torch.load(files[layout.WEIGHTS_PATH])
    assert sorted(stored) == ["fc1.bias.gemm_bias", "fc1.weight.gemm_panels", "fc2.bias.gemm_bias",
                              "fc2.weight.gemm_panels", "norm.bias", "norm.weight"]
    assert stored["fc1.weight.gemm_panels"].shape == (2048 // 16, 512, 16)
    assert "pack_panels" not in files[layout.MODEL_SOURCE_PATH].decode()
    assert_native_parity(result.archive, SAMPLES / "mlp.py", tmp_path, atol=ATOL, rtol=RTOL)


@pytest.mark.native
def test_gelu_epilogue_erf_within_its_stated_error(tmp_path):
    """The template's inline erf (3.8e-7 absolute): GELU of a 1x1 GEMM (weight 1, no bias)
    over [-6, 6] and the specials, against the eager decomposition in float64."""
    values = torch.cat([torch.linspace(-6, 6, 12001), torch.tensor([0.0, -0.0, 1e-30, float("inf"),
                                                                     float("-inf"), float("nan")])])
    kernel = _kernel(values.numel(), 1, 1, "gelu", bias=False)
    tiling = gemm_template.solve(kernel, 1)[0]
    launcher = compile_tilings(kernel, [tiling], tmp_path)
    out = torch.empty(values.numel(), 1)
    launcher.launch(tiling.kernel_key, [values.clone(), pack_panels(torch.ones(1, 1)), out])
    y = values.double()
    expected = (y * 0.5) * (torch.erf(y * 0.5 ** 0.5) + 1)
    got = out[:, 0].double()
    finite = expected.isfinite()
    assert ((got[finite] - expected[finite]).abs() <= 2e-7 * y[finite].abs() + 1e-7 * expected[finite].abs()).all()
    assert got[-3].item() == float("inf") and got[-2].isnan() and got[-1].isnan()  # as the decomposition
