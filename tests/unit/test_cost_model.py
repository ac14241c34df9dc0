"""The CPU cost model ranks a kernel's candidate tilings before anything is compiled, and
the ``--cost-model`` shortlist keeps the best share of the solver's space (no compiler)."""
from __future__ import annotations

import dataclasses

import pytest

from aotpack import backends
from aotpack.backends.cpu import cost_model, tiling
from aotpack.backends.cpu.tiling import Tiling
from aotpack.tune.candidates import shortlist
from aotpack.config import MAX_TOPN, Settings
from aotpack.errors import AotpackError
from test_kernel_ir import lowered_source


AVX2 = ["avx", "avx2", "fma"]


def only_kernel(tmp_path, body, inputs):
    (kernel,) = lowered_source(tmp_path, body, inputs).kernels
    return kernel


def test_bytes_and_ops_of_a_pointwise_kernel(tmp_path):
    kernel = only_kernel(tmp_path, "return torch.exp(x) + 1", "torch.randn(64, 1024)")
    assert cost_model.kernel_bytes(kernel) == 2 * 64 * 1024 * 4         # read once, written once
    assert cost_model.element_ops(kernel) == cost_model.TRANSCENDENTAL_COST + 1


def test_vector_width_of_the_target():
    assert cost_model.vector_bytes(["avx512f", "avx2"]) == 64
    assert cost_model.vector_bytes(AVX2) == 32
    assert cost_model.vector_bytes([]) == 16


def test_simdlen_of_the_register_width_ranks_first(tmp_path):
    kernel = only_kernel(tmp_path, "return torch.exp(x) * 2", "torch.randn(256, 1024)")
    estimates = {s: cost_model.estimate_us(kernel, Tiling(2, 1024, s, 0), AVX2) for s in (0, 8, 16)}
    assert estimates[8] < estimates[16] < estimates[0]


def test_threads_pay_only_for_large_kernels(tmp_path):
    small = only_kernel(tmp_path, "return x * 2", "torch.randn(4, 64)")
    large = only_kernel(tmp_path, "return torch.erf(x) * 2", "torch.randn(512, 2048)")
    for kernel, faster in ((small, 1), (large, 2)):
        one, two = (cost_model.estimate_us(kernel, Tiling(b, kernel.inner_size, 8, 0), AVX2) for b in (1, 2))
        assert (one < two) == (faster == 1)


def test_blocked_loop_order_wins_for_a_transposing_copy(tmp_path):
    kernel = only_kernel(tmp_path, "return x.t().contiguous()", "torch.randn(512, 256)")
    assert kernel.access.strided
    blocked = cost_model.estimate_us(kernel, Tiling(2, 32, 0, 0, row_block=16), AVX2)
    plain = cost_model.estimate_us(kernel, Tiling(2, 512, 0, 0), AVX2)
    assert blocked < plain / 2


def settings(**fields):
    """Settings at device limit 2 with neither shortcut (tiny kernels, far behind) unless asked."""
    return dataclasses.replace(Settings(device_limit=2, tiny_kernel_us=0.0, far_behind_factor=0.0), **fields)


def test_shortlist_without_the_cost_model_is_the_solvers_first_topn(tmp_path):
    kernel = only_kernel(tmp_path, "return torch.exp(x) * 2", "torch.randn(256, 1024)")
    backend = backends.get("cpu")
    limits = backend.limits(settings())
    picked = shortlist(kernel, backend, limits, settings(topn=3))
    assert picked == tuple(tiling.solve(kernel, 2, 3))


