"""Helpers shared by the benchmark scripts: load a sample, time calls."""
from __future__ import annotations

import copy
import statistics
import time

import torch

from aotpack.export import load_model_file


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
