"""aotpack's fused attention template (``kernel_ir.AttentionKernel``, ``attention_lowering``,
``backends/cpu/attention_template``): the pattern found in exported attention blocks, the
tilings offered, and every tiling of attention blocks at odd sequence lengths, head dims 32/64/80,
batch > 1, with and without masks (additive, boolean, padding broadcast over heads and
queries, causal), compiled and launched against eager (float32: |ours - eager| <= 1e-5 +
1e-4 * |eager|: the softmax's sums run in another order, blockwise); then whole models built
with the template forced to win, run natively against eager."""
from __future__ import annotations

import textwrap

import pytest
import torch

from aotpack import backends
from aotpack.tune import autotune
from aotpack.ir import gemm
from aotpack.tune import choice_cache
from aotpack.lower import lowering
from aotpack.tune import timing
from aotpack.backends.cpu import attention_template
from aotpack.backends.cpu.attention_template import AttentionTiling
from aotpack.build import build, export_model
from aotpack.config import Settings
from aotpack.frontend.export import load_model
from aotpack.ir.gemm import gemm_steps
from aotpack.ir.template_kernels import AttentionKernel
from helpers import MODELS, SAMPLES, assert_native_parity, compile_tilings, fixed_timing

ATOL, RTOL = 1e-5, 1e-4

MODEL = '''
import math
import torch
from torch import nn

B, H, M, N, D, DV, MASK = {b}, {h}, {m}, {n}, {d}, {dv}, "{mask}"


class Model(nn.Module):
    def forward(self, q, k, v, *mask):
        s = q @ k.transpose(-2, -1)
        s = s / math.sqrt(D) if MASK != "add" else s * (1.0 / math.sqrt(D))
        if MASK in ("add", "padding"):
            s = s + mask[0]
        elif MASK in ("bool", "masked_row"):
            s = s.masked_fill(mask[0], float("-inf"))
        elif MASK == "causal":
            s = s + torch.full((M, N), float("-inf")).triu(1)
        return torch.softmax(s, dim=-1) @ v


def model():
    return Model().eval()


def example_inputs():
    g = torch.Generator().manual_seed(B * 1000 + M + N + D)
    q, k = torch.randn(B, H, M, D, generator=g), torch.randn(B, H, N, D, generator=g)
    v = torch.randn(B, H, N, DV, generator=g)
    if MASK == "add":
        return q, k, v, torch.randn(1, H, M, N, generator=g)
    if MASK == "bool":
        mask = torch.rand(B, 1, M, N, generator=g) > 0.7
        mask[..., 0] = False  # no row fully masked
        return q, k, v, mask
    if MASK == "masked_row":  # query row 1 sees no key: eager's softmax gives NaN there, so must the kernel
        mask = torch.rand(B, 1, M, N, generator=g) > 0.7
        mask[..., 0] = False
        mask[..., 1, :] = True
        return q, k, v, mask
    if MASK == "padding":  # DistilBERT's: the last keys of each sequence masked, same for every head and query
        mask = torch.zeros(B, 1, 1, N)
        mask[..., N - N // 4:] = torch.finfo(torch.float32).min
        return q, k, v, mask
    return q, k, v
'''


def _model_file(tmp_path, b=1, h=2, m=7, n=7, d=32, dv=None, mask="none"):
    path = tmp_path / "attention_case.py"
    path.write_text(textwrap.dedent(MODEL.format(b=b, h=h, m=m, n=n, d=d, dv=dv or d, mask=mask)))
    return path


def _attention_steps(path):
    graph = lowering.lower(export_model(load_model(path), None), backends.get("cpu"))
    return graph, [s for s in gemm_steps(graph) if s.kind == "attention"]


def _tilings(kernel: AttentionKernel) -> list[AttentionTiling]:
    """The solver's, plus one-row and 5-row items, 64 keys a block, and AVX-512 widths."""
    extra = [attention_template.tiling(kernel, 2, 1, 64), attention_template.tiling(kernel, 1, 5, 192),
             attention_template.tiling(kernel, 2, 64, 64, 64), attention_template.tiling(kernel, 1, 7, 128, 64)]
    return list(dict.fromkeys(attention_template.solve(kernel, 2) + extra))


