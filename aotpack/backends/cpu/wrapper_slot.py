"""Per-kernel wrappers without a compile per kernel.

A wrapper (``templates/cpu_wrapper.cpp.j2``) is the same code for every kernel; only its
``kernel_key -> TilingInfo`` map differs, and that map is data: one text line per candidate,
``kernel_key|tiling_repr|workspace|block_dim``, in a char array of ``MAP_BYTES`` bytes that
the wrapper parses when it is loaded. So the toolchain compiles the wrapper once per
toolchain with ``MARKER`` as its map (the *slot* binary) and makes each kernel's wrapper.so
by writing that kernel's map over the marker (``patched``). The archive still ships each
wrapper's full source (``render``): compiled, it gives a wrapper with the same code and map.

A wrapper compile took ~44 ms (-O0, C headers only); MobileNetV3-Small has 58 of them
(2.5 s of compile time, ~1.2 s of a cold build on 2 cores); patched, all 58 took 0.08 s,
the slot's one compile included.
"""
from __future__ import annotations

import functools

from aotpack.errors import AotpackError
from aotpack.backends.cpu.templating import render as render_template

#: Size of the slot's map array (bytes, the terminating NUL included): 10 candidates take ~1.6 KB.
MAP_BYTES = 4096
#: Most candidates the slot's map holds (``config.MAX_TOPN`` is 10; larger maps are compiled).
MAX_CANDIDATES = 16
#: The slot binary's map: found exactly once in it and overwritten per kernel.
MARKER = "AOTPACK-TILING-MAP-SLOT-2c1f9b7e"
#: What a map line may hold (no C escapes, no field or line separators).
_FORBIDDEN = set('|"\\\n\r\0')


def map_text(candidates: list) -> str:
    """The map of ``candidates`` as the wrapper parses it (one ``\\n``-ended line each).

    Raises:
        AotpackError: a kernel_key or tiling_repr holds a separator or C escape (an
            aotpack bug: tilings are generated text).
    """
    lines = []
    for c in candidates:
        if _FORBIDDEN & set(c.kernel_key + c.tiling_repr):
            raise AotpackError(f"internal error: tiling {c.tiling_repr!r} cannot go into a wrapper's map")
        lines.append(f"{c.kernel_key}|{c.tiling_repr}|{int(c.workspace)}|{int(c.block_dim)}\n")
    return "".join(lines)


def render(candidates: list) -> str:
    """The wrapper source of ``candidates`` (its map inline). A map over ``MAP_BYTES`` or
    ``MAX_CANDIDATES`` (a test rendering a template's whole space) gets arrays of its own
    size: that source is compiled, not patched."""
    text = map_text(candidates)
    size = len(text.encode()) + 1
    return _render(text.replace("\n", "\\n"), max(MAP_BYTES, -(-size // MAP_BYTES) * MAP_BYTES),
                   max(MAX_CANDIDATES, len(candidates)))


@functools.lru_cache(maxsize=1)
def slot_source() -> str:
    """The wrapper source whose binary every kernel's wrapper is patched from (rendered once)."""
    return _render(MARKER, MAP_BYTES, MAX_CANDIDATES)


def _render(escaped_map: str, map_bytes: int, max_candidates: int) -> str:
    return render_template("cpu_wrapper.cpp.j2", map_text=escaped_map, map_bytes=map_bytes,
                           max_candidates=max_candidates)


def patched(slot_binary: bytes, source: str, slot: str) -> bytes | None:
    """The wrapper binary of ``source``: ``slot_binary`` (compiled from ``slot``) with the map
    of ``source`` over the marker; None when ``source`` is not ``slot`` with another map (a
    wrapper of another template version), or the binary does not hold the marker exactly
    once followed by zeros (then compile ``source`` instead)."""
    head, marker, tail = slot.partition(MARKER)
    if not marker or not (source.startswith(head) and source.endswith(tail)):
        return None
    escaped = source[len(head):len(source) - len(tail)]
    text = escaped.replace("\\n", "\n").encode()
    if "\\" in escaped.replace("\\n", "") or '"' in escaped or len(text) >= MAP_BYTES:
        return None
    at = slot_binary.find(MARKER.encode())
    if at < 0 or slot_binary.find(MARKER.encode(), at + 1) >= 0:
        return None
    if slot_binary[at + len(MARKER):at + MAP_BYTES].strip(b"\0"):
        return None
    return slot_binary[:at] + text.ljust(MAP_BYTES, b"\0") + slot_binary[at + MAP_BYTES:]
