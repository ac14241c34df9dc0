"""What ``aotpack inspect`` derives from an archive: the autotune table of every choice
point (the manifest's ``choices``: kernels' tilings, GEMM/conv steps' implementations), the extern calls that were not fused and the launch sites
(from ``model/kernels.ir``, the graph's steps as text, ``ir.Graph.dump``).
"""
from __future__ import annotations

import re
from collections import Counter

from aotpack.tune.replay import choice_entries

#: Columns of the choice table, in order (the keys of :func:`choice_rows`' rows): every
#: kernel's tiling and every GEMM/conv step's implementation PGO chose.
CHOICE_COLUMNS = ("choice", "kind", "shape", "winner", "candidates", "best_us", "worst_us", "visited", "timing")
_BRANCH = re.compile(r"^(?:(?:then|else)\s+)*")
_HEADER = re.compile(r"(\d+) kernel launches of \d+ distinct kernels")


def step_lines(kernel_ir: str) -> list[str]:
    """The graph's step lines of a ``kernels.ir`` text (up to the first kernel's IR), each
    stripped of its indentation and of the ``then``/``else`` markers of ``torch.cond``
    branches: ``launch NAME``, ``extern OP``, ``copy into BUFFER``, ``cond``."""
    lines = []
    for line in kernel_ir.splitlines()[1:]:  # line 0: the 'graph: ...' header
        if not line.strip():
            break
        lines.append(_BRANCH.sub("", line.strip()))
    return lines


def extern_calls(kernel_ir: str) -> list[dict]:
    """``[{"op": "aten.addmm.default", "count": N}, ...]``: the ops that run as extern ATen
    calls (not fused), with their call sites, most frequent first, then by name."""
    counts = Counter(line.removeprefix("extern ").strip() for line in step_lines(kernel_ir)
                     if line.startswith("extern "))
    return [{"op": op, "count": n} for op, n in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]


def launch_sites(kernel_ir: str) -> int:
    """How many fused-kernel launches the graph holds: the header's count (the build log's
    number), else the ``launch`` step lines (both branches of a cond counted)."""
    header = _HEADER.search(kernel_ir.split("\n", 1)[0])
    if header:
        return int(header.group(1))
    return sum(1 for line in step_lines(kernel_ir) if line.startswith("launch "))


def _timing_state(entry: dict, timed: bool) -> str | None:
    contended = entry.get("timing_contended")
    if not timed or not isinstance(contended, bool):
        return None
    return "contended" if contended else "ok"


def choice_rows(entries: list[dict]) -> list[dict]:
    """One row per choice point (``replay.choice_entries``: the manifest's ``choices``, or an
    older manifest's ``kernels`` and ``gemms``): ``CHOICE_COLUMNS``, times in microseconds
    (None when not timed: one candidate, unvisited, or replayed). ``shape``: a step's shape
    and epilogue (``-`` for a kernel); ``winner``: the winning candidate as a person reads it
    (a kernel's tiling); ``timing``: ``contended`` (other processes took the CPU while it
    was timed), ``ok``, or None (not timed, or an archive that did not record it)."""
    rows = []
    for c in entries:
        timings = [t for t in c.get("timings_us") or [] if isinstance(t, (int, float))]
        names, labels = list(c.get("candidates") or []), list(c.get("labels") or c.get("candidates") or [])
        winner = c.get("winner")
        label = labels[names.index(winner)] if winner in names and len(labels) == len(names) else None
        shape = f"{c['shape']}+{c.get('epilogue', 'none')}" if c.get("shape") else "-"
        rows.append({"choice": c.get("name"), "kind": c.get("kind"), "shape": shape,
                     "winner": label or c.get("winner_label") or winner, "candidates": len(names),
                     "best_us": min(timings) if timings else None, "worst_us": max(timings) if timings else None,
                     "visited": bool(c.get("visited", True)), "timing": _timing_state(c, bool(timings))})
    return rows


def build_report(manifest: dict, kernel_ir: str | None) -> dict:
    """The derived tables of ``inspect --json``'s ``report`` key: ``choices`` (rows, every
    kernel and GEMM/conv step), ``distinct_kernels``, ``launch_sites`` and ``extern_calls``
    (None without a kernels.ir: an archive from an older aotpack)."""
    kernels = manifest.get("kernels")
    kernels = kernels if isinstance(kernels, list) and all(isinstance(k, dict) for k in kernels) else []
    return {"choices": choice_rows(choice_entries(manifest)), "distinct_kernels": len(kernels),
            "launch_sites": launch_sites(kernel_ir) if kernel_ir is not None else None,
            "extern_calls": extern_calls(kernel_ir) if kernel_ir is not None else None}


def _cell(value, column: str) -> str:
    if column in ("best_us", "worst_us"):
        return "-" if value is None else f"{value:.2f}"
    if column == "visited":
        return "yes" if value else "no"
    if column == "timing":
        return "-" if value is None else value
    return "" if value is None else str(value)


def table(rows: list[dict], columns: tuple[str, ...], indent: str = "    ") -> list[str]:
    """Left-aligned text columns (header line first), without trailing spaces."""
    cells = [list(columns)] + [[_cell(row[c], c) for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in cells]


def _count(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else plural or word + 's'}"


def kernel_summary(report: dict) -> str:
    """'N fused kernel launches of M distinct kernels' (launch sites vs distinct kernels)."""
    sites = report["launch_sites"]
    distinct = _count(report["distinct_kernels"], "distinct kernel")
    if sites is None:
        return f"{distinct} (launch sites unknown: the archive has no kernels.ir)"
    return f"{_count(sites, 'fused kernel launch', 'fused kernel launches')} of {distinct}"


def text_lines(report: dict) -> list[str]:
    """The human-readable report: summary, choice table, extern calls."""
    rows = report["choices"]
    lines = [f"  {kernel_summary(report)}"]
    if rows:
        lines.append(f"  {_count(len(rows), 'choice point')} (candidates timed by PGO):")
        lines += table(rows, CHOICE_COLUMNS)
        contended = [row["choice"] for row in rows if row["timing"] == "contended"]
        if contended:
            lines.append(f"  timing contended for {_count(len(contended), 'choice point')} (other processes took "
                         "the CPU while they were timed; the choice may differ on an idle machine: rebuild with "
                         "--retune)")
    externs = report["extern_calls"]
    if externs:
        total = sum(e["count"] for e in externs)
        lines.append(f"  {_count(total, 'extern call')} of {_count(len(externs), 'ATen op')} (not fused):")
        lines += table(externs, ("op", "count"))
    elif externs is not None:
        lines.append("  no extern calls: every op is fused")
    return lines
