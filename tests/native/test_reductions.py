"""Reduction loop forms (online softmax, column, split) against eager PyTorch.

Each model is lowered once; every candidate of the loop form under test is compiled and
run in Python mode (the archive's kernels, launched through their wrappers), and each
one's outputs are compared with eager. Tolerances: softmax 1e-6 absolute (float32
outputs <= 1); sums 1e-5 relative + 1e-5 absolute (float lanes and double accumulators,
summed in another order than ATen's).
"""
from __future__ import annotations

import dataclasses
import math
import os
import textwrap

import pytest
import torch

from aotpack import backends
from aotpack.tune import cache
from aotpack.tune import candidates
from aotpack.tune import compile as compile_stage
from aotpack.tune.autotune import PythonModeRun
from aotpack.backends.cpu import kernel_writer, lane_sum, renderer, softmax_store, tiling
from aotpack.config import Settings
from aotpack.frontend.export import export_model, load_model_file
from aotpack.ir.kernel import online_softmax_pairs
from aotpack.lower.lowering import lower
from aotpack.build import build
from aotpack.archive.writer import read_manifest
from helpers import assert_native_parity


DEVICE_LIMIT = 4  # split needs rows < device limit: 4 threads (oversubscribed on 2 cores is fine)


def write_model(tmp_path, name: str, forward: str, *inputs: str):
    """A model file whose ``forward(x, x1, x2, ...)`` runs ``forward`` on ``inputs`` (expressions
    over a seeded generator ``g``)."""
    path = tmp_path / f"{name}.py"
    body = textwrap.indent(textwrap.dedent(forward).strip(), " " * 8)
    names = ", ".join(["x"] + [f"x{k}" for k in range(1, len(inputs))])
    path.write_text(f"import torch\n\n\nclass M(torch.nn.Module):\n    def forward(self, {names}):\n{body}\n\n\n"
                    f"def model():\n    return M()\n\n\ndef example_inputs():\n"
                    f"    g = torch.Generator().manual_seed(0)\n    return ({', '.join(inputs)},)\n")
    return path


def run_forms(path, cache_dir, keep, most: int = 2) -> tuple[list[str], list[list[torch.Tensor]], list, object]:
    """(tiling_reprs, outputs per forced candidate, eager outputs, graph) for the first
    ``most`` candidates ``keep(tiling)`` selects among every kernel's solver candidates.

    Run ``i`` forces, for every kernel, its ``i``-th kept candidate (the last one when it has
    fewer; kernels with none kept run their default)."""
    backend = backends.get("cpu")
    # every solver candidate: no tiny-kernel or far-behind shortcut
    settings = Settings(topn=10, cache_dir=cache_dir, device_limit=DEVICE_LIMIT, backend="cpu", tiny_kernel_us=0,
                        far_behind_factor=0)
    model_file = load_model_file(path)
    graph = lower(export_model(model_file), backend)
    sets = {}
    for kid, cs in candidates.prepare(graph, backend, settings).items():
        chosen = tuple(c for c in cs.candidates if keep(c))[:most] or cs.candidates[:1]
        sources = tuple(backend.render_kernel(cs.kernel, c) for c in chosen)
        sets[kid] = dataclasses.replace(cs, candidates=chosen, sources=sources,
                                        wrapper_source=backend.render_wrapper(list(chosen)))
    toolchain = backend.toolchain(settings)
    folders = compile_stage.kernel_folders(sets, backend, settings, toolchain)
    store = compile_stage.binary_store(backend, settings, toolchain)
    inputs = tuple(model_file.example_inputs)
    with torch.no_grad():
        eager = model_file.module.eval()(*[t.clone() for t in inputs])
    eager = list(eager) if isinstance(eager, (tuple, list)) else [eager]
    reprs, runs = [], []
    with cache.locked([f.path for f in folders.values()]):
        compiled, _ = compile_stage.compile_all(sets, folders, toolchain, store, settings)
        runner = PythonModeRun(graph, compiled, backend)
        count = max(len(cs.candidates) for cs in sets.values())
        for i in range(count):
            runner.winners = {kid: min(i, len(cs.candidates) - 1) for kid, cs in sets.items()}
            runs.append([t.clone() for t in runner.run(inputs)])
            reprs.append(" | ".join(cs.candidates[runner.winners[kid]].tiling_repr for kid, cs in sets.items()))
    return reprs, runs, eager, graph


