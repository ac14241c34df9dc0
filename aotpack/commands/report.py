"""What ``aotpack inspect`` derives from an archive: the per-kernel autotune table (from
the manifest's ``kernels``), the extern calls that were not fused and the launch sites
(from ``model/kernels.ir``, the graph's steps as text, ``ir.Graph.dump``).
"""
from __future__ import annotations

import re
from collections import Counter

#: Columns of the kernel table, in order (the keys of :func:`kernel_rows`' rows).
KERNEL_COLUMNS = ("kernel", "kernel_id", "block_dim", "tiling_repr", "candidates", "best_us", "worst_us",
                  "visited", "timing")
#: Columns of the GEMM/conv table (the manifest's ``gemms``): implementations and their times.
GEMM_COLUMNS = ("gemm", "kind", "shape", "epilogue", "winner", "candidates", "visited")
KERNEL_ID_CHARS = 12
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


def kernel_rows(kernels: list[dict]) -> list[dict]:
    """One row per distinct kernel of the manifest's ``kernels``: ``KERNEL_COLUMNS``, times
    in microseconds (None when the kernel was not timed: one candidate, or unvisited).
    ``timing``: ``contended`` (other processes took the CPU while it was timed: the
    manifest's ``timing_contended``), ``ok``, or None (not timed, or an archive from an
    aotpack that did not record it)."""
    rows = []
    for k in kernels:
        timings = [t for t in k.get("timings_us") or [] if isinstance(t, (int, float))]
        rows.append({"kernel": k.get("name"), "kernel_id": str(k.get("kernel_id", ""))[:KERNEL_ID_CHARS],
                     "block_dim": k.get("block_dim"), "tiling_repr": k.get("tiling_repr"),
                     "candidates": k.get("candidates"), "best_us": min(timings) if timings else None,
                     "worst_us": max(timings) if timings else None, "visited": bool(k.get("visited", True)),
                     "timing": _timing_state(k, bool(timings))})
    return rows


def _timing_state(kernel: dict, timed: bool) -> str | None:
    contended = kernel.get("timing_contended")
    if not timed or not isinstance(contended, bool):
        return None
    return "contended" if contended else "ok"


def gemm_rows(gemms: list[dict]) -> list[dict]:
    """One row per GEMM/conv step of the manifest's ``gemms``: ``GEMM_COLUMNS``, with
    ``candidates`` as ``name=us`` per implementation (``name`` alone when not timed)."""
    rows = []
    for g in gemms:
        names = [str(n) for n in g.get("candidates") or []]
        timings = list(g.get("timings_us") or [])
        cells = [f"{n}={t:.1f}us" if i < len(timings) and isinstance(t := timings[i], (int, float)) else n
                 for i, n in enumerate(names)]
        rows.append({"gemm": g.get("name"), "kind": g.get("kind"), "shape": g.get("shape"),
                     "epilogue": g.get("epilogue"), "winner": g.get("winner"), "candidates": " ".join(cells),
                     "visited": bool(g.get("visited", True))})
    return rows


def build_report(manifest: dict, kernel_ir: str | None) -> dict:
    """The derived tables of ``inspect --json``'s ``report`` key: ``kernels`` (rows),
    ``distinct_kernels``, ``launch_sites`` and ``extern_calls`` (None without a kernels.ir:
    an archive from an older aotpack)."""
    kernels = manifest.get("kernels")
    kernels = kernels if isinstance(kernels, list) and all(isinstance(k, dict) for k in kernels) else []
    gemms = manifest.get("gemms")
    gemms = gemms if isinstance(gemms, list) and all(isinstance(g, dict) for g in gemms) else []
    return {"kernels": kernel_rows(kernels), "distinct_kernels": len(kernels), "gemms": gemm_rows(gemms),
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
    """The human-readable report: summary, kernel table, extern calls."""
    lines = [f"  {kernel_summary(report)}:" if report["kernels"] else f"  {kernel_summary(report)}"]
    if report["kernels"]:
        lines += table(report["kernels"], KERNEL_COLUMNS)
        contended = [row["kernel"] for row in report["kernels"] if row["timing"] == "contended"]
        if contended:
            lines.append(f"  timing contended for {_count(len(contended), 'kernel')} (other processes took the "
                         "CPU while they were timed; the choice may differ on an idle machine: rebuild with "
                         "--retune)")
    if report.get("gemms"):
        lines.append(f"  {_count(len(report['gemms']), 'GEMM/conv step')} (implementations timed by PGO):")
        lines += table(report["gemms"], GEMM_COLUMNS)
    externs = report["extern_calls"]
    if externs:
        total = sum(e["count"] for e in externs)
        lines.append(f"  {_count(total, 'extern call')} of {_count(len(externs), 'ATen op')} (not fused):")
        lines += table(externs, ("op", "count"))
    elif externs is not None:
        lines.append("  no extern calls: every op is fused")
    return lines
