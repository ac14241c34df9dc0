"""``--tuning-from OLD.aotpack``: reuse the winners an earlier build recorded, without profiling.

An archive's manifest records, per distinct kernel, its ``kernel_id`` and the winning
``kernel_key`` (``tiling_repr|workspace|block_dim``). A new build of the same model
finds the same kernels by ``kernel_id`` and takes the recorded candidate as its only
one, so nothing is timed and the shipped kernels are the same. Kernels the old archive
does not know (the model changed) are tuned as usual.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from aotpack.errors import AotpackError

log = logging.getLogger("aotpack")


@dataclass(frozen=True)
class RecordedWinner:
    """One kernel's winner in an old archive: its kernel_key and its recorded timings (us)."""

    kernel_key: str
    tiling_repr: str
    timings_us: tuple


def recorded_winners(archive: Path) -> dict[str, RecordedWinner]:
    """``kernel_id -> RecordedWinner`` of every kernel the archive's manifest records, and
    ``gemm:<name> -> RecordedWinner`` (``kernel_key`` = the implementation's name) of every
    GEMM/conv step.

    Raises:
        AotpackError: the archive is unreadable, or predates ``kernel_id`` in manifests.
    """
    from aotpack.archive.writer import read_manifest

    manifest = read_manifest(Path(archive))
    winners = {}
    for entry in manifest.get("kernels", []):
        if "kernel_id" not in entry:
            raise AotpackError(f"{archive}: its manifest records no kernel_id (built by an older aotpack); "
                               "rebuild it once without --tuning-from")
        winners[entry["kernel_id"]] = RecordedWinner(entry["kernel_key"], entry["tiling_repr"],
                                                     tuple(entry.get("timings_us", ())))
    for entry in manifest.get("gemms", []):  # GEMM steps: the winning implementation by name
        winners[f"gemm:{entry['name']}"] = RecordedWinner(entry["winner"], entry["winner"],
                                                          tuple(entry.get("timings_us", ())))
    return winners


def pick(candidates: list, recorded: RecordedWinner | None):
    """The candidate with the recorded ``kernel_key``, or None (not recorded, or not offered now)."""
    if recorded is None:
        return None
    return next((c for c in candidates if c.kernel_key == recorded.kernel_key), None)