def assert_close(runs, reprs, eager, atol, rtol=0.0):
    for tiling_text, outs in zip(reprs, runs):
        assert len(outs) == len(eager)
        for k, (ours, ref) in enumerate(zip(outs, eager)):
            assert ours.shape == ref.shape, (tiling_text, k)
            torch.testing.assert_close(ours, ref, atol=atol, rtol=rtol, equal_nan=True,
                                       msg=lambda m: f"{tiling_text} output {k}: {m}")


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("reductions-cache")


# ----------------------------------------------------------------------------- online softmax


def test_online_softmax_matches_eager(tmp_path, kernel_cache):
    # odd widths (7x13, 1x257), 4097 columns (a partial chunk, rows not a multiple of the
    # vector width), a 70000-element row (online sweep first); values up to +-150
    shapes = [(7, 13), (1, 257), (3, 4097), (2, 70000)]
    forward = """
        xs = (x, x1, x2, x3)
        return tuple(torch.softmax(t, -1) for t in xs) + tuple(torch.log_softmax(t, -1) for t in xs)
    """
    path = write_model(tmp_path, "softmax", forward, *(f"torch.randn({s}, generator=g) * 30" for s in shapes))
    reprs, runs, eager, _ = run_forms(path, kernel_cache, lambda t: t.online, most=3)
    assert any("online=2" in r for r in reprs) and any("online=1" in r for r in reprs)
    # log_softmax of a 70000-element row: |x - max - log(sum)| ~ 300 in float32 (ulp 3e-5)
    assert_close(runs, reprs, eager, atol=1e-6, rtol=2e-7)


def test_online_softmax_special_values(tmp_path, kernel_cache):
    # row 0: all -inf (NaN, as eager); row 1: -inf before the first finite chunk;
    # row 2: a +inf; row 3: a NaN; row 4: 1e30-scale values; row 5: -1e30 plus one finite
    forward = """
        y = x.clone()
        y[0] = float("-inf")
        y[1, :2000] = float("-inf")
        y[2, 1500] = float("inf")
        y[3, 10] = float("nan")
        y[4] = y[4] * 1e30
        y[5] = -1e30
        y[5, 3000] = 1.0
        return torch.softmax(y, -1), torch.log_softmax(y, -1)
    """
    path = write_model(tmp_path, "softmax_special", forward, "torch.randn(6, 4100, generator=g)")
    reprs, runs, eager, _ = run_forms(path, kernel_cache, lambda t: t.online)
    assert any("online=1" in r for r in reprs)
    assert_close(runs, reprs, eager, atol=1e-6)