@pytest.mark.unit
def test_vit_block_becomes_one_step_with_unfused_and_fused_variants(tmp_path):
    _, steps = _attention_steps(SAMPLES / "transformer_block.py")
    assert [(s.name, s.shape, s.epilogue) for s in steps] == [("attention_bmm_1", "16x128x128x64x64", "div")]
    assert [v.name for v in steps[0].variants] == [
        "unfused:aten+aten", "unfused:aten+template", "unfused:template+aten", "unfused:template+template",
        "template"]
    kernel = steps[0].variants[-1].steps[0].kernel
    assert str(kernel).splitlines() == [
        "attention attention_8 [b0<4, b1<4, m<128, n<128, d<64, dv<64]",
        "  in0: float32 q[b, m, d] at 0 + b0*98304 + b1*64 + m*768 + d*1",
        "  in0: float32 k[b, n, d] at 256 + b0*98304 + b1*64 + n*768 + d*1",
        "  in0: float32 v[b, n, dv] at 512 + b0*98304 + b1*64 + n*768 + dv*1",
        "  s = s / 8.0",
        "  out0: float32[16, 128, 64] = softmax_n(s) @ v"]
    # the unfused variants hold the two bmms and the softmax kernel; the fused one only itself
    unfused = steps[0].variants[3].steps
    assert [type(s).__name__ for s in unfused] == ["KernelCall"] * 3
    assert [s.kernel.name.split("_")[0] for s in unfused] == ["bmm", "fused", "bmm"]


@pytest.mark.unit
@pytest.mark.parametrize("mask, ops", [
    ("add", ["mul", "add"]), ("bool", ["div", "fill"]), ("padding", ["div", "add"]), ("causal", ["div", "add"])])
def test_masks_become_score_ops(tmp_path, mask, ops):
    _, steps = _attention_steps(_model_file(tmp_path, b=2, mask=mask))
    kernel = steps[0].variants[-1].steps[0].kernel
    assert [op.kind for op in kernel.ops] == ops
    strides = {"add": (0, 49, 7, 1), "bool": (49, 0, 7, 1), "padding": (7, 0, 0, 1), "causal": (0, 0, 7, 1)}
    assert kernel.ops[1].mask.strides == strides[mask]  # broadcast over [batch, heads, m, n]


@pytest.mark.unit
def test_a_close_call_goes_to_the_fused_kernel_then_the_unfused_templates():
    """PGO's winner rule (``timing.decide``) with the attention variants' ranks: a variant
    within the tie margin of a faster one is kept when it ranks first, so the all-template
    unfused variant stays over ATen's when the two are within the noise."""
    names = ["unfused:aten+aten", "unfused:aten+template", "unfused:template+aten", "unfused:template+template",
             "template"]
    ranks = [gemm.OWN_KERNEL_RANKS.get(name, len(gemm.OWN_KERNEL_RANKS)) for name in names]
    close = timing.decide([fixed_timing([100.0, 101.0, 101.0, 100.5, 100.2])], ranks)
    assert names[close.index] == "template"
    fused_slow = timing.decide([fixed_timing([100.0, 101.0, 101.0, 100.5, 130.0])], ranks)
    assert names[fused_slow.index] == "unfused:template+template"


