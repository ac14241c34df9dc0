"""Helpers shared by the benchmark scripts: load a sample, time calls."""
from __future__ import annotations

import copy
import statistics
import time

import torch

from aotpack.frontend.export import load_model_file


def wall_times(fn, runs: int) -> list[float]:
    """Wall times of ``runs`` calls of ``fn()``, in seconds, sorted."""
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return sorted(samples)


def eager_latency_us(module, inputs, runs: int, warmup: int = 10) -> float:
    """Median wall time of ``module(*inputs)`` in microseconds (inference mode); ``module``
    is any callable (an nn.Module, an AOTInductor runner)."""
    with torch.inference_mode():
        for _ in range(warmup):
            module(*inputs)
        return statistics.median(wall_times(lambda: module(*inputs), runs)) * 1e6


def load_sample(path):
    """(module copy in eval mode, example inputs) of a model file."""
    model_file = load_model_file(path)
    return copy.deepcopy(model_file.module).eval(), model_file.example_inputs


def max_abs_error(ours, reference) -> float:
    return max((a.double() - b.double()).abs().max().item() for a, b in zip(ours, reference))


def compile_candidates(kernel, tilings: list, work):
    """Render and compile each of ``tilings`` of ``kernel`` into its own static kernel under
    ``work`` (a pathlib.Path), compile the wrapper that dispatches them by ``kernel_key``, and
    return the CPU backend's launcher for it. Raises the toolchain's CompileError."""
    from aotpack import backends
    from aotpack.config import Settings

    backend = backends.get("cpu")
    toolchain = backend.toolchain(Settings.from_env())
    for tiling in tilings:
        source = work / "static_kernel" / tiling.kernel_key / "kernel.cpp"
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(backend.render_kernel(kernel, tiling))
        toolchain.compile_kernel(source, source.with_name("kernel.so"))
    (work / "wrapper.cpp").write_text(backend.render_wrapper(tilings))
    toolchain.compile_wrapper(work / "wrapper.cpp", work / "wrapper.so")
    return backend.load_wrapper(work / "wrapper.so", work, kernel.name)


def median_us(fn, calls: int, clock=time.perf_counter) -> float:
    """Median of ``calls`` timed calls of ``fn()`` in microseconds, by ``clock`` (wall time,
    or ``time.thread_time`` for the calling thread's CPU time, which preemption does not
    inflate)."""
    samples = []
    for _ in range(calls):
        start = clock()
        fn()
        samples.append(clock() - start)
    return statistics.median(samples) * 1e6


def calls_per_sample(fn, budget_s: float, minimum: int) -> int:
    """How many calls of ``fn`` fill about ``budget_s`` seconds (at least ``minimum``)."""
    return max(minimum, int(budget_s / max(1e-6, median_us(fn, 3) * 1e-6)))


def interleaved_medians(variants: dict, rounds: int, calls: int, clock=time.perf_counter) -> dict:
    """{name: median us} over ``rounds`` rounds of ``calls`` calls per variant, the variant
    order rotating each round so that drift and neighbours weigh on all alike; a 20 ms pause
    after each block lets spinning thread pools park."""
    samples = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(median_us(variants[name], calls, clock))
            time.sleep(0.02)
    return {name: statistics.median(v) for name, v in samples.items()}


def target_vector_bytes() -> int:
    """The vector width (bytes) the CPU backend's templates compute in on this machine's
    target ISA (``Limits.vector_bytes``: 64 with AVX-512F)."""
    from aotpack import backends
    from aotpack.config import Settings

    return backends.get("cpu").limits(Settings.from_env()).vector_bytes
