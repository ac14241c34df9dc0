"""aotpack's fused attention kernel against the unfused attention (two bmms around the fused
softmax kernel) on the attention blocks of the models, interleaved in one process.

Each model is exported and lowered as ``aotpack build`` does; the first attention step
(``attention_lowering``) is run on random data in its exact layouts: every variant of the step
(``unfused:<bmm1>+<bmm2>``: ATen or aotpack's bmm template per bmm, the softmax kernel
between; ``template``: the fused kernel), each kernel at its fastest solver tiling (picked
first, a short timing per tiling). The fused output is checked against the all-ATen one
first (|d| <= 1e-4 + 1e-4 |ref|). Ratios: the fused kernel's median over the best unfused
variant's (< 1: faster), per round, then the median and range over the rounds.

    python benchmarks/attention_template.py --threads 1,2 --rounds 7
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aotpack import backends  # noqa: E402
from aotpack.tune.autotune import _conform, _empty, _extern_args  # noqa: E402
from aotpack.backends.base import Limits  # noqa: E402
from aotpack.build import export_model  # noqa: E402
from aotpack.frontend.export import load_model  # noqa: E402
from aotpack.ir.gemm import gemm_steps  # noqa: E402
from aotpack.ir.graph import ExternCall, KernelCall  # noqa: E402
from aotpack.lower.lowering import lower  # noqa: E402
from common import calls_per_sample, compile_candidates, median_us, target_vector_bytes  # noqa: E402

DEFAULT_MODELS = ["benchmarks/bench_models/vit_s16.py", "benchmarks/bench_models/distilbert_base.py",
                  "benchmarks/bench_models/whisper_tiny_encoder.py"]


def attention_step(path: str):
    """The first attention ``GemmStep`` of the model at ``path``."""
    graph = lower(export_model(load_model(ROOT / path), None), backends.get("cpu"))
    return next(s for s in gemm_steps(graph) if s.kind == "attention")


def _calls(steps: list, env: dict, launchers: dict) -> list:
    """One callable per step (arguments prepared now), outputs allocated in ``env`` first."""
    calls = []
    for step in steps:
        if isinstance(step, KernelCall):
            for buf in step.writes():
                env.setdefault(id(buf), _empty(buf))
            launcher, key = launchers[step.kernel.kernel_id]
            args = launcher.arguments([env[id(b)] for b in step.reads() + step.writes()])
            calls.append(lambda l=launcher, k=key, a=args: l.launch(k, a))
        else:
            assert isinstance(step, ExternCall)
            args, kwargs = _extern_args(env, step)
            out = env[id(step.outputs[0])] = _conform(step.op(*args, **kwargs), step.outputs[0])
            # into the same tensor every call (``.out``), so the kernels after it read this call's result
            op = step.op.overloadpacket.out
            calls.append(lambda op=op, a=args, k=kwargs, o=out: op(*a, **k, out=o))
    return calls


def measure(step, threads: int, rounds: int, work: Path) -> dict:
    """{variant name: [median us per round]}."""
    torch.set_num_threads(threads)
    backend = backends.get("cpu")
    limits = Limits(threads, target_vector_bytes())
    generator = torch.Generator().manual_seed(0)
    written = {id(b) for v in step.variants for s in v.steps for b in s.writes()}
    env = {}
    for buf in step.reads():
        if id(buf) not in written and id(buf) not in env:
            extent = 1 + sum((s - 1) * st for s, st in zip(buf.shape, buf.strides))
            storage = (torch.rand(extent, generator=generator) > 0.2 if buf.dtype == torch.bool
                       else torch.randn(extent, generator=generator).to(buf.dtype))
            env[id(buf)] = torch.as_strided(storage, buf.shape, buf.strides)
    launchers = {}
    for index, kernel in enumerate({s.kernel.kernel_id: s.kernel for v in step.variants for s in v.steps
                                    if isinstance(s, KernelCall)}.values()):
        tilings = backend.solve(kernel, limits, 8)
        launcher = compile_candidates(kernel, tilings, work / str(index))
        for buf in kernel.outputs:
            env.setdefault(id(buf), _empty(buf))
        # kept alive while the launches run: the arguments are raw pointers
        tensors = [env[id(b)] if id(b) in env else _empty(b) for b in (*kernel.inputs, *kernel.outputs)]
        args = launcher.arguments(tensors)
        times = {t.kernel_key: median_us(lambda k=t.kernel_key: launcher.launch(k, args), 5) for t in tilings}
        del tensors
        launchers[kernel.kernel_id] = (launcher, min(times, key=times.get))
    variants = {}
    for variant in step.variants:
        calls = _calls(variant.steps, env, launchers)
        for fn in calls:
            fn()
        env[id(step.output)].fill_(float("nan"))
        for fn in calls:
            fn()
        variants[variant.name] = lambda fns=calls: [fn() for fn in fns]
        if variant.name == "unfused:aten+aten":
            reference = env[id(step.output)].clone()
        elif variant.name == "template":
            torch.testing.assert_close(env[id(step.output)], reference, atol=1e-4, rtol=1e-4)
    calls = calls_per_sample(variants["unfused:aten+aten"], 0.1, 5)
    samples = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(median_us(variants[name], calls))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated model files")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    steps = [(Path(path).stem, attention_step(path)) for path in args.models.split(",")]
    with tempfile.TemporaryDirectory(prefix="aotpack-attention-bench-") as tmp:
        for threads in sorted({int(t) for t in args.threads.split(",")}):
            print(f"\n{threads} thread{'s' if threads > 1 else ''}: median us per attention block")
            for index, (model, step) in enumerate(steps):
                samples = measure(step, threads, args.rounds, Path(tmp) / f"{index}-{threads}")
                unfused = [n for n in samples if n != "template"]
                best = min(unfused, key=lambda n: statistics.median(samples[n]))
                ratios = [f / u for f, u in zip(samples["template"], samples[best])]
                print(f"{model:>22} {step.shape:>18} best unfused {best:>26} "
                      f"{statistics.median(samples[best]):9.1f} us, fused {statistics.median(samples['template']):9.1f}"
                      f" us, ratio {statistics.median(ratios):.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f}); "
                      + " ".join(f"{n}={statistics.median(v):.1f}" for n, v in samples.items()), flush=True)


if __name__ == "__main__":
    main()
