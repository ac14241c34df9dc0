"""A/B of the runtime's host buffer cache (AOTPACK_HOST_CACHE_MB=0 vs the default 1 GiB).

The runtime reads AOTPACK_HOST_CACHE_MB once per process, so each measurement is a fresh
subprocess; the two variants alternate (off, on, on, off, ...) for ``--rounds`` rounds, and
each subprocess prints the median and the 10th percentile of ``--runs`` calls (after 3
warm-up calls) of aotpack (``aotpack.load(archive, device_limit=threads)``) and of eager at
the same thread count. Printed per statistic: its median over rounds per variant and the
ratio off/on. On a shared machine the median of a sub-millisecond case at 2 threads is
bimodal (a descheduled OpenMP thread costs a timeslice); the 10th percentile is steadier.
Cases and builds are those of benchmarks/reductions.py (``--topn`` candidates, PGO at the
thread count).

    .venv/bin/python benchmarks/host_cache.py [--threads 1 2] [--cases softmax layer_norm]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import wall_times  # noqa: E402
from reductions import CASES, build_case  # noqa: E402


def quantiles(fn, runs: int) -> tuple[float, float]:
    """(median, 10th percentile) wall time of ``fn()`` over ``runs`` calls, in seconds."""
    samples = wall_times(fn, runs)
    return statistics.median(samples), samples[len(samples) // 10]


def child(name: str, archive: str, threads: int, runs: int) -> None:
    """Prints {"aotpack": [median, p10], "eager": [median, p10]} (seconds) of `runs` calls."""
    import torch

    import aotpack

    body, shape, _ = CASES[name]
    namespace: dict = {}
    exec(f"import torch\ndef forward(x):\n    {body}\n", namespace)
    eager = namespace["forward"]
    torch.set_num_threads(threads)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    with aotpack.load(archive, device_limit=threads) as model, torch.inference_mode():
        for _ in range(3):
            model(x), eager(x)
        result = {"aotpack": quantiles(lambda: model(x), runs),
                  "eager": quantiles(lambda: eager(x), runs)}
    print(json.dumps(result))


def measure(name: str, archive: Path, threads: int, cache_mb: str | None, runs: int) -> dict:
    env = dict(os.environ)
    env.pop("AOTPACK_HOST_CACHE_MB", None)
    if cache_mb is not None:
        env["AOTPACK_HOST_CACHE_MB"] = cache_mb
    out = subprocess.run([sys.executable, __file__, "--child", name, str(archive), str(threads),
                          str(runs)], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=["softmax", "layer_norm"])
    parser.add_argument("--topn", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--work", type=Path, default=None, help="build folder (default: a temporary one)")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, archive, threads, runs = args.child
        return child(name, archive, int(threads), int(runs))
    with tempfile.TemporaryDirectory(prefix="aotpack-host-cache-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for threads in args.threads:
            for name in args.cases:
                archive = build_case(name, work, threads, args.topn)
                times = {"off": [], "on": [], "eager": []}  # [(median, p10)] per subprocess
                for r in range(args.rounds):
                    for variant in (("off", "on") if r % 2 == 0 else ("on", "off")):
                        t = measure(name, archive, threads, "0" if variant == "off" else None, args.runs)
                        times[variant].append(t["aotpack"])
                        times["eager"].append(t["eager"])
                for q, label in ((0, "median"), (1, "p10")):
                    m = {k: statistics.median(t[q] for t in v) for k, v in times.items()}
                    print(f"{name:<10} {threads}t {label:<6} cache off {m['off'] * 1e3:7.3f} ms  "
                          f"on {m['on'] * 1e3:7.3f} ms  off/on {m['off'] / m['on']:5.2f}x  "
                          f"eager {m['eager'] * 1e3:7.3f} ms  eager/on {m['eager'] / m['on']:5.2f}x",
                          flush=True)


if __name__ == "__main__":
    main()
