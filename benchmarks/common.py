"""Helpers shared by the benchmark scripts: load a sample, time eager interleaved."""
from __future__ import annotations

import copy
import statistics
import time

import torch

from aotpack.export import load_model_file


def eager_latency_us(module, inputs, runs: int, warmup: int = 10) -> float:
    """Median wall time of ``module(*inputs)`` in microseconds (inference mode); ``module``
    is any callable (an nn.Module, an AOTInductor runner)."""
    samples = []
    with torch.inference_mode():
        for _ in range(warmup):
            module(*inputs)
        for _ in range(runs):
            start = time.perf_counter()
            module(*inputs)
            samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def load_sample(path):
    """(module copy in eval mode, example inputs) of a model file."""
    model_file = load_model_file(path)
    return copy.deepcopy(model_file.module).eval(), model_file.example_inputs


def max_abs_error(ours, reference) -> float:
    return max((a.double() - b.double()).abs().max().item() for a, b in zip(ours, reference))
