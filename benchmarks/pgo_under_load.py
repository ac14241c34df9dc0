"""Does PGO pick the same winners on an idle machine and beside a busy process?

    python benchmarks/pgo_under_load.py [MODEL] [--rounds 2] [--busy 1] [--topn 3]

Builds MODEL (default ``samples/transformer_block.py``) ``--rounds`` times idle and
``--rounds`` times while ``--busy`` processes spin on the CPU, alternating idle and busy
builds, each in a fresh kernel cache (so every kernel and GEMM step is timed again). Then,
per kernel and per GEMM/conv step, it prints the winner of every build and, where the busy
builds' winner differs from the idle builds', how much slower that choice is by the idle
builds' own timings (``timings_us`` in the manifest: the 0.2-quantile estimate in us).

A kernel whose idle builds disagree among themselves is a close call (its candidates
within the noise), not an effect of the load; the summary counts those apart.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_choices(model: Path, topn: int, work: Path) -> dict[str, tuple[str, dict[str, float]]]:
    """``name -> (winner, {candidate: us})`` for every kernel and GEMM step of one cold build."""
    out, cache = work / "out", work / "cache"
    subprocess.run([sys.executable, "-m", "aotpack", "-q", "build", str(model), "-o", str(out),
                    "--topn", str(topn), "--cache-dir", str(cache)], check=True, stdout=subprocess.DEVNULL)
    archive = next(out.glob("*.aotpack"))
    manifest = json.loads(subprocess.run([sys.executable, "-m", "aotpack", "inspect", "--json", str(archive)],
                                         check=True, capture_output=True, text=True).stdout)
    choices = {}
    for kernel in manifest["kernels"]:
        if kernel["candidates"] > 1:
            choices[kernel["name"]] = (kernel["tiling_repr"],
                                       dict(zip(kernel["candidate_tilings"], kernel["timings_us"])))
    for step in manifest["gemms"]:
        if len(step["candidates"]) > 1:
            choices["gemm " + step["name"]] = (step["winner"], dict(zip(step["candidates"], step["timings_us"])))
    return choices


def spin(count: int) -> list[subprocess.Popen]:
    """``count`` processes that keep one core each busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def run(model: Path, rounds: int, busy: int, topn: int) -> dict[str, list]:
    """``{"idle": [choices per build], "busy": [...]}``, the builds alternated."""
    results: dict[str, list] = {"idle": [], "busy": []}
    for r in range(rounds):
        for mode in ("idle", "busy"):
            spinners = spin(busy) if mode == "busy" else []
            try:
                with tempfile.TemporaryDirectory(prefix="aotpack-pgo-load-") as work:
                    results[mode].append(build_choices(model, topn, Path(work)))
            finally:
                for process in spinners:
                    process.kill()
                    process.wait()
            print(f"round {r + 1}/{rounds}: {mode} build done", flush=True)
    return results


def _idle_us(results: dict[str, list], name: str, winners: set[str]) -> dict[str, float]:
    """Median over the idle builds of each of ``winners``' timing (us) for kernel ``name``."""
    timings = [build[name][1] for build in results["idle"] if name in build]
    return {w: statistics.median(t[w] for t in timings) for w in winners}


def report(results: dict[str, list]) -> int:
    """Print the comparison; return how many kernels the load changed (idle builds agreeing)."""
    names = sorted({name for build in results["idle"] + results["busy"] for name in build})
    changed = close = 0
    print(f"\n{'kernel / GEMM step':44s} {'idle winners':>14s} {'busy winners':>14s}  difference")
    for name in names:
        idle = [b[name][0] for b in results["idle"] if name in b]
        loaded = [b[name][0] for b in results["busy"] if name in b]
        labels = {w: chr(ord("A") + i) for i, w in enumerate(dict.fromkeys(idle + loaded))}
        note = ""
        if not idle or not loaded:  # a kernel tuned on one side only: the load changed what was tuned
            changed += 1
            note = f"tuned only in the {'busy' if not idle else 'idle'} builds"
        elif len(set(idle)) > 1:
            close += 1
            us = _idle_us(results, name, set(idle))
            note = f"idle builds disagree: a close call (their winners within {max(us.values()) / min(us.values()):.2f}x)"
        elif set(loaded) - set(idle):
            changed += 1
            us = _idle_us(results, name, set(idle + loaded))
            base, worst = us[idle[0]], max(us[w] for w in set(loaded) - set(idle))
            note = f"busy pick {worst / base:.2f}x the idle winner's time ({worst:.1f} vs {base:.1f} us, idle timings)"
        print(f"{name[:44]:44s} {''.join(labels[w] for w in idle):>14s} {''.join(labels[w] for w in loaded):>14s}  {note}")
        if note:
            for winner, label in labels.items():
                print(f"{'':8s}{label} = {winner}")
    print(f"\n{len(names)} tuned kernels and GEMM steps: {len(names) - changed - close} same winners, "
          f"{changed} changed by the load, {close} close calls (idle builds disagree)")
    return changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", type=Path, default=ROOT / "samples" / "transformer_block.py")
    parser.add_argument("--rounds", type=int, default=2, help="idle and busy builds each (default 2)")
    parser.add_argument("--busy", type=int, default=1, help="spinning processes during a busy build (default 1)")
    parser.add_argument("--topn", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write every build's choices here")
    args = parser.parse_args()
    if not args.model.is_file():
        sys.exit(f"pgo_under_load: no model file {args.model}: give the path of a model .py")
    try:
        results = run(args.model, args.rounds, args.busy, args.topn)
    except subprocess.CalledProcessError as failed:  # aotpack printed its own error above
        sys.exit(f"pgo_under_load: `{' '.join(failed.cmd[1:4])} ...` failed with exit status {failed.returncode}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    report(results)


if __name__ == "__main__":
    main()
