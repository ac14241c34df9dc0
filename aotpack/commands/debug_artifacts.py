"""``--debug-dir``: everything needed to look at, rebuild and re-time each kernel by hand.

Per build ``<debug dir>/<name>/``: the model source, ``kernels.ir``, and per kernel
``kernels/<kernel>/``: every candidate's kernel source, the wrapper source, ``compile.sh``
(the exact compile commands, runnable), ``inputs.pt`` (the tensors the kernel received
during the Python-mode run: inputs, then outputs) and ``benchmark.py`` (loads the
compiled candidates from the build cache, times them and picks the winner as autotuning
did: ``aotpack.tune.timing``).
"""
from __future__ import annotations

import shlex
from pathlib import Path

from aotpack.archive import layout
from aotpack.tune import cache

_BENCHMARK = '''"""Re-time the candidates of {name} on the tensors it received during the build.

Run from anywhere: python benchmark.py (needs the aotpack that built it and the build cache).
"""
from pathlib import Path

import torch

from aotpack import backends
from aotpack.tune import timing
from aotpack.tune.autotune import time_candidates

HERE = Path(__file__).resolve().parent
CACHE_FOLDER = Path({folder!r})
CANDIDATES = {candidates!r}  # (kernel_key, tiling_repr, block_dim)

backend = backends.get({backend!r})
launcher = backend.load_wrapper(CACHE_FOLDER / {wrapper!r}, CACHE_FOLDER, {name!r})
tensors = torch.load(HERE / "inputs.pt")
measured = time_candidates(launcher, [key for key, _, _ in CANDIDATES], launcher.arguments(tensors),
                           [block_dim for _, _, block_dim in CANDIDATES], backend.device())
decision = timing.decide([measured], [block_dim for _, _, block_dim in CANDIDATES])
for index, ((key, tiling_repr, _), us, clean) in enumerate(zip(CANDIDATES, decision.estimates_us,
                                                                measured.clean_shares)):
    print(f"{name} candidate {{index}} ({{tiling_repr}}): Timing {{us:.2f}} us ({{clean:.0%}} of samples clean)")
if decision.contended:
    print("timing contended: other processes took the CPU; re-run on an idle machine")
print(f"best kernel index: {{decision.index}}")
'''


def write(debug_dir: Path, name: str, graph, compiled: dict, toolchain, backend_name: str,
          captured: dict, model_source: str) -> Path:
    """Write the debug folder of one build; returns it."""
    root = Path(debug_dir) / name
    for kid, c in compiled.items():
        cs = c.candidate_set
        folder = root / "kernels" / cs.kernel.name
        commands = ["#!/bin/sh", "# the exact compile commands of this kernel's candidates and wrapper", "set -e",
                    'cd "$(dirname "$0")"']
        for index, (candidate, source) in enumerate(zip(cs.candidates, cs.sources)):
            rel = Path(layout.STATIC_KERNEL_DIR) / candidate.kernel_key
            cache.write_atomic(folder / rel / layout.LIB_KERNEL_SOURCE_NAME, source)
            commands.append(shlex.join(toolchain.command(rel / layout.LIB_KERNEL_SOURCE_NAME, rel / layout.LIB_KERNEL_NAME,
                                                         "kernel", source)))
        cache.write_atomic(folder / layout.WRAPPER_SOURCE_NAME, cs.wrapper_source)
        commands.append(shlex.join(toolchain.command(Path(layout.WRAPPER_SOURCE_NAME), Path(layout.WRAPPER_NAME),
                                                     "wrapper")))
        cache.write_atomic(folder / "compile.sh", "\n".join(commands) + "\n")
        (folder / "compile.sh").chmod(0o755)
        if kid in captured:
            import torch

            torch.save(captured[kid], folder / "inputs.pt")
            cache.write_atomic(folder / "benchmark.py", _BENCHMARK.format(
                name=cs.kernel.name, folder=str(c.folder.path), backend=backend_name, wrapper=layout.WRAPPER_NAME,
                candidates=[(cand.kernel_key, cand.tiling_repr, cand.block_dim) for cand in cs.candidates]))
    cache.write_atomic(root / Path(layout.MODEL_SOURCE_PATH).name, model_source)
    cache.write_atomic(root / "kernels.ir", graph.dump())
    return root
