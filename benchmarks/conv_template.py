"""aotpack's direct-convolution template against ATen and oneDNN (packed weight) on
conv2d shapes, interleaved in one process, at 1 thread and at all cores.

Every tiling the solver offers is compiled; the table shows the fastest one (what PGO
picks) and the default. Outputs are checked against ``F.conv2d`` first
(|d| <= 1e-4 + 1e-3 |ref|). Ratios are the template's median over each peer's (< 1: faster).
A shape is ``CxHxW-OC-k<kernel>s<stride>p<padding>``.

    python benchmarks/conv_template.py                       # ResNet-18's convolutions
    python benchmarks/conv_template.py --shapes 64x56x56-64-k3s1p1 --threads 1
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aotpack.backends.cpu import conv_template  # noqa: E402
from aotpack.ir.graph import Buffer, contiguous_strides  # noqa: E402
from aotpack.ir.template_kernels import ConvKernel  # noqa: E402
from aotpack.backends.cpu.weights import GEMM_PANEL, pack_panels, pad_bias  # noqa: E402
from common import calls_per_sample, compile_candidates, interleaved_medians, target_vector_bytes  # noqa: E402

#: ResNet-18's distinct convolutions at 224x224 (the stem, each stage's 3x3s, the strided
#: 3x3s and 1x1 downsamples) and MobileNetV3-Small's larger 1x1s.
DEFAULT_SHAPES = ["3x224x224-64-k7s2p3", "64x56x56-64-k3s1p1", "64x56x56-128-k3s2p1", "128x28x28-128-k3s1p1",
                  "64x56x56-128-k1s2p0", "256x14x14-256-k3s1p1", "512x7x7-512-k3s1p1", "96x14x14-576-k1s1p0"]
_SHAPE = re.compile(r"(\d+)x(\d+)x(\d+)-(\d+)-k(\d+)s(\d+)p(\d+)$")


def _buffer(name: str, shape: tuple) -> Buffer:
    return Buffer(name, shape, contiguous_strides(shape), torch.float32, "input")


def parse(shape: str) -> tuple:
    """``CxHxW-OC-k<k>s<s>p<p>`` -> (c, h, w, oc, k, s, p)."""
    found = _SHAPE.match(shape)
    if not found:
        raise SystemExit(f"bad shape '{shape}': expected CxHxW-OC-k<kernel>s<stride>p<padding>")
    return tuple(int(v) for v in found.groups())


def _kernel(c, h, w, oc, k, s, p) -> ConvKernel:
    panels = -(-oc // GEMM_PANEL)
    x = _buffer("x", (1, c, h, w))
    kernel = ConvKernel(f"conv_bench_{c}x{h}x{w}_{oc}_{k}_{s}_{p}", "conv_bench", (1, c, h, w), oc, (k, k), (s, s),
                        (p, p), (1, 1), (x, _buffer("w", (panels, c * k * k, GEMM_PANEL)),
                                         _buffer("bias", (panels * GEMM_PANEL,))), (), has_bias=True)
    oh, ow = kernel.out_hw
    return ConvKernel(kernel.name, kernel.base_name, kernel.x_shape, oc, kernel.kernel_size, kernel.stride,
                      kernel.padding, kernel.dilation, kernel.inputs, (_buffer("out", (1, oc, oh, ow)),),
                      has_bias=True)


def _compile_template(kernel: ConvKernel, device_limit: int, work: Path):
    tilings = conv_template.solve(kernel, device_limit, vector_bytes=target_vector_bytes())
    return compile_candidates(kernel, tilings, work), tilings


#: The clock calls are timed with: wall time, or (``--clock thread``, 1 thread only) the
#: calling thread's CPU time, which a busy machine's preemptions do not inflate.
CLOCK = {"wall": time.perf_counter, "thread": time.thread_time}
_clock = CLOCK["wall"]



def measure(shape: str, threads: int, rounds: int, work: Path) -> dict:
    """Median us per variant over interleaved rounds (the order rotating each round)."""
    c, h, w, oc, k, s, p = parse(shape)
    torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, c, h, w, generator=generator)
    weight = torch.randn(oc, c, k, k, generator=generator) / (c * k * k) ** 0.5
    bias = torch.randn(oc, generator=generator)
    reference = F.conv2d(x, weight, bias, s, p)
    kernel = _kernel(c, h, w, oc, k, s, p)
    launcher, tilings = _compile_template(kernel, threads, work / f"{shape}-{threads}")
    out = torch.empty_like(reference)
    operands = [x, pack_panels(weight.reshape(oc, -1)), pad_bias(bias), out]  # kept alive: raw pointers
    args = launcher.arguments(operands)
    variants = {f"template[{t.tiling_repr.removeprefix('cpu_conv;')}]":
                (lambda key=t.kernel_key: launcher.launch(key, args)) for t in tilings}
    packed = torch.ops.mkldnn._reorder_convolution_weight(weight, [p, p], [s, s], [1, 1], 1, list(x.shape))
    variants["aten"] = lambda: F.conv2d(x, weight, bias, s, p)
    variants["onednn"] = lambda: torch.ops.mkldnn._convolution_pointwise(x, packed, bias, [p, p], [s, s], [1, 1],
                                                                         1, "none", [], "")
    for name, fn in variants.items():
        fn()
        if name.startswith("template"):
            torch.testing.assert_close(out, reference, atol=1e-4, rtol=1e-3, msg=lambda t: f"{name}: {t}")
    result = interleaved_medians(variants, rounds, calls_per_sample(variants["aten"], 0.1, 3), _clock)
    result["_gflops"] = kernel.flops / 1e3
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma-separated CxHxW-OC-k<k>s<s>p<p>")
    parser.add_argument("--threads", default=f"1,{torch.get_num_threads()}", help="comma-separated thread counts")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clock", choices=sorted(CLOCK), default="wall",
                        help="thread: time by the thread's CPU time (1 thread; for a busy machine)")
    parser.add_argument("--every", action="store_true", help="also print every tiling's median")
    args = parser.parse_args()
    global _clock
    _clock = CLOCK[args.clock]
    if args.clock == "thread" and args.threads != "1":
        parser.error("--clock thread times one thread: use it with --threads 1")
    with tempfile.TemporaryDirectory(prefix="aotpack-conv-bench-") as tmp:
        for threads in sorted({int(t) for t in args.threads.split(",")}):
            print(f"\n{threads} thread{'s' if threads > 1 else ''}: median us (template / peer), template GFLOPS")
            print(f"{'shape':>22} {'template best':>26} {'us':>8} {'GFLOPS':>7} {'default us':>10} {'aten':>14} "
                  f"{'onednn':>14}")
            for shape in args.shapes.split(","):
                result = measure(shape, threads, args.rounds, Path(tmp))
                own = {name: us for name, us in result.items() if name.startswith("template")}
                best = min(own, key=own.get)
                cells = [f"{result[p]:8.1f} {own[best] / result[p]:4.2f}x" for p in ("aten", "onednn")]
                print(f"{shape:>22} {best.removeprefix('template'):>26} {own[best]:8.1f} "
                      f"{result['_gflops'] / own[best]:7.1f} {next(iter(own.values())):10.1f} {' '.join(cells)}",
                      flush=True)
                if args.every:
                    for name, us in own.items():
                        print(f"{'':>22} {name.removeprefix('template'):>60} {us:8.1f}")


if __name__ == "__main__":
    main()
