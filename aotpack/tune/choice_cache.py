"""Tuning records of every choice point in the build cache, so a rebuild times nothing.

One JSON file per choice point (``ir.choice``: a fused kernel's tiling, a GEMM/conv/bmm/attention
step's implementation) under ``<cache>/<backend>/choices/``, named ``<label>-<key>.json``::

    {"id": choice id, "candidates": [names...], "winner": name,
     "timings_us": [us per candidate], "contended": bool}

the same winner-by-name record ``--tuning-from`` reads from an archive (``replay.RecordedWinner``).
The key covers what the timings depend on: the point's ``signature`` (a kernel's id and
candidates; a step's calls: ops, argument kinds, shapes and strides, epilogue kernel ids),
the version of each kernel involved (``kernel_versions``: a digest of its candidates' sources
and the toolchain, so a changed template or solver is timed again), the torch version and
the device state the backend names (``Device.tuning_key``, taken inside
``Device.extern_parallelism``: on the CPU, the device limit and ATen's thread count).
A record that is unreadable, or whose candidates or winner are not the point's, is ignored:
the point is timed again. ``--retune`` reads none. Records are written atomically (temp file
+ rename), by a build holding its kernels' ``compile.lock``s; binaries are not here but
content-addressed in ``tune.cache``.
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
    record for its candidates (a damaged or foreign record is ignored: the point is timed again).

    Args:
        root: the records' folder (``<cache>/<backend>/choices``).
        points: ``ir.choice.ChoicePoint``s (kernels' ``CandidateSet``s, ``GemmStep``s).
        device_key: ``Device.tuning_key(device_limit)``.
        versions: ``kernel_versions`` of the build's kernels.
    """
    found = {}
    for point in points:
        try:
            record = json.loads(_path(root, point, device_key, versions).read_text())
        except (OSError, ValueError):
            continue
        names = point.candidate_names()
        if not isinstance(record, dict) or record.get("candidates") != names or record.get("winner") not in names:
            continue
        timings = record.get("timings_us")
        found[point.choice_id] = RecordedWinner(record["winner"], tuple(timings) if isinstance(timings, list) else (),
                                                record.get("contended") is True)
    return found


def write_all(root: Path, points: list, choices: dict, device_key: tuple, versions: dict | None = None) -> None:
    """Record every timed point's winner, timings and whether its timing was contended
    (``choices``: choice id -> ``autotune.Choice``; points taken from the records, untimed or
    unreached are not written); removes the temp files of killed builds from ``root``.
    Arguments as ``read_all``'s."""
    leftovers.remove_dead(root)
    for point in points:
        choice = choices.get(point.choice_id)
        if choice is None or choice.cached or not choice.timings_us:
            continue
        names = point.candidate_names()
        write_atomic(_path(root, point, device_key, versions),
                     json.dumps({"id": point.choice_id, "candidates": names, "winner": names[choice.index],
                                 "timings_us": [round(t, 3) for t in choice.timings_us],
                                 "contended": bool(choice.contended)}))
