"""Template kernels with their operands in cache (as PGO times them) and not (as a model
runs them), interleaved in one process: the ratio shows what the templates' software
prefetch (docs/design.md, "Software prefetch") has left to win.

"warm" launches one set of operands again and again. "cold" rotates the launches through
copies of every operand (input, weight, bias, output) that together exceed 64 MB, more than
this machine's caches, so each launch finds its weight, input and output out of cache, as a
kernel deep in a model does. Every tiling the solver offers is compiled and checked against
torch first (|d| <= 1e-4 + 1e-3 |ref|).

    python benchmarks/cold_operands.py                         # a few GEMM, conv and Winograd shapes
    python benchmarks/cold_operands.py --gemm 197x384x1536 --conv none --winograd none --threads 1
"""
from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import conv_template as conv_bench  # noqa: E402
import gemm_template as gemm_bench  # noqa: E402
from common import calls_per_sample, compile_candidates, interleaved_medians, target_vector_bytes  # noqa: E402

from aotpack.backends.cpu import winograd_template  # noqa: E402
from aotpack.ir.graph import Buffer, contiguous_strides  # noqa: E402
from aotpack.ir.template_kernels import WinogradConvKernel  # noqa: E402
from aotpack.backends.cpu.weights import pack_panels, pad_bias, winograd_weights  # noqa: E402

#: ViT-S/16's MLP and qkv GEMMs, a transformer block's up projection (M x K x N).
GEMM_SHAPES = "197x384x1536,197x1536x384,32x512x2048"
#: ResNet-18's strided 3x3 and 1x1 downsample, MobileNetV3's 1x1s at 56x56 and 7x7.
CONV_SHAPES = "256x14x14-512-k3s2p1,128x28x28-256-k1s2p0,16x56x56-72-k1s1p0,576x7x7-96-k1s1p0"
#: ResNet-18's 3x3s at 14x14 and 28x28 (channels x size).
WINOGRAD_SHAPES = "256x14,128x28"
COLD_BYTES = 64 * 2**20
RTOL, ATOL = 1e-3, 1e-4


def _copies(*tensors: torch.Tensor) -> int:
    return max(2, -(-COLD_BYTES // sum(t.numel() * t.element_size() for t in tensors)))


def _operand_sets(operands: list, count: int) -> list:
    """``count`` independent copies of ``operands`` (the first is the originals)."""
    return [operands] + [[t.clone() for t in operands] for _ in range(count - 1)]


def gemm_case(shape: str, threads: int, work: Path):
    m, k, n = (int(v) for v in shape.split("x"))
    x, weight, bias = torch.randn(m, k), torch.randn(n, k) / k ** 0.5, torch.randn(n)
    launcher, tilings = gemm_bench._compile_template(m, k, n, threads, work)
    operands = [x, pack_panels(weight), pad_bias(bias), torch.empty(m, n)]
    return launcher, tilings, operands, F.linear(x, weight, bias)


def conv_case(shape: str, threads: int, work: Path):
    c, h, w, oc, ks, stride, pad = conv_bench.parse(shape)
    x, weight, bias = torch.randn(1, c, h, w), torch.randn(oc, c, ks, ks) / (c * ks * ks) ** 0.5, torch.randn(oc)
    reference = F.conv2d(x, weight, bias, stride, pad)
    launcher, tilings = conv_bench._compile_template(conv_bench._kernel(c, h, w, oc, ks, stride, pad), threads, work)
    operands = [x, pack_panels(weight.reshape(oc, -1)), pad_bias(bias), torch.empty_like(reference)]
    return launcher, tilings, operands, reference


def _buffer(name: str, shape: tuple) -> Buffer:
    return Buffer(name, shape, contiguous_strides(shape), torch.float32, "input")


def winograd_case(shape: str, threads: int, work: Path):
    c, size = (int(v) for v in shape.split("x"))
    x, weight, bias = torch.randn(1, c, size, size), torch.randn(c, c, 3, 3) / (9 * c) ** 0.5, torch.randn(c)
    kernel = WinogradConvKernel("winograd_none_0", "winograd_none", (1, c, size, size), c, (1, 1),
                                (_buffer("x", (c * size * size,)), _buffer("u", (16, c, c)), _buffer("bias", (c,))),
                                (_buffer("out", (1, c, size, size)),), epilogue="none", has_bias=True)
    tilings = winograd_template.solve(kernel, threads, vector_bytes=target_vector_bytes())
    launcher = compile_candidates(kernel, tilings, work)
    operands = [x, winograd_weights(weight).contiguous(), bias, torch.empty(1, c, size, size)]
    return launcher, tilings, operands, F.conv2d(x, weight, bias, 1, 1)


def measure(case, shape: str, threads: int, rounds: int, work: Path) -> list[tuple[str, float, float]]:
    """(tiling_repr, warm us, cold us) per tiling: medians over ``rounds`` interleaved rounds."""
    torch.set_num_threads(threads)
    launcher, tilings, operands, reference = case(shape, threads, work)
    sets = _operand_sets(operands, _copies(*operands))
    args = [launcher.arguments(s) for s in sets]  # the tensors stay alive in `sets`
    variants = {}
    for t in tilings:
        launcher.launch(t.kernel_key, args[0])
        torch.testing.assert_close(operands[-1], reference, atol=ATOL, rtol=RTOL, msg=lambda m: f"{t.tiling_repr}: {m}")
        variants[t.tiling_repr, "warm"] = lambda key=t.kernel_key: launcher.launch(key, args[0])
        variants[t.tiling_repr, "cold"] = lambda key=t.kernel_key, sets=itertools.cycle(args): launcher.launch(key, next(sets))
    # at least one pass over every copy per sample, so each cold call finds its operands evicted
    calls = max(len(args), calls_per_sample(variants[tilings[0].tiling_repr, "warm"], 0.05, 8))
    medians = interleaved_medians(variants, rounds, calls)
    return [(t.tiling_repr, medians[t.tiling_repr, "warm"], medians[t.tiling_repr, "cold"]) for t in tilings]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gemm", default=GEMM_SHAPES, help="comma-separated MxKxN, or 'none'")
    parser.add_argument("--conv", default=CONV_SHAPES, help="comma-separated CxHxW-OC-k<k>s<s>p<p>, or 'none'")
    parser.add_argument("--winograd", default=WINOGRAD_SHAPES, help="comma-separated CxSIZE (3x3, pad 1), or 'none'")
    parser.add_argument("--threads", default=f"1,{torch.get_num_threads()}", help="comma-separated thread counts")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cases = [(gemm_case, args.gemm), (conv_case, args.conv), (winograd_case, args.winograd)]
    with tempfile.TemporaryDirectory(prefix="aotpack-cold-bench-") as tmp:
        for threads in sorted({int(t) for t in args.threads.split(",")}):
            print(f"\n{threads} thread{'s' if threads > 1 else ''}: median us per launch, operands in cache (warm) "
                  "and not (cold)")
            print(f"{'shape':>22} {'tiling':>72} {'warm':>9} {'cold':>9} {'cold/warm':>9}")
            for case, shapes in cases:
                for shape in ([] if shapes == "none" else shapes.split(",")):
                    work = Path(tmp) / f"{case.__name__}-{shape}-{threads}"
                    for repr_, warm, cold in measure(case, shape, threads, args.rounds, work):
                        print(f"{shape:>22} {repr_:>72} {warm:9.1f} {cold:9.1f} {cold / warm:8.2f}x", flush=True)


if __name__ == "__main__":
    main()
