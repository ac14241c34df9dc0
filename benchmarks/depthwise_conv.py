"""aotpack's depthwise conv template against ATen and oneDNN (packed weight) on
MobileNetV3-Small's depthwise shapes, interleaved in one process, at 1 thread and at all
cores.

Each conv has a bias and its activation (the form a conv -> batch norm -> activation takes
once the batch norm is folded into the weights): ATen runs ``F.conv2d`` then the
activation, oneDNN ``_convolution_pointwise`` with the activation as a post-op, the
template fuses both. Every tiling the solver offers is compiled; the table shows the
fastest one (what PGO picks) and the default. Outputs are checked against eager first
(|d| <= 1e-4 + 1e-3 |ref|). Ratios are the template's median over each peer's (< 1:
faster). All three are called from Python (a few us each).

    python benchmarks/depthwise_conv.py
    python benchmarks/depthwise_conv.py --shapes 240x14x14:k5s1:hardswish --threads 1
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aotpack.backends.cpu import depthwise_template  # noqa: E402
from aotpack.ir.graph import Buffer, contiguous_strides  # noqa: E402
from aotpack.ir.template_kernels import DepthwiseConvKernel  # noqa: E402
from common import calls_per_sample, compile_candidates, interleaved_medians, target_vector_bytes  # noqa: E402

#: CxHxW:kKsS:activation of MobileNetV3-Small's depthwise convs (the input; padding K // 2).
DEFAULT_SHAPES = ["16x112x112:k3s2:relu", "72x56x56:k3s2:relu", "88x28x28:k3s1:relu", "96x28x28:k5s2:hardswish",
                  "240x14x14:k5s1:hardswish", "120x14x14:k5s1:hardswish", "144x14x14:k5s1:hardswish",
                  "288x14x14:k5s2:hardswish", "576x7x7:k5s1:hardswish"]
ACTIVATIONS = {"none": lambda y: y, "relu": F.relu, "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid,
               "sigmoid": torch.sigmoid, "swish": F.silu}


def parse(shape: str) -> tuple:
    """(C, H, W, kernel, stride, activation) of ``CxHxW:kKsS:activation``."""
    dims, conv, activation = shape.split(":")
    c, h, w = (int(v) for v in dims.split("x"))
    kernel, stride = (int(v) for v in conv.removeprefix("k").split("s"))
    return c, h, w, kernel, stride, activation


def _buffer(name: str, shape: tuple) -> Buffer:
    return Buffer(name, shape, contiguous_strides(shape), torch.float32, "input")


def kernel_of(c: int, h: int, w: int, k: int, s: int, activation: str) -> DepthwiseConvKernel:
    """The template kernel of a batch-1 contiguous depthwise conv with a bias."""
    p = k // 2
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    return DepthwiseConvKernel(f"dw_{c}x{h}x{w}_k{k}s{s}", "dw", 1, c, (h, w), (oh, ow), (k, k), (s, s), (p, p), (1, 1),
                               (_buffer("x", (1, c, h, w)), _buffer("w", (c, 1, k, k)), _buffer("b", (c,))),
                               (_buffer("out", (1, c, oh, ow)),), epilogue=activation, has_bias=True,
                               x_strides=contiguous_strides((1, c, h, w)),
                               weight_strides=contiguous_strides((c, 1, k, k)))


def measure(shape: str, threads: int, rounds: int, work: Path) -> dict:
    """Median us per variant over interleaved rounds (the order rotating each round)."""
    c, h, w, k, s, activation = parse(shape)
    torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(0)
    x, weight, bias = (torch.randn(1, c, h, w, generator=generator), torch.randn(c, 1, k, k, generator=generator),
                       torch.randn(c, generator=generator))
    act = ACTIVATIONS[activation]
    p = k // 2
    reference = act(F.conv2d(x, weight, bias, s, p, 1, c))
    kernel = kernel_of(c, h, w, k, s, activation)
    tilings = depthwise_template.solve(kernel, threads, vector_bytes=target_vector_bytes())
    launcher = compile_candidates(kernel, tilings, work / f"{shape.replace(':', '_')}-{threads}")
    out = torch.empty(reference.shape)
    args = launcher.arguments([x, weight, bias, out])  # x, weight, bias, out stay alive: raw pointers
    variants = {f"template[{t.tiling_repr.removeprefix('cpu_depthwise_conv;')}]":
                (lambda key=t.kernel_key: launcher.launch(key, args)) for t in tilings}
    packed = torch.ops.mkldnn._reorder_convolution_weight(weight, [p, p], [s, s], [1, 1], c, list(x.shape))
    variants["aten"] = lambda: act(F.conv2d(x, weight, bias, s, p, 1, c))
    variants["onednn"] = lambda: torch.ops.mkldnn._convolution_pointwise(x, packed, bias, [p, p], [s, s], [1, 1], c,
                                                                         activation, [], None)
    with torch.inference_mode():
        for name, fn in variants.items():
            got = fn()
            got = out if name.startswith("template") else got
            torch.testing.assert_close(got, reference, atol=1e-4, rtol=1e-3, msg=lambda t: f"{name}: {t}")
        return interleaved_medians(variants, rounds, calls_per_sample(variants["aten"], 0.05, 5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma-separated CxHxW:kKsS:activation")
    parser.add_argument("--threads", default=f"1,{torch.get_num_threads()}", help="comma-separated thread counts")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="aotpack-dwconv-bench-") as tmp:
        for threads in sorted({int(t) for t in args.threads.split(",")}):
            print(f"\n{threads} thread{'s' if threads > 1 else ''}: median us (template / peer)")
            print(f"{'shape':>26} {'template best':>28} {'us':>8} {'default us':>10} {'aten':>14} {'onednn':>14}")
            totals = {"best": 0.0, "aten": 0.0, "onednn": 0.0}
            for shape in args.shapes.split(","):
                result = measure(shape, threads, args.rounds, Path(tmp))
                own = {name: us for name, us in result.items() if name.startswith("template")}
                best = min(own, key=own.get)
                totals["best"] += own[best]
                totals["aten"] += result["aten"]
                totals["onednn"] += result["onednn"]
                cells = [f"{result[p]:8.1f} {own[best] / result[p]:4.2f}x" for p in ("aten", "onednn")]
                print(f"{shape:>26} {best.removeprefix('template'):>28} {own[best]:8.1f} "
                      f"{next(iter(own.values())):10.1f} {' '.join(cells)}", flush=True)
            print(f"{'sum':>26} {'':>28} {totals['best']:8.1f} {'':>10} "
                  f"{totals['aten']:8.1f} {totals['best'] / totals['aten']:4.2f}x "
                  f"{totals['onednn']:8.1f} {totals['best'] / totals['onednn']:4.2f}x")


if __name__ == "__main__":
    main()
