"""aotpack's batched GEMM template (``kernel_ir.BmmKernel``, ``backends/cpu/bmm_template``):
the tilings offered, and every tiling of odd-sized batched GEMMs on strided operands
(transposed, row-padded, offset, sharing one buffer, a batch of two dimensions), compiled
and launched against ``torch.bmm`` (float32: |ours - torch| <= 1e-5 + 1e-5 * |torch|, about
1e-5 relative: the summation order differs from MKL's); then whole models built with the
template forced to win, run natively against eager."""
from __future__ import annotations


import pytest
import torch

from aotpack import backends
from aotpack.lower import attention_lowering
from aotpack.tune import autotune
from aotpack.tune import choice_cache
from aotpack.lower import lowering
from aotpack.commands import report
from aotpack.backends.cpu import bmm_template
from aotpack.backends.cpu.bmm_template import BmmTiling
from aotpack.build import build
from aotpack.config import Settings
from aotpack.frontend.export import load_model
from aotpack.ir.gemm import GemmStep, gemm_steps
from aotpack.ir.graph import Buffer
from aotpack.ir.template_kernels import BmmKernel
from helpers import MODELS, SAMPLES, assert_native_parity, compile_tilings, fixed_timing

ATOL, RTOL = 1e-5, 1e-5
ATTENTION = MODELS / "attention_bmm.py"


def _flat(name: str, tensor: torch.Tensor) -> Buffer:
    return Buffer(name, (tensor.numel(),), (1,), torch.float32, "input")


def _operand(batch_shape: tuple, rows: int, cols: int, layout: str, generator) -> tuple:
    """(storage, view [*batch, rows, cols]) of one operand laid out as ``layout``:
    ``contiguous``; ``transposed`` (stored [*batch, cols, rows]); ``padded`` (rows 3 floats
    longer, offset 2); ``heads`` (stored [b0, rows, b1, cols], as a head split of a projection,
    a batch that does not collapse)."""
    if layout == "contiguous":
        storage = torch.randn(*batch_shape, rows, cols, generator=generator)
        return storage, storage
    if layout == "transposed":
        storage = torch.randn(*batch_shape, cols, rows, generator=generator)
        return storage, storage.transpose(-1, -2)
    if layout == "padded":
        storage = torch.randn(2 + torch.Size(batch_shape).numel() * rows * (cols + 3), generator=generator)
        view = storage[2:].view(*batch_shape, rows, cols + 3)[..., :cols]
        return storage, view
    assert layout == "heads" and len(batch_shape) == 2
    b0, b1 = batch_shape
    storage = torch.randn(b0, rows, b1, cols, generator=generator)
    return storage, storage.permute(0, 2, 1, 3)


def _kernel(a_view, b_view, inputs: list, b_input: int, out_shape: tuple) -> BmmKernel:
    batch_shape = tuple(a_view.shape[:-2])
    m, k = a_view.shape[-2:]
    n = b_view.shape[-1]
    out = Buffer("out", out_shape, tuple(torch.empty(out_shape).stride()), torch.float32, "kernel")
    return BmmKernel("bmm_0", "bmm", batch_shape, m, n, k, tuple(inputs), (out,),
                     a_view.storage_offset(), tuple(a_view.stride()), b_view.storage_offset(),
                     tuple(b_view.stride()), b_input)



def _tilings(kernel: BmmKernel) -> list[BmmTiling]:
    """The solver's, plus one-row tiles in one-tile groups and mr 5, packed and (where b
    allows) in place."""
    extra = [bmm_template.tiling(kernel, 2, 1, True), bmm_template.tiling(kernel, 1, 5, True)]
    if bmm_template.direct_b(kernel):
        extra.append(bmm_template.tiling(kernel, 2, 3, False))
    extra.append(BmmTiling(block_dim=2, mr=2, mc=2, pack_b=True, workspace=2 * bmm_template.slot_bytes(kernel)))
    wide = [bmm_template.tiling(kernel, 2, 14, True, 64), bmm_template.tiling(kernel, 1, 8, True, 64)]  # AVX-512
    return list(dict.fromkeys(bmm_template.solve(kernel, 2) + extra + wide))