def test_softmax_every_form_odd_widths_special_values_and_strided_inputs(tmp_path, kernel_cache):
    """softmax and log_softmax (their exp on ``ap::exp_nonpositive``) in every row form
    (three-pass, online, stored-exp with the prefetching exp loop), widths 1, 37 and 70001
    (partial chunks and blocks; 7, 13 and 4097 are in the test above), a transposed and a
    step-sliced input (4100 and 4097 wide); in each: a row of -inf (NaN, as eager), a NaN,
    a +inf, 1e30-scale values and -inf before the first finite element. Every kernel's
    exp(a - max) is the bounded one, and the stored form's long rows prefetch."""
    forward = """
        def special(t):
            t = t.clone()
            t[0] = float("-inf")
            t[1, t.shape[1] // 2] = float("nan")
            t[2, -1] = float("inf")
            t[3] = t[3] * 1e30
            t[4, : t.shape[1] // 2 + 1] = float("-inf")
            return t
        xs = [special(t) for t in (x, x1, x2, x3.t(), x4[:, ::2])]
        return tuple(torch.softmax(t, -1) for t in xs) + tuple(torch.log_softmax(t, -1) for t in xs[1:3] + xs[4:])
    """
    shapes = [(6, 1), (6, 37), (6, 70001), (4100, 6), (6, 8194)]
    path = write_model(tmp_path, "softmax_forms", forward, *(f"torch.randn({s}, generator=g) * 30" for s in shapes))
    reprs, runs, eager, graph = run_forms(path, kernel_cache, lambda t: True, most=3)
    forms = {part.split(";online=")[-1] if ";online=" in part else "0" for r in reprs for part in r.split(" | ")}
    assert {"0", "1", "2"} <= forms, forms
    backend = backends.get("cpu")
    softmax_kernels = [k for k in graph.distinct_kernels() if online_softmax_pairs(k.exprs)]
    assert len(softmax_kernels) >= 7
    for kernel in softmax_kernels:
        for candidate in tiling.solve(kernel, DEVICE_LIMIT):
            source = backend.render_kernel(kernel, candidate)
            assert "ap::exp_nonpositive(t" in source and "ap::exp(t" not in source, candidate.tiling_repr
    stored = [backend.render_kernel(k, t) for k in softmax_kernels for t in tiling.solve(k, DEVICE_LIMIT)
              if t.online == 2 and k.inner_size >= 4097]
    assert stored and all("__builtin_prefetch(" in text for text in stored)
    assert_close(runs, reprs, eager, atol=1e-6, rtol=2e-7)


def test_streamed_softmax_matches_eager_with_special_values(tmp_path, kernel_cache):
    """The streamed stored-exp softmax (row buffer, non-temporal stores; outputs >= 16 MiB):
    rows of 5000 (two chunks of ``STREAM_CHUNK``, the second partial), 4096 (one chunk of
    whole blocks: the constant-trip exp loop), 1031 (one chunk; rows start off the 64-byte
    alignment, so the stores' scalar head and tail run) and 257 (the one-chunk form), against
    the plain stored form and eager, with a row of -inf, -inf before the first finite element
    (and chunk), a NaN and a +inf. Each row's store is deferred into the next row's exp loop
    (mirrored blocks) and a thread's last row is stored after its loop, so the special rows
    also sit last and in the middle, where two threads' rows meet. A softmax of a cat
    reads its pieces at offsets, so its exp loop has no blocks to carry the pending row:
    that row is stored after the loop. (A missing fence would not show on one machine: x86
    orders a thread's own loads after its streaming stores.)"""
    forward = """
        def special(t):
            t = t.clone()
            middle = t.shape[0] // 2
            t[0] = float("-inf")
            t[1, : t.shape[1] - 1] = float("-inf")
            t[2, 7] = float("nan")
            t[3, -1] = float("inf")
            t[middle - 1] = float("-inf")
            t[middle, : t.shape[1] - 1] = float("-inf")
            t[-1] = float("-inf")
            return t
        return tuple(torch.softmax(special(t), -1) for t in (x, x1, x2, x3)) + (
            torch.softmax(torch.cat([x4, x4 * 2], -1), -1),)
    """
    path = write_model(tmp_path, "softmax_streamed", forward, "torch.randn(4100, 1031, generator=g) * 30",
                       "torch.randn(16400, 257, generator=g) * 30", "torch.randn(850, 5000, generator=g) * 30",
                       "torch.randn(1024, 4096, generator=g) * 30", "torch.randn(1024, 2048, generator=g) * 30")
    reprs, runs, eager, graph = run_forms(path, kernel_cache, lambda t: t.online == 2)
    assert [r.count(";stream=1") for r in reprs] == [5, 0], reprs
    streamed = [k for k in graph.distinct_kernels() if softmax_store.streams(k)]
    assert len(streamed) == 5
    unblocked = 0
    for kernel in streamed:
        source = backends.get("cpu").render_kernel(kernel, tiling.solve(kernel, DEVICE_LIMIT)[0])
        assert "ap_stream_fence();" in source
        # rows of 1025+ defer their store into the next row's exp loop; 257 stores at once
        deferred = kernel.inner_size > kernel_writer.ONLINE_CHUNK
        blocked = "__builtin_prefetch(" in source  # not the cat: its store follows the loop
        unblocked += deferred and not blocked
        assert ("ap_store_scaled_streaming(pending_out + pb" in source) == (deferred and blocked)
        assert ("ap_store_scaled_streaming(pending_out + jc" in source) == deferred
        assert ("ap_store_scaled_streaming(out0" in source) == (not deferred)
    assert unblocked == 1
    assert_close(runs, reprs, eager, atol=1e-6, rtol=2e-7)


