"""Tuning records of GEMM-step choice points in the build cache, so a rebuild times nothing.

One JSON file per choice point under ``<cache>/<backend>/choices/``: the candidates offered
(by name), the winner's name and the timings (us), the same record ``--tuning-from`` reads
from an archive (``replay.RecordedWinner``). The key covers what the timings depend on:
the point's ``signature`` (a step's calls: ops, argument kinds, shapes and strides,
epilogue kernel ids; and the version of each kernel it launches, ``kernel_versions``: a
digest of its candidates' sources and the toolchain, so a changed template or solver is
timed again), the torch version and the device state the backend names (``Device.tuning_key``:
on the CPU, the device limit and ATen's thread count). ``--retune``
ignores them. A kernel's own tiling choice is recorded beside its binaries
(``cache.KernelFolder``), under the same kernel folder lock.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from aotpack import leftovers
from aotpack.tune.cache import digest, write_atomic
from aotpack.tune.replay import RecordedWinner


def kernel_versions(sets: dict, toolchain_fingerprint: str) -> dict[str, str]:
    """kernel_id -> digest of its candidates' sources and the toolchain fingerprint, for
    ``read_all`` / ``write_all`` (``sets``: kernel_id -> ``CandidateSet``)."""
    return {kid: digest(toolchain_fingerprint, *cs.sources) for kid, cs in sets.items()}


def _path(root: Path, point, device_key: tuple, versions: dict | None) -> Path:
    key = digest(point.signature(versions), torch.__version__, *device_key)
    return root / f"{point.label[:40]}-{key}.json"


def read_all(root: Path, points: list, device_key: tuple, versions: dict | None = None) -> dict:
    """``choice id -> RecordedWinner`` for every choice point in ``points`` with a readable
    record (a damaged or foreign record is ignored: the point is timed again)."""
    found = {}
    for point in points:
        try:
            record = json.loads(_path(root, point, device_key, versions).read_text())
        except (OSError, ValueError):
            continue
        names = point.candidate_names()
        if not isinstance(record, dict) or record.get("candidates") != names or record.get("winner") not in names:
            continue
        found[point.choice_id] = RecordedWinner(record["winner"], tuple(record.get("timings_us", ())))
    return found


def write_all(root: Path, points: list, choices: dict, device_key: tuple, versions: dict | None = None) -> None:
    """Record every timed point's winner and timings (``choices``: choice id -> ``autotune.Choice``;
    atomic writes); removes the temp files of killed builds from ``root``."""
    leftovers.remove_dead(root)
    for point in points:
        choice = choices.get(point.choice_id)
        if choice is None or choice.cached or not choice.timings_us:
            continue
        names = point.candidate_names()
        root.mkdir(parents=True, exist_ok=True)
        write_atomic(_path(root, point, device_key, versions),
                     json.dumps({"id": point.choice_id, "candidates": names, "winner": names[choice.index],
                                 "timings_us": [round(t, 3) for t in choice.timings_us]}))