@pytest.mark.unit
def test_tilings_default_first_unique_and_within_the_device_limit():
    a = torch.empty(6, 197, 64)
    v = torch.empty(197, 3 * 384)[:, 768:].view(197, 6, 64).transpose(0, 1)  # v heads of a qkv projection
    kernel = _kernel(a, v, [_flat("a", a), _flat("v", v)], 1, (6, 197, 64))
    options = bmm_template.solve(kernel, 2)
    assert options[0] == BmmTiling(block_dim=2, mr=6, mc=198, pack_b=False, workspace=0)  # 4 whole panels
    assert options[0].tiling_repr == "cpu_bmm;block_dim=2;mr=6;mc=198;b=direct"
    assert len(set(options)) == len(options) and all(o.block_dim <= 2 and o.mc % o.mr == 0 for o in options)
    packed = [o for o in options if o.pack_b]
    assert packed and all(o.workspace == 2 * 64 * 16 * 4 for o in packed)  # a [K][16] slot per thread
    kt = torch.empty(197, 1152)[:, 384:768].view(197, 6, 64).permute(1, 2, 0)  # k^T: read along K
    transposed = bmm_template.solve(_kernel(a, kt, [_flat("a", a)], 0, (6, 197, 197)), 1)
    assert all(o.pack_b for o in transposed) and {o.mr for o in transposed} == {4, 6}
    tiny = torch.empty(1, 3, 5)
    assert bmm_template.solve(_kernel(tiny, tiny.transpose(1, 2), [_flat("a", tiny)], 0, (1, 3, 3)), 4)[0] \
        .block_dim == 1  # 90 flops: one thread first
    with pytest.raises(ValueError, match=r"bmm_0: b \(strides \[64, 1, 1152\]\) cannot be read in place"):
        bmm_template.tiling(_kernel(a, kt, [_flat("a", a)], 0, (6, 197, 197)), 1, 6, False)


@pytest.mark.unit
def test_kernel_id_hashes_the_layouts_not_the_name():
    a, b = torch.empty(2, 5, 7), torch.empty(2, 7, 3)
    base = _kernel(a, b, [_flat("a", a), _flat("b", b)], 1, (2, 5, 3))
    renamed = BmmKernel(**{**base.__dict__, "name": "other"})
    assert renamed.kernel_id == base.kernel_id
    moved = BmmKernel(**{**base.__dict__, "b_offset": 1})
    assert moved.kernel_id != base.kernel_id
    assert str(base).splitlines() == ["bmm bmm_0 [b0<2, m<5, n<3, k<7]",
                                      "  in0: float32 a[b, m, k] at 0 + b0*35 + m*7 + k*1",
                                      "  in1: float32 b[b, k, n] at 0 + b0*21 + k*3 + n*1",
                                      "  out0: float32[2, 5, 3] = a @ b"]


SIZES = [1, 5, 17, 33, 67]
CASES = [  # (batch_shape, M, K, N, a layout, b layout)
    *[((1,), m, k, n, "contiguous", "contiguous") for m, k, n in [(1, 1, 1), (5, 17, 33), (67, 5, 1), (17, 67, 5)]],
    *[((3,), m, k, n, "padded", "transposed") for m, k, n in [(33, 64 + 3, 17), (1, 5, 67), (67, 33, 33)]],
    *[((4,), m, k, n, "transposed", "padded") for m, k, n in [(17, 1, 64 + 3), (5, 67, 16), (33, 33, 1)]],
    ((2, 3), 17, 33, 67, "heads", "heads"),
    ((2, 3), 67, 17, 5, "heads", "transposed"),
    ((2,), 64, 64, 64, "contiguous", "transposed"),
]


@pytest.mark.native
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{'x'.join(map(str, c[0]))}-{c[1]}x{c[2]}x{c[3]}-{c[4]}-{c[5]}")
def test_every_tiling_matches_torch_bmm(case, tmp_path):
    batch_shape, m, k, n, a_layout, b_layout = case
    generator = torch.Generator().manual_seed(m * 1000 + k * 10 + n)
    a_store, a = _operand(batch_shape, m, k, a_layout, generator)
    b_store, b = _operand(batch_shape, k, n, b_layout, generator)
    kernel = _kernel(a, b, [_flat("a", a_store), _flat("b", b_store)], 1, (*batch_shape, m, n))
    expected = torch.matmul(a, b)
    tilings = _tilings(kernel)
    launcher = compile_tilings(kernel, tilings, tmp_path)
    for tiling in tilings:
        out = torch.full(expected.shape, float("nan"))
        launcher.launch(tiling.kernel_key, [a_store, b_store, out])
        torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL, msg=lambda text: f"{tiling}: {text}")


@pytest.mark.native
def test_q_and_k_slices_of_one_qkv_buffer_as_one_input(tmp_path):
    """ViT's ``q @ k^T``: both operands are views of one projection [197, 3 * 384] (six
    heads of 64), the kernel gets that buffer once."""
    qkv = torch.randn(197, 3 * 384, generator=torch.Generator().manual_seed(7))
    heads = qkv.view(197, 3, 6, 64)
    q, k = heads[:, 0].transpose(0, 1), heads[:, 1].permute(1, 2, 0)
    kernel = _kernel(q, k, [_flat("qkv", qkv)], 0, (6, 197, 197))
    tilings = _tilings(kernel)
    launcher = compile_tilings(kernel, tilings, tmp_path)
    for tiling in tilings:
        out = torch.full((6, 197, 197), float("nan"))
        launcher.launch(tiling.kernel_key, [qkv, out])
        torch.testing.assert_close(out, torch.bmm(q, k), atol=ATOL, rtol=RTOL,
                                   msg=lambda text: f"{tiling}: {text}")


