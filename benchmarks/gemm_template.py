"""aotpack's GEMM template against ATen, oneDNN (packed weight) and ONNX Runtime on linear
shapes, interleaved in one process, at 1 thread and at all cores.

Every tiling the solver offers is compiled; the table shows the fastest one (what PGO
picks) and the default. Outputs are checked against ``F.linear`` first
(|d| <= 1e-4 + 1e-3 |ref|). Ratios are the template's median over each peer's (< 1: faster).

    python benchmarks/gemm_template.py                      # the sample models' shapes
    python benchmarks/gemm_template.py --shapes 128x768x768 --threads 1
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aotpack.backends.cpu import gemm_template  # noqa: E402
from aotpack.ir.graph import Buffer, contiguous_strides  # noqa: E402
from aotpack.ir.template_kernels import GemmKernel  # noqa: E402
from aotpack.backends.cpu.weights import GEMM_PANEL, pack_panels, pad_bias  # noqa: E402
from common import calls_per_sample, compile_candidates, interleaved_medians, target_vector_bytes  # noqa: E402

#: MxKxN of the bundled samples (mlp, transformer_block) and of the tiny BERT/LLaMA benchmarks.
DEFAULT_SHAPES = ["32x512x2048", "32x2048x512", "128x256x768", "128x256x256", "128x1024x256", "64x256x688"]


def _buffer(name: str, shape: tuple) -> Buffer:
    return Buffer(name, shape, contiguous_strides(shape), torch.float32, "input")


def _compile_template(m: int, k: int, n: int, device_limit: int, work: Path):
    kernel = GemmKernel(f"gemm_bench_{m}x{k}x{n}", "gemm_bench", m, n, k,
                        (_buffer("a", (m, k)), _buffer("w", (-(-n // GEMM_PANEL), k, GEMM_PANEL)),
                         _buffer("bias", (-(-n // GEMM_PANEL) * GEMM_PANEL,))), (_buffer("out", (m, n)),),
                        has_bias=True, a_row_stride=k)
    tilings = gemm_template.solve(kernel, device_limit, vector_bytes=target_vector_bytes())
    return compile_candidates(kernel, tilings, work), tilings


def _ort_session(weight: torch.Tensor, bias: torch.Tensor, m: int, threads: int):
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    n, k = weight.shape
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(weight.numpy(), "w"), numpy_helper.from_array(bias.numpy(), "b")])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])



def measure(shape: str, threads: int, rounds: int, work: Path) -> dict:
    """Median us per variant over interleaved rounds (the order rotating each round)."""
    m, k, n = (int(v) for v in shape.split("x"))
    torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(0)
    x, weight, bias = (torch.randn(m, k, generator=generator), torch.randn(n, k, generator=generator) / k ** 0.5,
                       torch.randn(n, generator=generator))
    reference = F.linear(x, weight, bias)
    launcher, tilings = _compile_template(m, k, n, threads, work / f"{shape}-{threads}")
    out = torch.empty(m, n)
    operands = [x, pack_panels(weight), pad_bias(bias), out]  # kept alive: the launch takes raw pointers
    args = launcher.arguments(operands)
    variants = {f"template[{t.tiling_repr.removeprefix('cpu_gemm;')}]": (lambda key=t.kernel_key: launcher.launch(key, args))
                for t in tilings}
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, batch_size=m)
    variants["aten"] = lambda: torch.addmm(bias, x, weight.t())
    variants["onednn"] = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    session = _ort_session(weight, bias, m, threads)
    if session is not None:
        feed = {"x": x.numpy()}
        variants["onnxruntime"] = lambda: session.run(None, feed)
    for name, fn in variants.items():
        fn()
        if name.startswith("template"):
            torch.testing.assert_close(out, reference, atol=1e-4, rtol=1e-3, msg=lambda t: f"{name}: {t}")
    return interleaved_medians(variants, rounds, calls_per_sample(variants["aten"], 0.1, 5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma-separated MxKxN")
    parser.add_argument("--threads", default=f"1,{torch.get_num_threads()}", help="comma-separated thread counts")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="aotpack-gemm-bench-") as tmp:
        for threads in sorted({int(t) for t in args.threads.split(",")}):
            print(f"\n{threads} thread{'s' if threads > 1 else ''}: median us (template / peer)")
            print(f"{'MxKxN':>14} {'template best':>28} {'us':>8} {'default us':>10} {'aten':>14} "
                  f"{'onednn':>14} {'onnxruntime':>14}")
            for shape in args.shapes.split(","):
                result = measure(shape, threads, args.rounds, Path(tmp))
                own = {name: us for name, us in result.items() if name.startswith("template")}
                best = min(own, key=own.get)
                cells = [f"{result[p]:8.1f} {own[best] / result[p]:4.2f}x" if p in result else f"{'-':>14}"
                         for p in ("aten", "onednn", "onnxruntime")]
                print(f"{shape:>14} {best.removeprefix('template'):>28} {own[best]:8.1f} "
                      f"{next(iter(own.values())):10.1f} {' '.join(cells)}")


if __name__ == "__main__":
    main()
