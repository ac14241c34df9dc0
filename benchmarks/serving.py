"""aotpack-serve under a closed loop on loopback: throughput and latency per partitioning.

For each model (a small CNN, tests/models/small_cnn.py, and a transformer block,
samples/transformer_block.py) and each configuration (1 instance x 2 cores, 2 instances x
1 core; each served from an archive built with ``--device-limit`` = the cores per instance),
``C`` client threads (C = 1, 2, 4, 8) each keep one request in flight on their own keep-alive
connection (binary tensor data, as tritonclient sends it) for ``--seconds``; printed per
cell: requests/s and the p50 / p99 latency in ms. Both servers run at once and the cells are
measured in rounds, configurations alternating, so slow drifts of a shared machine fall on
both; the table gives each cell's median over rounds. ``in-process`` is the ceiling: the
same partitions through ``aotpack.load(cores=...)``, one thread per instance, no HTTP.

The clients run on the same cores as the server (a 2-core machine has no others), so every
figure includes the client's CPU time; compare the rows with each other, not with an
idle machine.

    .venv/bin/python benchmarks/serving.py [--seconds 2] [--rounds 3] [--topn 1]
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS = {"small_cnn": REPO / "tests" / "models" / "small_cnn.py",
          "transformer_block": REPO / "samples" / "transformer_block.py"}
CONFIGS = {"1x2": (1, 2), "2x1": (2, 1)}  # instances x cores per instance
CONCURRENCY = (1, 2, 4, 8)


def build(model_file: Path, device_limit: int, topn: int, out: Path) -> Path:
    """The archive of ``model_file`` tuned for ``device_limit`` cores."""
    from aotpack.build import build as build_archive
    from aotpack.config import Settings

    folder = out / f"{model_file.stem}-dl{device_limit}"
    settings = Settings.from_env(topn=topn, device_limit=device_limit)
    return build_archive(model_file, folder, settings=settings).archive


def start_server(repository: Path, instances: int, cores: int) -> tuple[subprocess.Popen, int]:
    """aotpack-serve on a free port; (process, port)."""
    from aotpack.runtime.native import find_server

    process = subprocess.Popen([find_server(), repository, "--port", "0", "--instances", str(instances),
                                "--cores-per-instance", str(cores)], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    ready, _, _ = select.select([process.stdout], [], [], 120)
    line = process.stdout.readline() if ready else ""
    if not line.startswith("port="):
        process.kill()
        raise SystemExit(f"aotpack-serve did not start (printed {line!r})")
    return process, int(line.removeprefix("port="))


def infer_body(x) -> tuple[bytes, dict]:
    """A binary-data infer request for input ``x`` (a float32 tensor) and its headers."""
    header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                                     "parameters": {"binary_data_size": x.numel() * 4}}],
                         "outputs": [{"name": "output_0", "parameters": {"binary_data": True}}]}).encode()
    return header + x.numpy().tobytes(), {"Inference-Header-Content-Length": str(len(header)),
                                          "Content-Type": "application/octet-stream"}


def run_threads(target, arguments: list[tuple]) -> float:
    """Runs ``target(*a)`` on one thread per entry of ``arguments``; seconds until all ended."""
    threads = [threading.Thread(target=target, args=a) for a in arguments]
    begin = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - begin


def closed_loop(port: int, model: str, body: bytes, headers: dict, clients: int, seconds: float) -> dict:
    """``clients`` threads, one request in flight each, for ``seconds``: requests/s, p50, p99 (ms)."""
    latencies: list[float] = []
    errors: list[str] = []
    stop = time.perf_counter() + seconds

    def loop():
        connection = http.client.HTTPConnection("localhost", port, timeout=60)
        mine = []
        while time.perf_counter() < stop:
            start = time.perf_counter()
            connection.request("POST", f"/v2/models/{model}/infer", body=body, headers=headers)
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                errors.append(f"HTTP {response.status}")
                break
            mine.append(time.perf_counter() - start)
        connection.close()
        latencies.extend(mine)

    elapsed = run_threads(loop, [()] * clients)
    if errors:
        raise SystemExit(f"{model}: {errors[0]}")
    latencies.sort()
    return {"rps": len(latencies) / elapsed, "p50": latencies[len(latencies) // 2] * 1e3,
            "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3}


def in_process(archive: Path, instances: int, cores: int, x, seconds: float) -> float:
    """Requests/s of ``instances`` models on their partitions, one calling thread each."""
    import aotpack

    allowed = sorted(os.sched_getaffinity(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        models = [aotpack.load(archive, cores=allowed[i * cores:(i + 1) * cores]) for i in range(instances)]
    counts = [0] * instances
    stop = time.perf_counter() + seconds

    def loop(i):
        while time.perf_counter() < stop:
            models[i].run(x)
            counts[i] += 1

    elapsed = run_threads(loop, [(i,) for i in range(instances)])
    for m in models:
        m.close()
    return sum(counts) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=2.0, help="per cell and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--topn", type=int, default=1, help="candidates per kernel in the builds")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("serving.py: needs 2 cores (1 instance x 2 cores against 2 x 1)")
    from aotpack.frontend.export import load_model_file

    with tempfile.TemporaryDirectory(prefix="aotpack-serving-") as work:
        work = Path(work)
        servers, cells, inputs, archives = {}, {}, {}, {}
        try:
            for name in args.models:
                inputs[name] = load_model_file(MODELS[name]).example_inputs[0].contiguous()
                for config, (instances, cores) in CONFIGS.items():
                    archive = build(MODELS[name], cores, args.topn, work / "builds")
                    archives[name, config] = archive
                    repository = work / f"repo-{name}-{config}"
                    (repository / name / "1").mkdir(parents=True)
                    shutil.copy(archive, repository / name / "1" / archive.name)
                    servers[name, config] = start_server(repository, instances, cores)
            for _ in range(args.rounds):
                for name in args.models:
                    body, headers = infer_body(inputs[name])
                    for clients in CONCURRENCY:
                        for config in CONFIGS:
                            port = servers[name, config][1]
                            closed_loop(port, name, body, headers, clients, 0.2)  # warm the connection path
                            cells.setdefault((name, config, clients), []).append(
                                closed_loop(port, name, body, headers, clients, args.seconds))
                    for config, (instances, cores) in CONFIGS.items():
                        rps = in_process(archives[name, config], instances, cores, inputs[name], args.seconds)
                        cells.setdefault((name, config, "in-process"), []).append({"rps": rps})
        finally:
            for process, _ in servers.values():
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=60)
    print(f"{'model':18} {'config':6} {'clients':>10} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for (name, config, clients), runs in cells.items():
        row = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        p50 = f"{row['p50']:8.2f}" if "p50" in row else f"{'-':>8}"
        p99 = f"{row['p99']:8.2f}" if "p99" in row else f"{'-':>8}"
        print(f"{name:18} {config:6} {clients!s:>10} {row['rps']:9.1f} {p50} {p99}")
    for name in args.models:
        for clients in (*CONCURRENCY, "in-process"):
            a, b = (statistics.median(r["rps"] for r in cells[name, c, clients]) for c in CONFIGS)
            label = "in-process" if clients == "in-process" else f"{clients} client(s)"
            print(f"{name}, {label}: throughput 2x1 / 1x2 = {b / a:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
