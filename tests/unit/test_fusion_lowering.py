"""Lowering decisions of the newly fused ops, checked on the IR (no compiler needed)."""
import torch

from aotpack import backends
from aotpack.ir import gemm
from aotpack.frontend.export import decomposition_table
from aotpack.lower.lowering import lower



from helpers import lower_function as _lower  # noqa: E402


def _externs(graph) -> list[str]:
    return [str(call.op) for call in graph.extern_calls()]


def test_integer_division_fuses_only_by_a_nonzero_number():
    n = torch.arange(-6, 6)
    assert _externs(_lower(lambda n: (n // -4, n % 3, torch.div(n, 5, rounding_mode="trunc")), n)) == []
    assert _externs(_lower(lambda n: n // 0, n)) == ["aten.div.Tensor_mode"]      # eager raises
    assert _externs(_lower(lambda n: n % (n + 7), n)) == ["aten.remainder.Tensor"]  # a tensor divisor
    assert _externs(_lower(lambda x: (x // 0.0, x % x.t()), torch.randn(3, 3))) == []  # floats: inf/nan


def test_std_and_std_mean_are_row_kernels():
    x = torch.randn(4, 5)
    std = _lower(lambda x: torch.std(x, -1), x)
    (kernel,) = std.kernels  # sqrt computed per row in the variance kernel
    assert kernel.row_outputs == (0,) and "sqrt" in kernel.format()
    both = _lower(lambda x: torch.std_mean(x, -1), x)
    # var and mean each read only the input (the mean without kept dims was a kernel of its own)
    assert len(both.kernels) == 2 and all([b.kind for b in k.inputs] == ["input"] for k in both.kernels)


def test_residual_sum_is_an_extra_output_of_the_layer_norm_kernel_only_when_read_later():
    norm = torch.nn.LayerNorm(256).eval()
    x, y = torch.randn(64, 256), torch.randn(64, 256)  # too big to recompute in both users

    def residual(x, y):
        h = x * 2 + y
        return norm(h) * 3, h + 1

    graph = _lower(residual, x, y)
    assert [len(k.outputs) for k in graph.kernels] == [2, 1]  # LN writes h, the last add reads it
    only_norm = _lower(lambda x, y: norm(x * 2 + y), x, y)
    assert [len(k.outputs) for k in only_norm.kernels] == [1]  # nobody else reads the sum
    norm = torch.nn.LayerNorm(8).eval()
    small = _lower(residual, x[:3, :8], y[:3, :8])
    assert [len(k.outputs) for k in small.kernels] == [1, 1]  # 3x8: both kernels recompute h


def test_bool_sum_accumulates_in_int64():
    graph = _lower(lambda x: ((x > 0).sum(-1), (x > 0).prod(-1)), torch.randn(3, 7))
    assert _externs(graph) == []
    assert all(k.outputs[0].dtype == torch.int64 for k in graph.kernels)


def test_cat_is_one_kernel_with_its_producers_and_consumer():
    """cat(relu(x), y * 2).exp() along the inner dim: one kernel, a Piecewise over j
    with the bounds of the inputs' slices, no extern call."""
    x, y = torch.randn(3, 5), torch.randn(3, 7)
    graph = _lower(lambda x, y: torch.cat([x.relu(), y * 2.0], dim=1).exp(), x, y)
    (kernel,) = graph.kernels
    assert _externs(graph) == [] and "piecewise[j](<5: %2, <12: %4)" in kernel.format()


def test_a_cat_piece_is_computed_only_inside_its_branch():
    """cat along the outer dim of broadcast columns: the select runs once per row, and
    each piece's load stays inside its branch (outside, it would read past the input)."""
    from aotpack.backends.cpu.kernel_writer import build_body

    a, b = torch.randn(3, 1), torch.randn(2, 1)
    graph = _lower(lambda a, b: torch.cat([a, b], dim=0).expand(5, 8) + 1.0, a, b)
    (kernel,) = graph.kernels
    body = build_body(kernel)
    assert body.row_lines == ["float t1;", "if (i0 < 3) {", "  const float t2 = in0[i0];", "  t1 = t2;",
                              "} else {", "  const float t3 = in1[i0 + -3];", "  t1 = t3;", "}",
                              "const float t4 = static_cast<float>((t1 + static_cast<float>(1.0)));"]


def test_a_cat_piece_that_is_whole_rows_is_selected_without_j():
    """An inner cat reshaped and permuted so each piece is whole rows of 13 (views_cat): the
    compare drops j (the rest is a multiple of 13 and j < 13), so GCC branches once per
    row instead of masking both pieces' loads in the j loop; where j can cross a bound
    (a bound off the grain, or j alone) the compare keeps it."""
    from aotpack.backends.cpu.kernel_writer import build_body, piece_condition
    from aotpack.ir.index import Index

    x, y = torch.randn(4, 13), torch.randn(4, 26)
    graph = _lower(lambda x, y: torch.cat([x, y], dim=1).reshape(4, 3, 13).permute(1, 0, 2).relu(), x, y)
    (kernel,) = graph.kernels
    conditions = [line.strip() for line in build_body(kernel).write_lines if "if (" in line]
    assert conditions == ["if (13 * i0 < 13) {"]
    rows = Index.var("j", 32) + Index.var("i1", 4).scale(32) + 256
    assert piece_condition(rows, 256) == "32 * i1 + 256 < 256"
    assert piece_condition(rows, 250) == "32 * i1 + j + 256 < 250"  # off the grain
    assert piece_condition(Index.var("j", 33) + Index.var("i1", 4).scale(32), 64) == "32 * i1 + j < 64"  # j reaches 32
    assert piece_condition(Index.var("j", 32).scale(2), 32) == "2 * j < 32"  # j alone


def test_an_inner_cat_cuts_the_write_loop_where_its_piece_changes():
    """cat along j: the j loop is cut at 5, so in each segment GCC folds the compare and
    reads only that piece (views_cat's kernel: 16.7 -> 2.1 us); more than MAX_J_SPLITS
    cuts keep one loop."""
    from aotpack.backends.cpu.kernel_writer import MAX_J_SPLITS, build_body, j_segments

    x, y = torch.randn(4, 5), torch.randn(4, 8)
    graph = _lower(lambda x, y: torch.cat([x, y * 2.0], dim=1) + 1.0, x, y)
    (kernel,) = graph.kernels
    assert build_body(kernel).j_splits == (5,)
    assert j_segments((5,), 13) == [(0, 5), (5, 13)]
    assert j_segments(tuple(range(1, MAX_J_SPLITS + 2)), 13) == [(0, 13)]
    assert j_segments((), 13) == [(0, 13)]
    assert j_segments((0, 5, 13, 20), 13) == [(0, 5), (5, 13)]  # cuts outside (0, cols) dropped
    # a cat inside a row sum: its j runs over the reduction's 13, not the write loop's 7
    a, b, y = torch.randn(4, 10), torch.randn(4, 3), torch.randn(4, 7)
    graph = _lower(lambda a, b, y: torch.cat([a, b], dim=1).sum(-1, keepdim=True) + y, a, b, y)
    (kernel,) = graph.kernels
    assert kernel.inner_size == 7 and build_body(kernel).j_splits == ()


def test_flip_is_a_reversed_index_in_the_consumer():
    x = torch.randn(4, 64)
    (kernel,) = _lower(lambda x: x.flip(0, 1) * 3.0, x).kernels
    assert "load in0[64 * (3 - (i0)) + (63 - (j))]" in kernel.format()
    assert kernel.access.strided and kernel.access.divisors == ()  # stride -1 along j, no split
    # a narrow row merged into j: the j // 6 and j % 6 inside the reversals are split back
    (narrow,) = _lower(lambda x: x.flip(0, 1) * 3.0, torch.randn(4, 6)).kernels
    assert narrow.outer_shape == (4,) and narrow.inner_size == 6


def test_input_free_masks_and_positions_are_folded_into_constants():
    """arange/full/triu and the ops on them read no input: computed at build time and
    shipped as constants, so only the op reading the input is left (one kernel)."""
    from aotpack.lower.constant_folding import MAX_FOLDED_BYTES

    def masked(x):
        positions = torch.arange(x.shape[-1]) * 2 + 1
        mask = torch.full((x.shape[-1], x.shape[-1]), float("-inf")).triu(1)
        return x @ torch.zeros(5, 5) + mask + positions
    graph = gemm.resolve(_lower(masked, torch.randn(5, 5)), {})  # x @ zeros as its ATen variant
    folded = [b.name for b in graph.constants if b.name.startswith("_folded_")]
    assert _externs(graph) == ["aten.mm.default"] and len(graph.kernels) == 1
    assert len(folded) == 3  # the zeros, the mask and the positions, each read by the kernel
    mask = next(t for name, t in graph.constant_tensors.items() if name in folded and t.shape == (5, 5)
                and t.isinf().any())
    assert torch.equal(mask, torch.full((5, 5), float("-inf")).triu(1))

    big = MAX_FOLDED_BYTES // 4 + 1  # float32 elements: one more than the limit allows
    graph = _lower(lambda x: x + torch.arange(big, dtype=torch.float32) * 3.0, torch.randn(big))
    assert [b.name for b in graph.constants if b.name.startswith("_folded_")] == []
    seeded = _lower(lambda x: x + torch.rand(4), torch.randn(4))  # never folded: random
    assert _externs(seeded) == ["aten.rand.default"]


def test_rms_norm_with_dtype_round_trip_is_one_kernel():
    """LLaMA's RMSNorm: ``.to(dtype)`` leaves an assertion node reading the normalised
    value; it is no second user, so the weight multiply joins the row kernel."""
    weight = torch.randn(128)

    def rms_norm(x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return weight * h.to(x.dtype)
    (kernel,) = _lower(rms_norm, torch.randn(1, 64, 128)).kernels
    assert kernel.format().count("mul(") == 2 and kernel.has_reduction


def test_a_plain_copy_read_by_an_aten_call_is_passed_as_a_view():
    """bmm(a.transpose(1, 2).contiguous(), b): the copy only re-reads ``a`` at an affine
    index, so bmm gets that strided view of ``a`` and no copy kernel runs; a graph
    output that is such a copy still gets its own buffer (outputs never alias inputs)."""
    a, b = torch.randn(2, 5, 3), torch.randn(2, 5, 4)
    lowered = _lower(lambda a, b: torch.bmm(a.transpose(1, 2).contiguous(), b), a, b)
    (step,) = gemm.gemm_steps(lowered)
    template = step.variants[1].steps[0].kernel  # the bmm template reads the same view
    assert (template.a_offset, template.a_strides) == (0, (15, 1, 3))
    graph = gemm.resolve(lowered, {})  # the ATen variant
    (call,) = graph.extern_calls()
    assert graph.kernels == [] and call.args[0].value[1:] == ((2, 3, 5), (15, 1, 3), 0)
    copied = _lower(lambda a: a.transpose(1, 2).contiguous(), a)
    assert len(copied.kernels) == 1


def test_a_value_split_into_head_and_tail_is_not_realised_for_its_two_users():
    """x[:4] and x[4:] read each element of a computed value once: no buffer for it;
    overlapping slices (x[:5], x[4:]) would recompute, so that value gets its kernel."""
    x = torch.randn(12, 700)  # too big to recompute under the budget

    def split(x, a, b):
        y = (x * 2.0).exp() + x
        return torch.cat([y[a:].flip(0), y[:b] * 3.0], dim=0)
    assert len(_lower(lambda x: split(x, 4, 4), x).kernels) == 1
    assert len(_lower(lambda x: split(x, 4, 5), x).kernels) == 2


def test_a_view_of_a_constant_is_not_folded_into_a_copy():
    """table[:, :1] read by a run-time op stays a view of the stored table (no second
    copy of its data), while arithmetic on it is still folded."""
    class Table(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("table", torch.randn(6, 4))

        def forward(self, x):
            return x + self.table[:, :1], x * (self.table[:, 1:2] * 2.0).exp()
    ep = torch.export.export(Table(), (torch.randn(6, 1),), strict=False).run_decompositions(decomposition_table())
    graph = lower(ep, backends.get("cpu"))
    folded = [b for b in graph.constants if b.name.startswith("_folded_")]
    assert [b.shape for b in folded] == [(6, 1)] and "table" in [b.name for b in graph.constants]


def test_nested_divisions_of_the_inner_index_split_the_domain_twice():
    """views_cat's pattern: halves swapped by a cat, transposed, read with step 2, then
    heads merged back into rows of 1024: its loads read ``(j % 64) % 32`` and
    ``(j % 64) / 32``, so j splits twice, into (16, 2, 32), and every load is affine in j."""
    def heads(x, y):
        a, b = x.chunk(2, dim=-1)
        z = torch.cat([b, a * 2.0], dim=-1).transpose(0, 1).reshape(16, 512)
        w = torch.cat([z[:, ::2] + z[:, 1::2], y], dim=1)  # [16, 512]
        return w.view(16, 8, 64).permute(1, 0, 2).reshape(8, 1024).relu()
    (kernel,) = _lower(heads, torch.randn(8, 16, 64), torch.randn(16, 256)).kernels
    assert (kernel.outer_shape, kernel.inner_size) == ((8, 16, 2), 32)
    assert kernel.access.divisors == () and "j) /" not in kernel.format() and "j) %" not in kernel.format()