@pytest.mark.unit
def test_tilings_default_first_unique_and_aligned(tmp_path):
    _, steps = _attention_steps(_model_file(tmp_path, b=1, h=6, m=197, n=197, d=64))
    kernel = steps[0].variants[-1].steps[0].kernel
    options = attention_template.solve(kernel, 2)
    # all 197 rows an item (6 items, 3 per thread); a sub-block of 48 rows of scores, the item's accumulators
    assert options[0] == AttentionTiling(block_dim=2, bm=198, bn=128, workspace=2 * 4 * (
        64 * 128 + 48 * 128 + 198 * 64 + 3 * 208), vector_bytes=32)
    assert options[0].tiling_repr == "cpu_attention;block_dim=2;bm=198;bn=128"
    assert [(o.block_dim, o.bm, o.bn) for o in options] == [
        (2, 198, 128), (1, 198, 128), (2, 48, 128), (2, 96, 128), (2, 198, 64), (2, 198, 256)]
    _, two_heads = _attention_steps(_model_file(tmp_path, b=1, h=2, m=197, n=197, d=64))
    assert attention_template.solve(two_heads[0].variants[-1].steps[0].kernel, 2)[0].bm == 102  # 4 items
    assert len(set(options)) == len(options) and all(o.bn % 64 == 0 for o in options)
    with pytest.raises(ValueError, match=r"attention_\d+: bn 48 must be a positive multiple of 64, bm 8 >= 1"):
        attention_template.tiling(kernel, 1, 8, 48)


CASES = [  # (batch, heads, M, N, D, DV, mask)
    (1, 1, 1, 1, 32, 32, "none"),
    (2, 3, 7, 7, 32, 32, "none"),
    (1, 6, 197, 197, 64, 64, "none"),
    (2, 2, 257, 257, 80, 80, "add"),
    (2, 3, 7, 257, 64, 32, "bool"),
    (3, 2, 33, 130, 80, 80, "padding"),
    (1, 2, 65, 65, 32, 32, "causal"),
    (1, 2, 19, 70, 32, 40, "none"),  # dv not a multiple of 16: v packed per key block
    (2, 1, 5, 130, 32, 32, "masked_row"),
]


def _tensors(graph, kernel, inputs: tuple) -> list[torch.Tensor]:
    by_name = {buf.name: tensor for buf, tensor in zip(graph.inputs, inputs)}
    by_name.update(graph.constant_tensors)
    return [by_name[buf.name] for buf in kernel.inputs]


@pytest.mark.native
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_every_tiling_matches_eager(case, tmp_path):
    b, h, m, n, d, dv, mask = case
    path = _model_file(tmp_path, b, h, m, n, d, dv, mask)
    graph, steps = _attention_steps(path)
    kernel = steps[0].variants[-1].steps[0].kernel
    loaded = load_model(path)
    expected = loaded.module(*loaded.example_inputs)
    tensors = _tensors(graph, kernel, loaded.example_inputs)
    tilings = _tilings(kernel)
    launcher = compile_tilings(kernel, tilings, tmp_path / "kernels")
    for tiling in tilings:
        out = torch.full((b * h, m, dv), float("nan"))
        launcher.launch(tiling.kernel_key, [*tensors, out])
        torch.testing.assert_close(out.view(expected.shape), expected, atol=ATOL, rtol=RTOL, equal_nan=True,
                                   msg=lambda text: f"{tiling}: {text}")
    assert expected.isnan().any().item() == (mask == "masked_row")


@pytest.mark.native
def test_whisper_length_1500(tmp_path):
    path = _model_file(tmp_path, 1, 2, 1500, 1500, 64)
    graph, steps = _attention_steps(path)
    kernel = steps[0].variants[-1].steps[0].kernel
    loaded = load_model(path)
    expected = loaded.module(*loaded.example_inputs)
    tiling = attention_template.solve(kernel, 2)[0]
    launcher = compile_tilings(kernel, [tiling], tmp_path / "kernels")
    out = torch.full((2, 1500, 64), float("nan"))
    launcher.launch(tiling.kernel_key, [*_tensors(graph, kernel, loaded.example_inputs), out])
    torch.testing.assert_close(out.view(expected.shape), expected, atol=ATOL, rtol=RTOL)


def _template_wins(functions, device=None):
    """``autotune.time_functions`` stand-in: the last variant (the template) is fastest."""
    for fn in functions:
        fn()
    return fixed_timing([2.0] * (len(functions) - 1) + [1.0])


