"""Recorded GEMM-step choices in the build cache, so a rebuild times nothing.

One JSON file per step signature under ``<cache>/<backend>/gemm/``: the implementations
offered, the winner and the timings (us). The key covers what the timings depend on:
each variant's calls (ops, argument kinds, shapes and strides, epilogue kernel ids), the
version of each kernel a variant launches (``kernel_versions``: a digest of its candidates'
sources and the toolchain, so a changed template or solver is timed again), the torch
version and the device state the backend names (``Device.tuning_key``: on the CPU, the
device limit and ATen's thread count). ``--retune`` ignores them.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from aotpack import leftovers
from aotpack.tune.cache import digest, write_atomic
from aotpack.ir.gemm import gemm_steps
from aotpack.ir.graph import ExternCall, KernelCall
from aotpack.tune.replay import RecordedWinner


def _arg_text(arg) -> str:
    if arg.kind == "tensor":
        base, sizes, strides, offset = arg.value
        return f"tensor:{base.kind}:{list(sizes)}:{list(strides)}:{offset}"
    return f"{arg.kind}:{arg.value!r}"


def signature(step, kernel_versions: dict | None = None) -> str:
    """Text of what a step's variants run (no buffer names): equal text, equal timings.
    ``kernel_versions``: kernel_id -> a digest of what compiles it (``kernel_versions``)."""
    lines = [f"{step.kind} {step.shape} {step.epilogue}"]
    for variant in step.variants:
        lines.append(f"variant {variant.name}")
        for s in variant.steps:
            if isinstance(s, ExternCall):
                lines.append(f"  {s.op} " + " ".join(_arg_text(a) for a in s.args))
            elif isinstance(s, KernelCall):
                lines.append(f"  kernel {s.kernel.kernel_id} {(kernel_versions or {}).get(s.kernel.kernel_id, '')}")
    return "\n".join(lines)


def kernel_versions(sets: dict, toolchain_fingerprint: str) -> dict[str, str]:
    """kernel_id -> digest of its candidates' sources and the toolchain fingerprint, for
    ``read_all`` / ``write_all`` (``sets``: kernel_id -> ``CandidateSet``)."""
    return {kid: digest(toolchain_fingerprint, *cs.sources) for kid, cs in sets.items()}


def _path(root: Path, step, device_key: tuple, versions: dict | None) -> Path:
    key = digest(signature(step, versions), torch.__version__, *device_key)
    return root / f"{step.name[:40]}-{key}.json"


def read_all(root: Path, graph, device_key: tuple, versions: dict | None = None) -> dict:
    """``step.key -> RecordedWinner`` for every step of ``graph`` with a readable record
    (a damaged or foreign record is ignored: the step is timed again). ``device_key``: the
    backend's ``Device.tuning_key(device_limit)`` (strings)."""
    found = {}
    for step in gemm_steps(graph):
        try:
            record = json.loads(_path(root, step, device_key, versions).read_text())
        except (OSError, ValueError):
            continue
        names = [v.name for v in step.variants]
        if not isinstance(record, dict) or record.get("candidates") != names or record.get("winner") not in names:
            continue
        found[step.key] = RecordedWinner(record["winner"], record["winner"], tuple(record.get("timings_us", ())))
    return found


def write_all(root: Path, graph, choices: dict, device_key: tuple, versions: dict | None = None) -> None:
    """Record every timed step's winner and timings (atomic writes); removes the temp files
    of killed builds from ``root``."""
    leftovers.remove_dead(root)
    for step in gemm_steps(graph):
        choice = choices.get(step.key)
        if choice is None or choice.cached or not choice.timings_us:
            continue
        names = [v.name for v in step.variants]
        root.mkdir(parents=True, exist_ok=True)
        write_atomic(_path(root, step, device_key, versions),
                     json.dumps({"candidates": names, "winner": names[choice.index],
                                 "timings_us": [round(t, 3) for t in choice.timings_us]}))
