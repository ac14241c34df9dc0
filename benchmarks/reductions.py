"""Memory-bound reductions: aotpack vs eager PyTorch vs the streaming bandwidth of this host.

Cases: row softmax of 4096x4096, layer_norm of 64x4096, column sum of 4096x4096, sum of
[1, 16M] (float32). Each is built with ``aotpack.build`` (PGO over ``--topn`` candidates,
device limit = thread count) and run in-process through ``aotpack.load``. Bandwidth of a
run = bytes it must move (inputs read + outputs written) / its time; the reference is a
plain copy (``dst.copy_(src)``, preallocated) of a buffer with half those bytes (it reads
and writes them), at the same thread count, timed in the same rounds. ``% bw`` = run
bandwidth / copy bandwidth. A reduction only reads, which is cheaper than a copy's
read + write, so its % can exceed 100. Every run returns a freshly allocated output (as
eager does), and first-touching fresh pages costs about as much as the copy itself on
a VM, so ``clone`` (an allocating copy of the same bytes) is printed too, and ``% clone``
compares against it. ``pgo`` is the build's own kernel-only time of the winners
(preallocated outputs, from the manifest's ``timings_us``; '-' when not timed) with its
% of the copy bandwidth.

Variants are timed interleaved (copy, aotpack, eager, copy, ...) in ``--rounds`` rounds of
``--runs`` calls; each prints the median over rounds of the per-round medians.

    .venv/bin/python benchmarks/reductions.py [--threads 1 2] [--cases softmax colsum] [--topn 4]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

import aotpack
from aotpack.build import build
from aotpack.config import Settings
from common import wall_times

#: name -> (forward body, input shape, output numel)
CASES = {
    "softmax": ("return torch.softmax(x, -1)", (4096, 4096), 4096 * 4096),
    "layer_norm": ("return torch.nn.functional.layer_norm(x, (4096,))", (64, 4096), 64 * 4096),
    "colsum": ("return x.sum(0)", (4096, 4096), 4096),
    "sum16m": ("return x.sum()", (1, 16 * 1024 * 1024), 1),
}

MODEL_TEMPLATE = """import torch


class M(torch.nn.Module):
    def forward(self, x):
        {body}


def model():
    return M()


def example_inputs():
    return (torch.randn({shape}, generator=torch.Generator().manual_seed(0)),)
"""


def median_time(fn, runs: int) -> float:
    """Median wall time of ``fn()`` over ``runs`` calls, in seconds."""
    return statistics.median(wall_times(fn, runs))


def build_case(name: str, work: Path, threads: int, topn: int) -> Path:
    body, shape, _ = CASES[name]
    path = work / f"{name}.py"
    path.write_text(MODEL_TEMPLATE.format(body=body, shape=shape))
    settings = Settings.from_env(topn=topn, device_limit=threads, cache_dir=work / "cache")
    return build(path, work / f"dist{threads}", settings=settings).archive


def measure(name: str, archive: Path, threads: int, rounds: int, runs: int) -> dict:
    """Median seconds of copy, aotpack and eager for one case at ``threads`` threads."""
    body, shape, out_numel = CASES[name]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    moved = (x.numel() + out_numel) * 4  # bytes read + written by the case
    src = torch.empty(max(1, moved // 8), dtype=torch.float32)  # copy of moved/2 bytes moves `moved`
    src.normal_()
    dst = torch.empty_like(src)
    namespace: dict = {}
    exec(f"import torch\ndef forward(x):\n    {body}\n", namespace)
    eager = namespace["forward"]
    torch.set_num_threads(threads)
    times: dict[str, list[float]] = {"copy": [], "clone": [], "aotpack": [], "eager": []}
    with aotpack.load(archive, device_limit=threads) as model, torch.inference_mode():
        for fn in (lambda: dst.copy_(src), lambda: model(x), lambda: eager(x)):
            fn()  # warm-up: page in code and first-touch buffers
        for _ in range(rounds):
            times["copy"].append(median_time(lambda: dst.copy_(src), runs))
            times["clone"].append(median_time(lambda: src.clone(), runs))
            times["aotpack"].append(median_time(lambda: model(x), runs))
            times["eager"].append(median_time(lambda: eager(x), runs))
        kernels = model.manifest["kernels"]
    result = {k: statistics.median(v) for k, v in times.items()}
    result["moved"] = moved
    timed = [min(k["timings_us"]) for k in kernels if k.get("timings_us")]
    result["pgo"] = sum(timed) * 1e-6 if kernels and len(timed) == len(kernels) else None
    return result


def report(name: str, threads: int, r: dict) -> str:
    copy_bw, clone_bw = r["moved"] / r["copy"], r["moved"] / r["clone"]
    cells = [f"{name:<10} {threads:>2}t  copy {r['copy'] * 1e3:7.2f} ms ({copy_bw / 1e9:5.1f} GB/s)"
             f"  clone {r['clone'] * 1e3:7.2f} ms"]
    for key in ("aotpack", "eager"):
        bw = r["moved"] / r[key]
        cells.append(f"{key} {r[key] * 1e3:7.2f} ms {100 * bw / copy_bw:4.0f}% bw {100 * bw / clone_bw:4.0f}% clone")
    if r["pgo"]:
        cells.append(f"pgo {r['pgo'] * 1e3:7.2f} ms {100 * r['moved'] / r['pgo'] / copy_bw:4.0f}% bw")
    else:
        cells.append("pgo       -")
    cells.append(f"eager/aotpack {r['eager'] / r['aotpack']:5.2f}x")
    return "  ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--topn", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--work", type=Path, default=None, help="build folder (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="aotpack-reductions-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for threads in args.threads:
            for name in args.cases:
                archive = build_case(name, work, threads, args.topn)
                print(report(name, threads, measure(name, archive, threads, args.rounds, args.runs)), flush=True)


if __name__ == "__main__":
    main()