def test_cost_model_keeps_the_best_share_at_most_topn(tmp_path):
    kernel = only_kernel(tmp_path, "return torch.exp(x) * 2", "torch.randn(256, 1024)")
    backend = backends.get("cpu")
    chosen = settings(topn=10, cost_model=True, cost_model_ratio=0.25)
    space = tiling.solve(kernel, 2, MAX_TOPN)
    estimate = {c.tiling_repr: backend.estimate_us(kernel, c, chosen) for c in space}
    picked = shortlist(kernel, backend, backend.limits(chosen), chosen)
    assert len(picked) == -(-len(space) // 4)                      # ceil(0.25 * space)
    assert [estimate[c.tiling_repr] for c in picked] == sorted(estimate.values())[:len(picked)]
    capped = shortlist(kernel, backend, backend.limits(chosen), dataclasses.replace(chosen, topn=1))
    assert capped == picked[:1]


@pytest.mark.parametrize("variable, expected, raw", [
    *[("AOTPACK_COSTMODEL_RATIO", "a number in (0, 1]", raw) for raw in ["0", "1.5", "-0.1", "half"]],
    *[("AOTPACK_TINY_KERNEL_US", "a number of microseconds >= 0", raw) for raw in ["-1", "fast", "nan"]],
    *[("AOTPACK_FAR_BEHIND_FACTOR", "0 (off) or a number > 1", raw) for raw in ["1", "0.5", "-2", "far", "inf", "nan"]],
])
def test_number_settings_name_the_variable_and_the_range(monkeypatch, variable, expected, raw):
    monkeypatch.setenv(variable, raw)
    with pytest.raises(AotpackError) as error:
        Settings.from_env()
    assert str(error.value) == f"{variable} must be {expected}, got {raw!r}"


def test_cost_model_settings_from_env_and_flags(monkeypatch):
    monkeypatch.setenv("AOTPACK_COSTMODEL", "1")
    monkeypatch.setenv("AOTPACK_COSTMODEL_RATIO", "0.5")
    chosen = Settings.from_env()
    assert chosen.cost_model and chosen.cost_model_ratio == 0.5
    assert Settings.from_env(cost_model_ratio="1").cost_model_ratio == 1.0
    monkeypatch.delenv("AOTPACK_COSTMODEL")
    assert not Settings.from_env().cost_model and Settings.from_env(cost_model=True).cost_model


def test_a_tiny_kernel_compiles_only_its_default(tmp_path):
    tiny = only_kernel(tmp_path, "return x * 2", "torch.randn(4, 64)")  # 2 KB moved: well under 10 us
    large = only_kernel(tmp_path, "return torch.exp(x) * 2", "torch.randn(256, 1024)")
    backend = backends.get("cpu")
    limits = backend.limits(settings())
    assert backend.estimate_us(tiny, tiling.solve(tiny, 2, 1)[0], settings()) < 10.0
    assert shortlist(tiny, backend, limits, settings(topn=3, tiny_kernel_us=10.0)) == tuple(tiling.solve(tiny, 2, 1))
    assert shortlist(tiny, backend, limits, settings(topn=3, tiny_kernel_us=0.0)) == tuple(tiling.solve(tiny, 2, 3))
    assert len(tiling.solve(tiny, 2, 3)) == 3
    assert shortlist(large, backend, limits, settings(topn=3, tiny_kernel_us=10.0)) == tuple(tiling.solve(large, 2, 3))
    with_model = settings(topn=10, cost_model=True, tiny_kernel_us=10.0)
    assert len(shortlist(tiny, backend, backend.limits(with_model), with_model)) == 1


@pytest.mark.parametrize("field, variable, default, from_env, bad, message", [
    ("tiny_kernel_us", "AOTPACK_TINY_KERNEL_US", 10.0, "2.5", "-3",
     "--tiny-kernel-us must be a number of microseconds >= 0, got '-3'"),
    ("far_behind_factor", "AOTPACK_FAR_BEHIND_FACTOR", 1.4, "2", "1",
     "--far-behind-factor must be 0 (off) or a number > 1, got '1'"),
])
def test_shortcut_settings_from_env_and_flags(monkeypatch, field, variable, default, from_env, bad, message):
    """The default (also the dataclass's), the environment variable, the flag (which wins;
    0 turns the shortcut off) and the flag's error message."""
    monkeypatch.delenv(variable, raising=False)
    assert getattr(Settings.from_env(), field) == default == getattr(Settings(), field)
    monkeypatch.setenv(variable, from_env)
    assert getattr(Settings.from_env(), field) == float(from_env)
    assert getattr(Settings.from_env(**{field: "0"}), field) == 0.0
    with pytest.raises(AotpackError) as error:
        Settings.from_env(**{field: bad})
    assert str(error.value) == message


def test_candidates_that_differ_only_in_block_dim_share_one_binary(tmp_path):
    """Backend.share_binaries: a 1-thread candidate with a 2-thread twin of the same workspace
    is rendered from the twin (same source, so one compile), each keeping its own kernel_key;
    a twin whose workspace differs (per-thread scratch) is compiled apart."""
    kernel = only_kernel(tmp_path, "return torch.exp(x) * 2", "torch.randn(256, 1024)")
    backend = backends.get("cpu")
    wide = dataclasses.replace(tiling.solve(kernel, 2, 1)[0], block_dim=2, workspace=128)
    narrow = dataclasses.replace(wide, block_dim=1)
    other = dataclasses.replace(wide, inner_tile=wide.inner_tile // 2, block_dim=1)
    per_thread = dataclasses.replace(wide, block_dim=1, workspace=64)
    builds = backend.share_binaries((wide, narrow, other, per_thread))
    assert builds == (wide, wide, other, per_thread)
    assert len({c.kernel_key for c in (wide, narrow, other, per_thread)}) == 4
    assert backend.render_kernel(kernel, builds[1]) == backend.render_kernel(kernel, wide)


def test_prepare_renders_block_dim_twins_from_one_source(tmp_path):
    from aotpack.tune import candidates
    graph = lowered_source(tmp_path, "return torch.exp(x) * 2", "torch.randn(256, 1024)")
    backend = backends.get("cpu")
    (cs,) = candidates.prepare(graph, backend, settings(topn=10, tiny_kernel_us=0.0)).values()
    by_threads = {}
    for c, source in zip(cs.candidates, cs.sources):
        by_threads.setdefault(dataclasses.replace(c, block_dim=0), {})[c.block_dim] = source
    twins = [sources for sources in by_threads.values() if len(sources) == 2]
    assert twins, [c.tiling_repr for c in cs.candidates]
    assert all(sources[1] == sources[2] for sources in twins)
    assert len(set(cs.sources)) == len(by_threads) < len(cs.candidates)


def test_a_launch_that_fits_the_caches_moves_at_cache_bandwidth(tmp_path):
    """At most CACHE_RESIDENT_BYTES moved: ~40 GB/s per thread (the inputs are in L2/L3),
    else the memory figures (10 GB/s one thread, 16 GB/s two)."""
    cached = only_kernel(tmp_path, "return x * 2", "torch.randn(256, 256)")       # 512 KB moved
    streamed = only_kernel(tmp_path, "return x * 2", "torch.randn(1024, 1024)")   # 8 MiB moved
    assert cost_model.kernel_bytes(cached) == 2**19 and cost_model.kernel_bytes(streamed) == 2**23
    assert [cost_model._bandwidth(t, 2**19) for t in (1, 2)] == [40e9, 80e9]
    assert [cost_model._bandwidth(t, 2**23) for t in (1, 2)] == [10e9, 16e9]
    assert cost_model._bandwidth(1, cost_model.CACHE_RESIDENT_BYTES) == 40e9
    # 16x the bytes at a quarter of the bandwidth: 64x the memory term (1 thread, register-width SIMD)
    one = [cost_model.estimate_us(k, Tiling(1, k.inner_size, 8, 0), AVX2) for k in (cached, streamed)]
    assert one[0] == pytest.approx(2**19 / 40e9 * 1e6 + cost_model.WORK_ITEM_US * cached.rows)
    assert one[1] == pytest.approx(2**23 / 10e9 * 1e6 + cost_model.WORK_ITEM_US * streamed.rows)
