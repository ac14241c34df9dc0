"""aotpack vs eager PyTorch vs AOTInductor on the bundled samples.

For each sample: cold build time (fresh kernel cache, in a fresh process, like a user
running the CLI), archive size vs the ``.pt2``, and latency of the three, measured in
interleaved rounds (aotpack, eager, AOTInductor, aotpack, ...) so the machine's
+-20-30 % noise hits all of them; medians and ratios are printed.

    .venv/bin/python benchmarks/compare.py [--samples mlp transformer_block] [--topn 3]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from aotpack.runtime.native import run_tensors  # noqa: E402
from common import eager_latency_us, load_sample, max_abs_error  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

AOTI_SCRIPT = """
import sys, importlib.util, torch
spec = importlib.util.spec_from_file_location("m", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
with torch.no_grad():
    ep = torch.export.export(m.model().eval(), m.example_inputs())
    torch._inductor.aoti_compile_and_package(ep, package_path=sys.argv[2])
"""


def timed(cmd: list[str], env=None) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    return time.perf_counter() - start


def build_both(sample: Path, work: Path, topn: str) -> dict:
    import os

    env = dict(os.environ, AOTPACK_CACHE_DIR=str(work / "cache"))
    aot_s = timed([sys.executable, "-m", "aotpack", "-q", "build", str(sample), "-o", str(work),
                   "--topn", topn], env)
    archive = next(work.glob(f"{sample.stem}-*.aotpack"))
    pt2 = work / f"{sample.stem}.pt2"
    # a fresh Inductor cache too, so both builds are cold
    aoti_env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(work / "inductor-cache"))
    aoti_s = timed([sys.executable, "-c", AOTI_SCRIPT, str(sample), str(pt2)], aoti_env)
    return {"archive": archive, "pt2": pt2, "aotpack_build_s": aot_s, "aoti_build_s": aoti_s}


def compare(sample: Path, topn: str, rounds: int, runs: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="aotpack-bench-") as tmp:
        work = Path(tmp)
        built = build_both(sample, work, topn)
        module, inputs = load_sample(sample)
        runner = torch._inductor.aoti_load_package(str(built["pt2"]))
        with torch.inference_mode():
            reference = module(*inputs)
        outputs, _ = run_tensors(built["archive"], inputs, work / "io")
        error = max_abs_error(outputs, [reference])
        lat = {"aotpack": [], "eager": [], "aoti": []}
        for _ in range(rounds):
            lat["aotpack"].append(run_tensors(built["archive"], inputs, work / "io", bench=runs)[1]["median"])
            lat["eager"].append(eager_latency_us(module, inputs, runs))
            lat["aoti"].append(eager_latency_us(runner, inputs, runs))
        medians = {k: statistics.median(v) for k, v in lat.items()}
        return {**built, "error": error, **{f"{k}_us": v for k, v in medians.items()},
                "archive_mb": built["archive"].stat().st_size / 1e6,
                "pt2_mb": built["pt2"].stat().st_size / 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", nargs="+", default=["mlp", "transformer_block"])
    parser.add_argument("--topn", default="3")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, topn {args.topn}, "
          f"{args.rounds} interleaved rounds x {args.runs} runs (medians)")
    header = (f"{'sample':18} {'build s':>8} {'aoti s':>7} {'aotpack us':>11} {'eager us':>9} {'aoti us':>8} "
              f"{'vs eager':>8} {'vs aoti':>8} {'.aotpack MB':>11} {'.pt2 MB':>8} {'max err':>8}")
    print(header)
    for name in args.samples:
        r = compare(REPO / "samples" / f"{name}.py", args.topn, args.rounds, args.runs)
        print(f"{name:18} {r['aotpack_build_s']:8.1f} {r['aoti_build_s']:7.1f} {r['aotpack_us']:11.0f} "
              f"{r['eager_us']:9.0f} {r['aoti_us']:8.0f} {r['aotpack_us'] / r['eager_us']:7.2f}x "
              f"{r['aotpack_us'] / r['aoti_us']:7.2f}x {r['archive_mb']:11.2f} {r['pt2_mb']:8.2f} "
              f"{r['error']:8.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