def _unfused_templates_win(functions, device=None):
    """``autotune.time_functions`` stand-in: ``unfused:template+template`` (variant 3 of an
    attention step of five) is fastest; for any other step the last variant."""
    for fn in functions:
        fn()
    winner = 3 if len(functions) == 5 else len(functions) - 1
    return fixed_timing([1.0 if i == winner else 2.0 for i in range(len(functions))])


def _build_with_template(path, tmp_path, cache_dir, timing=_template_wins):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(autotune, "time_functions", timing)
        patch.setattr(choice_cache, "read_all", lambda *args: {})
        patch.setattr(choice_cache, "write_all", lambda *args: None)
        return build(path, tmp_path / "out", settings=Settings.from_env(topn=1, cache_dir=cache_dir))


@pytest.mark.native
@pytest.mark.parametrize("model", ["transformer_block", "attention_bmm"])
def test_models_with_the_template_match_eager_natively(model, tmp_path, cache_dir):
    path = SAMPLES / "transformer_block.py" if model == "transformer_block" else MODELS / "attention_bmm.py"
    result = _build_with_template(path, tmp_path, cache_dir)
    steps = [g for g in [c for c in result.manifest["choices"] if c["kind"] != "kernel"] if g["kind"] == "attention"]
    assert [g["winner"] for g in steps] == ["template"]
    names = [k["name"] for k in result.manifest["kernels"]]
    assert sum(1 for name in names if name.startswith("attention_")) == 1
    assert not any(name.startswith("fused_amax") or name.startswith("bmm_") and model != "attention_bmm"
                   for name in names)
    assert_native_parity(result.archive, path, tmp_path, atol=1e-4, rtol=1e-4)


@pytest.mark.native
def test_unfused_variant_winning_matches_eager_natively(tmp_path, cache_dir):
    """The unfused variant's flattened steps (two bmm template kernels around the softmax
    kernel) run as the step when they win."""
    path = SAMPLES / "transformer_block.py"
    result = _build_with_template(path, tmp_path, cache_dir, _unfused_templates_win)
    assert [g["winner"] for g in [c for c in result.manifest["choices"] if c["kind"] != "kernel"] if g["kind"] == "attention"] == [
        "unfused:template+template"]
    names = [k["name"] for k in result.manifest["kernels"]]
    assert sum(1 for name in names if name.startswith("bmm_")) == 2
    assert not any(name.startswith("attention_") for name in names)
    assert_native_parity(result.archive, path, tmp_path, atol=1e-4, rtol=1e-4)


@pytest.mark.native
def test_distilbert_style_padding_mask_model_natively(tmp_path, cache_dir):
    """The mask computed in the model from an int64 attention mask (a fused kernel writes it
    before the step), added after the scale, as DistilBERT's eager attention does."""
    path = tmp_path / "padding_model.py"
    path.write_text(textwrap.dedent('''
        import math
        import torch
        from torch import nn

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.qkv = nn.Linear(48, 144)

            def forward(self, x, attention_mask):
                q, k, v = self.qkv(x).view(1, 9, 3, 4, 12).permute(2, 0, 3, 1, 4)
                mask = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
                s = q @ k.transpose(-2, -1) * (1 / math.sqrt(12)) + mask
                return (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(1, 9, 48)

        def model():
            torch.manual_seed(0)
            return Model().eval()

        def example_inputs():
            mask = torch.ones(1, 9, dtype=torch.int64)
            mask[:, 6:] = 0
            return torch.randn(1, 9, 48, generator=torch.Generator().manual_seed(1)), mask
    '''))
    result = _build_with_template(path, tmp_path, cache_dir)
    assert [g["winner"] for g in [c for c in result.manifest["choices"] if c["kind"] != "kernel"] if g["kind"] == "attention"] == ["template"]
    assert_native_parity(result.archive, path, tmp_path, atol=1e-4, rtol=1e-4)
