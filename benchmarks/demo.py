"""`make demo`: build a sample, run it through the native runtime, compare with eager.

Prints the archive, the build time, the max abs error against eager, and both
latencies (medians of interleaved rounds).
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from aotpack.build import build  # noqa: E402
from aotpack.config import Settings  # noqa: E402
from aotpack.runtime.native import run_tensors  # noqa: E402
from common import eager_latency_us, load_sample, max_abs_error  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", nargs="?", default="samples/transformer_block.py")
    parser.add_argument("--topn", default="3")
    parser.add_argument("-o", "--output-dir", default="dist")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="aotpack: %(message)s")

    start = time.perf_counter()
    result = build(args.model, args.output_dir, settings=Settings.from_env(topn=args.topn))
    build_s = time.perf_counter() - start
    module, inputs = load_sample(args.model)
    with torch.inference_mode():
        reference = module(*inputs)
    reference = [reference] if isinstance(reference, torch.Tensor) else list(reference)

    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as work:
        outputs, _ = run_tensors(result.archive, inputs, work)
        error = max_abs_error(outputs, reference)
        for _ in range(args.rounds):  # interleave A B A B: the machine's noise hits both
            ours.append(run_tensors(result.archive, inputs, work, bench=args.runs)[1]["median"])
            theirs.append(eager_latency_us(module, inputs, args.runs))
    aot, eager = statistics.median(ours), statistics.median(theirs)
    print()
    print(f"archive        {result.archive} ({result.archive.stat().st_size / 1e6:.2f} MB)")
    print(f"build          {build_s:.1f} s (topn {args.topn})")
    print(f"max abs error  {error:.3g} vs eager PyTorch")
    print(f"latency        aotpack {aot:.0f} us | eager {eager:.0f} us | ratio {aot / eager:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