def test_only_exp_of_a_shift_by_the_row_max_is_bounded(tmp_path, kernel_cache):
    """exp(x - amin(x)) (> 0), exp(amax(x) - x), sigmoid and silu keep the general exp;
    exp(x - amax(x)) (<= 0) takes ``ap::exp_nonpositive``; all match eager."""
    forward = """
        return (torch.exp(x - x.amin(-1, keepdim=True)), torch.exp(x.amax(-1, keepdim=True) - x),
                torch.sigmoid(x), torch.nn.functional.silu(x), torch.exp(x - x.amax(-1, keepdim=True)))
    """
    path = write_model(tmp_path, "exp_kinds", forward, "torch.randn(5, 300, generator=g) * 4")
    reprs, runs, eager, graph = run_forms(path, kernel_cache, lambda t: True, most=1)
    backend = backends.get("cpu")
    sources = [backend.render_kernel(k, tiling.solve(k, DEVICE_LIMIT)[0]) for k in graph.distinct_kernels()]
    bounded = sum(text.count("ap::exp_nonpositive(t") for text in sources)
    general = sum(text.count("ap::exp(t") for text in sources)
    sigmoid = sum(text.count("ap_sigmoid(t") for text in sources)  # on the general ap::exp
    assert (bounded, general, sigmoid) == (1, 2, 2)
    assert_close(runs, reprs, eager, atol=1e-5, rtol=1e-5)


def test_online_softmax_over_a_transposed_input(tmp_path, kernel_cache):
    path = write_model(tmp_path, "softmax_t", "return torch.softmax(x.t(), -1)",
                       "torch.randn(300, 9, generator=g)")
    reprs, runs, eager, _ = run_forms(path, kernel_cache, lambda t: t.online)
    assert_close(runs, reprs, eager, atol=1e-6)


# ----------------------------------------------------------------------------- row sums (lane form)


def test_float_row_sums_use_float_lanes_and_match_eager(tmp_path, kernel_cache):
    # widths: 37 (one lane vector and a tail), 1000 (one partial chunk), 4097 (four chunks and
    # one element), 70000 (69 chunks), 2080 (a last chunk of one lane vector, no tail); mean
    # 100, so var / layer_norm need the two-pass form; row 0 of x1 holds +inf (sum inf),
    # row 1 +inf and -inf (NaN), row 2 a NaN, as in eager
    shapes = [(3, 37), (5, 1000), (4, 4097), (2, 70000), (3, 2080)]
    forward = """
        y = x1.clone()
        y[0, 7] = float("inf")
        y[1, 3] = float("inf")
        y[1, 900] = float("-inf")
        y[2, 500] = float("nan")
        xs = (x, x1, x2, x3, x4)
        return (tuple(t.sum(-1) for t in xs) + tuple(t.var(-1) for t in xs)
                + tuple(torch.nn.functional.layer_norm(t, t.shape[-1:]) for t in xs) + (y.sum(-1),))
    """
    path = write_model(tmp_path, "row_sums", forward, *(f"torch.randn({s}, generator=g) * 10 + 100" for s in shapes))
    reprs, runs, eager, graph = run_forms(path, kernel_cache, lambda t: True, most=3)
    reducing = [k for k in graph.distinct_kernels() if k.has_reduction]
    assert len(reducing) >= 15  # sum, var, layer_norm per width (y.sum may share x1.sum's kernel)
    for kernel in reducing:  # every one sums its floats in lanes
        assert "float lanes[32]" in renderer.render_kernel(kernel, tiling.solve(kernel, DEVICE_LIMIT)[0])
    assert_close(runs, reprs, eager, atol=1e-5, rtol=1e-5)


