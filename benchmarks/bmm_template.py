"""aotpack's batched GEMM template against ATen's ``bmm`` on the attention bmms of the
models, interleaved in one process, at 1 thread and at all cores.

Each model is exported and lowered as ``aotpack build`` does; every distinct bmm step
(``bmm_lowering``) is timed on random data in its exact layout (the strided views of the
qkv projection the model reads): the template's solver tilings, all compiled, against the
ATen variant on the same views (a copy first where ATen needs one, as the step's ATen variant). Outputs are checked against ``torch.bmm`` first
(|d| <= 1e-4 + 1e-4 |ref|). Ratios are the template's best median over ATen's (< 1: faster).

    python benchmarks/bmm_template.py
    python benchmarks/bmm_template.py --models benchmarks/bench_models/vit_s16.py --threads 1
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aotpack import backends  # noqa: E402
from aotpack.backends.cpu import bmm_template  # noqa: E402
from aotpack.build import export_model  # noqa: E402
from aotpack.frontend.export import load_model  # noqa: E402
from aotpack.ir.gemm import gemm_steps  # noqa: E402
from aotpack.ir.template_kernels import BmmKernel  # noqa: E402
from aotpack.lower.lowering import lower  # noqa: E402
from common import calls_per_sample, compile_candidates, interleaved_medians, target_vector_bytes  # noqa: E402

DEFAULT_MODELS = ["samples/transformer_block.py", "benchmarks/bench_models/vit_s16.py",
                  "benchmarks/bench_models/bert_tiny.py", "benchmarks/bench_models/llama_tiny.py"]


def bmm_kernels(path: str) -> list[tuple]:
    """(step shape, BmmKernel) of each distinct bmm step of the model at ``path``."""
    graph = lower(export_model(load_model(ROOT / path), None), backends.get("cpu"))
    found = {}
    for step in gemm_steps(graph):  # a bmm step, or an attention step's unfused variants (attention_lowering)
        for variant in step.variants:
            for call in variant.steps:
                kernel = getattr(call, "kernel", None)
                if isinstance(kernel, BmmKernel):
                    found.setdefault(kernel.kernel_id, (f"{kernel.batch}x{kernel.m}x{kernel.k}x{kernel.n}", kernel))
    return list(found.values())



def _storage(buf, generator) -> torch.Tensor:
    extent = 1 + sum((s - 1) * st for s, st in zip(buf.shape, buf.strides))
    return torch.randn(extent, generator=generator)



def measure(kernel, threads: int, rounds: int, work: Path) -> dict:
    """Median us per variant over interleaved rounds (the order rotating each round)."""
    torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(0)
    storages = {id(b): _storage(b, generator) for b in kernel.inputs}
    a = torch.as_strided(storages[id(kernel.inputs[0])], (*kernel.batch_shape, kernel.m, kernel.k),
                         kernel.a_strides, kernel.a_offset)
    b = torch.as_strided(storages[id(kernel.inputs[kernel.b_input])], (*kernel.batch_shape, kernel.k, kernel.n),
                         kernel.b_strides, kernel.b_offset)
    # ATen's variant: the operands as [batch, ., .] (a copy where batch x heads does not collapse), then bmm
    def aten():
        return torch.bmm(a.reshape(kernel.batch, kernel.m, kernel.k), b.reshape(kernel.batch, kernel.k, kernel.n))
    reference = aten()
    out = torch.empty(kernel.outputs[0].shape)
    tilings = bmm_template.solve(kernel, threads, vector_bytes=target_vector_bytes())
    launcher = compile_candidates(kernel, tilings, work)
    tensors = [storages[id(b)] for b in kernel.inputs] + [out]  # kept alive: the launch takes raw pointers
    args = launcher.arguments(tensors)
    variants = {t.tiling_repr.removeprefix("cpu_bmm;"): (lambda key=t.kernel_key: launcher.launch(key, args))
                for t in tilings}
    variants["aten"] = aten
    for name, fn in variants.items():
        out.fill_(float("nan"))
        fn()
        if name != "aten":
            torch.testing.assert_close(out.view(reference.shape), reference, atol=1e-4, rtol=1e-4,
                                       msg=lambda t: f"{name}: {t}")
    return interleaved_medians(variants, rounds, calls_per_sample(variants["aten"], 0.1, 5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated model files")
    parser.add_argument("--threads", default=f"1,{torch.get_num_threads()}", help="comma-separated thread counts")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    cases = [(Path(path).stem, *found) for path in args.models.split(",") for found in bmm_kernels(path)]
    with tempfile.TemporaryDirectory(prefix="aotpack-bmm-bench-") as tmp:
        for threads in sorted({int(t) for t in args.threads.split(",")}):
            print(f"\n{threads} thread{'s' if threads > 1 else ''}: median us (template / aten)")
            print(f"{'model':>18} {'BxMxKxN':>15} {'b layout':>10} {'template best':>38} {'us':>8} "
                  f"{'default us':>10} {'aten us':>8} {'ratio':>6}")
            for index, (model, shape, kernel) in enumerate(cases):
                result = measure(kernel, threads, args.rounds, Path(tmp) / f"{index}-{threads}")
                own = {name: us for name, us in result.items() if name != "aten"}
                best = min(own, key=own.get)
                layout = "in place" if bmm_template.direct_b(kernel) else "k^T"
                print(f"{model:>18} {shape:>15} {layout:>10} {best:>38} {own[best]:8.1f} "
                      f"{next(iter(own.values())):10.1f} {result['aten']:8.1f} {own[best] / result['aten']:5.2f}x",
                      flush=True)


if __name__ == "__main__":
    main()
