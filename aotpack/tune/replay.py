"""``--tuning-from OLD.aotpack``: reuse the winners an earlier build recorded, without profiling.

An archive's manifest records, per choice point (``ir.choice``: a distinct kernel, a
GEMM/conv step), its ``id`` and the winning candidate's name (a kernel's ``kernel_key``
``tiling_repr|workspace|block_dim``, a step's implementation). A new build of the same
model finds the same choice points by id and takes the recorded candidate as its only
one (a kernel) or as its winner (a step), so nothing is timed and the shipped kernels
are the same. Choice points the old archive does not know (the model changed) are tuned
as usual.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from aotpack.errors import AotpackError

log = logging.getLogger("aotpack")


@dataclass(frozen=True)
class RecordedWinner:
    """One choice point's winner in an old archive or the tuning records: the winning
    candidate's name, the recorded timings (us per candidate; empty when not timed) and
    whether that timing was contended (``tune.timing``; tuning records only)."""

    candidate: str
    timings_us: tuple
    contended: bool = False


def choice_entries(manifest: dict) -> list[dict]:
    """The manifest's ``choices`` (see docs/archive.md), or for a manifest of an older
    aotpack the same entries made from its ``kernels`` and ``gemms``. Entries that are not
    objects are left out.

    Returns:
        ``[{"id", "kind", "name", "candidates", "winner", "timings_us", "visited",
        "timing_contended", ...}]``; a kernel of an old manifest has ``candidates`` =
        its ``candidate_tilings`` (the names it did not record) and no ``id`` when it
        predates ``kernel_id``.
    """
    if isinstance(manifest.get("choices"), list):
        return [c for c in manifest["choices"] if isinstance(c, dict)]
    entries = []
    for k in manifest.get("kernels") or []:
        if isinstance(k, dict):
            entries.append({"id": k.get("kernel_id"), "kind": "kernel", "name": k.get("name"),
                            "candidates": k.get("candidate_tilings") or [], "winner": k.get("kernel_key"),
                            "winner_label": k.get("tiling_repr"),
                            "timings_us": k.get("timings_us") or [], "visited": k.get("visited", True),
                            "timing_contended": k.get("timing_contended")})
    for g in manifest.get("gemms") or []:
        if isinstance(g, dict):
            entries.append({"id": f"gemm:{g.get('name')}", **g})
    return entries


def recorded_winners(archive: Path) -> dict[str, RecordedWinner]:
    """``choice id -> RecordedWinner`` of every choice point the archive's manifest records.

    Raises:
        AotpackError: the archive is unreadable, or predates ``kernel_id`` in manifests.
    """
    from aotpack.archive.writer import read_manifest

    winners = {}
    for entry in choice_entries(read_manifest(Path(archive))):
        if not entry.get("id"):
            raise AotpackError(f"{archive}: its manifest records no kernel_id (built by an older aotpack); "
                               "rebuild it once without --tuning-from")
        winners[entry["id"]] = RecordedWinner(str(entry.get("winner")), tuple(entry.get("timings_us") or ()))
    return winners


def pick(names: list[str], recorded: RecordedWinner | None) -> int | None:
    """The index of the recorded winner among the candidates called ``names``, or None
    (not recorded, or not offered now)."""
    if recorded is None or recorded.candidate not in names:
        return None
    return names.index(recorded.candidate)