def test_lane_form_only_for_float32_sums_of_a_lane_vector_or_more():
    assert lane_sum.applies("sum", torch.float32, torch.float32, lane_sum.LANES)
    assert not lane_sum.applies("sum", torch.float32, torch.float32, lane_sum.LANES - 1)
    assert not lane_sum.applies("sum", torch.float64, torch.float64, 4096)
    assert not lane_sum.applies("prod", torch.float32, torch.float32, 4096)
    assert not lane_sum.applies("max", torch.float32, torch.float32, 4096)


# ----------------------------------------------------------------------------- column reductions


def test_column_reductions_match_eager(tmp_path, kernel_cache):
    forward = """
        return (x.sum(0), x.mean(0, keepdim=True), x.amax(0), x.amin(0, keepdim=True),
                x[1:, ::2].sum(0), x.t().contiguous().t().sum(0))
    """
    path = write_model(tmp_path, "columns", forward, "torch.randn(37, 4097, generator=g) * 10")
    reprs, runs, eager, graph = run_forms(path, kernel_cache, lambda t: t.col_block)
    assert all("col_block=" in r for r in reprs[:1])
    assert not graph.extern_calls()
    assert_close(runs, reprs, eager, atol=1e-5, rtol=1e-5)


def test_column_reductions_odd_shapes_and_nan(tmp_path, kernel_cache):
    # 7x13 and 9x11 over dim 0, [5, 9, 13] over the middle dim, [6, 5, 19] over (0, 1); a NaN
    # in each input for amax; the default column candidate of each kernel
    cases = [((7, 13), (0,)), ((5, 9, 13), (1,)), ((6, 5, 19), (0, 1)), ((9, 11), (0,))]
    lines = ["outs = []"]
    for k, (_, dims) in enumerate(cases):
        name = "x" if k == 0 else f"x{k}"
        lines += [f"y = {name}.clone()", "y.view(-1)[3] = float('nan')",
                  f"outs += [{name}.sum({dims}), y.amax({dims}), {name}.mean({dims}, keepdim=True)]"]
    lines.append("return tuple(outs)")
    path = write_model(tmp_path, "columns_odd", "\n".join(lines),
                       *(f"torch.randn({shape}, generator=g)" for shape, _ in cases))
    reprs, runs, eager, graph = run_forms(path, kernel_cache, lambda t: t.col_block, most=1)
    assert sum(1 for k in graph.distinct_kernels() if tiling.solve(k, DEVICE_LIMIT)[0].col_block) == 12
    assert_close(runs, reprs, eager, atol=1e-5, rtol=1e-5)