@pytest.fixture
def unfused_attention(monkeypatch):
    """Attention blocks lowered as two bmm steps around the softmax (no fused attention step,
    ``attention_lowering``): the bmm steps these tests check are then top-level steps."""
    monkeypatch.setattr(attention_lowering, "find", lambda graph: {})


def _template_wins(functions, device=None):
    """``autotune.time_functions`` stand-in: the last variant (the template) is fastest."""
    for fn in functions:
        fn()
    return fixed_timing([2.0] * (len(functions) - 1) + [1.0])


def _bmm_steps(path) -> list[GemmStep]:
    from aotpack.build import export_model
    graph = lowering.lower(export_model(load_model(path), None), backends.get("cpu"))
    return [s for s in gemm_steps(graph) if s.kind == "bmm"]


@pytest.mark.unit
def test_attention_bmms_become_steps_with_aten_and_template(unfused_attention):
    steps = _bmm_steps(ATTENTION)
    assert [(s.shape, [v.name for v in s.variants]) for s in steps] == [
        ("6x17x8x17", ["aten", "template"]), ("6x17x17x8", ["aten", "template"]),
        ("1x5x17x3", ["aten", "template"])]
    kernels = [s.variants[1].steps[0].kernel for s in steps]
    assert [k.batch_shape for k in kernels] == [(2, 3), (2, 3), (1,)]  # q, k, v: batch x heads of qkv
    assert all(isinstance(k, BmmKernel) for k in kernels)
    qkv = kernels[0].inputs[0]
    assert kernels[0].inputs == (qkv,) and kernels[1].inputs[1] is qkv  # read in place, no copies
    assert (kernels[0].a_offset, kernels[0].a_strides) == (0, (17 * 72, 8, 72, 1))
    assert (kernels[0].b_offset, kernels[0].b_strides) == (24, (17 * 72, 8, 1, 72))  # k^T: along K
    assert (kernels[1].b_offset, kernels[1].b_strides) == (48, (17 * 72, 8, 72, 1))  # v: in place
    # ATen gets q, k^T, v copied, inside its own variant (the template's build drops them)
    assert [type(s).__name__ for s in steps[0].variants[0].steps] == ["KernelCall", "KernelCall", "ExternCall"]


@pytest.mark.native
def test_attention_model_with_the_template_matches_eager_natively(tmp_path, cache_dir, unfused_attention):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(autotune, "time_functions", _template_wins)
        patch.setattr(choice_cache, "read_all", lambda *args: {})
        patch.setattr(choice_cache, "write_all", lambda *args: None)
        result = build(ATTENTION, tmp_path, settings=Settings.from_env(topn=2, cache_dir=cache_dir))
    bmms = [g for g in [c for c in result.manifest["choices"] if c["kind"] != "kernel"] if g["kind"] == "bmm"]
    assert [g["winner"] for g in bmms] == ["template"] * 3
    assert all(g["candidates"] == ["aten", "template"] and len(g["timings_us"]) == 2 and g["visited"]
               for g in bmms)
    names = [k["name"] for k in result.manifest["kernels"]]
    assert sum(1 for name in names if name.startswith("bmm_")) == 3
    rows = [r for r in report.build_report(result.manifest, None)["choices"] if r["kind"] == "bmm"]  # inspect's table
    assert [(r["choice"], r["shape"], r["winner"], r["candidates"], r["best_us"], r["worst_us"]) for r in rows] == [
        ("bmm_bmm", "6x17x8x17+none", "template", 2, 1.0, 2.0),
        ("bmm_bmm_1", "6x17x17x8+none", "template", 2, 1.0, 2.0),
        ("bmm_mm", "1x5x17x3+none", "template", 2, 1.0, 2.0)]
    assert_native_parity(result.archive, ATTENTION, tmp_path, atol=ATOL, rtol=1e-4)


@pytest.mark.native
def test_transformer_block_with_the_template_matches_eager_natively(tmp_path, cache_dir, unfused_attention):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(autotune, "time_functions", _template_wins)
        patch.setattr(choice_cache, "read_all", lambda *args: {})
        patch.setattr(choice_cache, "write_all", lambda *args: None)
        result = build(SAMPLES / "transformer_block.py", tmp_path,
                       settings=Settings.from_env(topn=1, cache_dir=cache_dir))
    bmms = [g for g in [c for c in result.manifest["choices"] if c["kind"] != "kernel"] if g["kind"] == "bmm"]
    assert [(g["shape"], g["winner"]) for g in bmms] == [("16x128x64x128", "template"), ("16x128x128x64", "template")]
    # q, k^T and v are read in place as batch x heads views: only the context's copy (proj's input) is left
    copies = [k["name"] for k in result.manifest["kernels"] if k["name"].startswith("fused_clone")]
    assert copies == ["fused_clone_9"]
    assert_native_parity(result.archive, SAMPLES / "transformer_block.py", tmp_path, atol=1e-4, rtol=1e-4)
