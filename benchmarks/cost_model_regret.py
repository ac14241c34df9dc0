"""How well the CPU cost model shortlists: regret against a full PGO sweep.

Build a model with ``--topn 10`` (every candidate of the solver timed), then run this on
the archive: per kernel, the best time among the candidates each policy would have
compiled, over the best time of all, for the solver's first k and for the cost model's
best k (k = what ``--cost-model-ratio`` keeps). Prints ratios (1.00 = found the best).

    python benchmarks/cost_model_regret.py samples/transformer_block.py dist/transformer_block-0.1.0.aotpack
"""
from __future__ import annotations

import argparse
import math
import statistics

from aotpack import backends
from aotpack.config import MAX_TOPN, Settings
from aotpack.frontend.export import export_model, load_model
from aotpack.lower.lowering import lower
from aotpack.archive.reader import read_manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("archive", help="built from MODEL with --topn 10")
    parser.add_argument("--ratio", type=float, default=0.25)
    args = parser.parse_args()
    manifest = read_manifest(args.archive)
    settings = Settings(device_limit=manifest["device_limit"], cost_model=True, cost_model_ratio=args.ratio)
    backend = backends.get(settings.backend)
    graph = lower(export_model(load_model(args.model), None), backend)
    kernels = {k.name: k for k in graph.kernels}
    first, model = [], []
    for entry in manifest["kernels"]:
        timings = dict(zip(entry["candidate_tilings"], entry["timings_us"]))
        if not timings:
            continue
        kernel = kernels[entry["name"]]
        space = backend.solve(kernel, backend.limits(settings), MAX_TOPN)
        if [c.tiling_repr for c in space] != entry["candidate_tilings"]:
            print(f"{entry['name']}: solver space differs from the archive's; skipped")
            continue
        keep = max(1, math.ceil(args.ratio * len(space)))
        best = min(timings.values())
        ranked = sorted(space, key=lambda c: backend.estimate_us(kernel, c, settings))
        by_solver = min(timings[c.tiling_repr] for c in space[:keep]) / best
        by_model = min(timings[c.tiling_repr] for c in ranked[:keep]) / best
        first.append(by_solver)
        model.append(by_model)
        print(f"{entry['name'][:40]:40s} keep {keep}/{len(space)}  solver-first {by_solver:5.2f}x  "
              f"cost-model {by_model:5.2f}x  (best {best:.1f} us: {min(timings, key=timings.get)})")
    if first:
        print(f"geomean regret: solver-first {statistics.geometric_mean(first):.3f}x, "
              f"cost model {statistics.geometric_mean(model):.3f}x over {len(first)} kernels")


if __name__ == "__main__":
    main()