def test_column_reduction_of_a_transposed_input_uses_the_row_form(tmp_path, kernel_cache):
    # x.t() is [C, R] with strides (1, C): its dim-0 sum reads rows: no column form needed
    path = write_model(tmp_path, "columns_t", "return x.t().sum(0)", "torch.randn(33, 70, generator=g)")
    reprs, runs, eager, graph = run_forms(path, kernel_cache, lambda t: True)
    (kernel,) = graph.kernels
    assert not any(c.col_block for c in tiling.solve(kernel, DEVICE_LIMIT))
    assert_close(runs, reprs, eager, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- split reductions


def test_split_reduction_records_workspace_and_matches_eager(tmp_path, kernel_cache):
    forward = """
        y = x.clone()
        y[0, 123456] = float("nan")
        return x.sum(), x.mean(-1, keepdim=True), x.amax(-1), y.amax(-1)
    """
    path = write_model(tmp_path, "split", forward, "torch.randn(1, 300001, generator=g)")
    reprs, runs, eager, graph = run_forms(path, kernel_cache, lambda t: t.split)
    reducing = [k for k in graph.distinct_kernels() if k.has_reduction]
    assert len(reducing) == 4
    for kernel in reducing:
        default = tiling.solve(kernel, DEVICE_LIMIT)[0]
        assert default.split == DEVICE_LIMIT
        assert default.workspace == 64  # one 16-byte slot per segment, 64-byte aligned
        assert f"|{default.workspace}|{DEVICE_LIMIT}" in default.optimize_tiling
    assert all("split=" in r for r in reprs)
    assert_close(runs, reprs, eager, atol=1e-3, rtol=1e-6)


def test_split_reduction_workspace_in_the_manifest(tmp_path):
    """A built archive records the split kernel's workspace; the native runtime allocates it."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("a split needs 2 cores (the build caps the device limit at the cores present)")
    path = write_model(tmp_path, "split_built", "return x.sum(-1), x.amax(-1)",
                       "torch.rand(1, 200000, generator=g) + 1")
    settings = Settings.from_env(topn=1, cache_dir=tmp_path / "cache", device_limit=2)
    result = build(path, tmp_path / "dist", settings=settings)
    kernels = read_manifest(result.archive)["kernels"]
    assert [(k["block_dim"], k["workspace"]) for k in kernels] == [(2, split_bytes(1, 2))] * 2
    assert all(k["tiling_repr"].endswith(";split=2") for k in kernels)
    assert_native_parity(result.archive, path, tmp_path, atol=1e-3, rtol=1e-6)


def split_bytes(rows: int, threads: int) -> int:
    segments = math.ceil(threads / rows)
    return math.ceil(rows * segments * 16 / 64) * 64


def test_reductions_of_a_cat_match_eager_in_every_loop_form(tmp_path, kernel_cache):
    """A cat (a Piecewise read) feeding a row softmax (online and stored-exp forms), a
    column sum (column loops, the select on the row) and one long row's sum (split):
    up to four candidates of each kernel, each against eager."""
    forward = """
        return (torch.cat([x, x1.flip(1) * 2.0], dim=-1).softmax(-1),
                torch.cat([x, x1 * 2.0], dim=0).sum(0),
                torch.cat([x.reshape(-1), x1.reshape(-1).exp()]).sum())
    """
    path = write_model(tmp_path, "cat_reductions", forward, "torch.randn(37, 1029, generator=g)",
                       "torch.randn(37, 1029, generator=g)")
    reprs, runs, eager, graph = run_forms(path, kernel_cache, lambda t: True, most=4)
    assert not graph.extern_calls()
    assert any("online=" in r for r in reprs) and any("col_block=" in r for r in reprs)
    assert any("split=" in r for r in reprs)
    assert_close(runs, reprs, eager, atol=1e-5, rtol=1e-5)


def test_tall_float32_column_sums_add_chunks_in_double(tmp_path, kernel_cache):
    """20001 rows (625 chunks of 32 and a tail of 1) of values around 100: the float
    partials per chunk, added in double, stay within the sum tolerance of eager."""
    forward = """
        return x.sum(0), x.mean(0)
    """
    path = write_model(tmp_path, "tall_columns", forward, "torch.randn(20001, 67, generator=g) * 10 + 100")
    reprs, runs, eager, graph = run_forms(path, kernel_cache, lambda t: t.col_block, most=2)
    assert all("col_block=" in r for r in reprs)
    for kernel in graph.distinct_kernels():  # the chunked form is what ran
        column = next(t for t in tiling.solve(kernel, DEVICE_LIMIT) if t.col_block)
        assert "float part_acc0[" in backends.get("cpu").render_kernel(kernel, column)
    assert_close(runs, reprs, eager, atol=1e-5, rtol=1e-5)
