"""Export failures a user can act on: one line (at most ``MAX_MESSAGE`` characters) that
names the failing frame in the user's or library code, the cause in a few words, and what
to do; torch's full output goes to the debug dir (``--debug-dir``/``AOTPACK_DEBUG=1``).
"""
from __future__ import annotations

import re
import sys
import sysconfig
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

import aotpack
from aotpack.tune import cache

#: Upper bound of an export error line; long torch expressions are shortened to fit.
MAX_MESSAGE = 300
ELLIPSIS = "..."
#: The log file of a failed export, inside ``<debug dir>/<model file stem>/``.
EXPORT_LOG = "export.log"

GENERIC_ADVICE = "make forward() exportable with static shapes (see https://pytorch.org/docs/stable/export.html)"
SHAPE_ADVICE = "export the backbone and heads, run the data-dependent post-processing (NMS) in the application"
BRANCH_ADVICE = "select with torch.where, or decide in the application"
NUMBER_ADVICE = "keep the value a tensor, or compute it in the application"

_INTERNAL_PACKAGES = {"torch", "aotpack", "functorch", "sympy", "optree", "typing_extensions"}
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)')


@dataclass(frozen=True)
class Frame:
    """One source location: ``file`` path, 1-based ``line`` and function ``name``."""

    file: str
    line: int
    name: str


def shorten(text: str, limit: int) -> str:
    """``text`` on one line, cut to at most ``limit`` characters, ending in '...' when cut."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    return text[:max(0, limit - len(ELLIPSIS))].rstrip() + ELLIPSIS


def _stdlib_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    return [Path(paths[key]).resolve() for key in ("stdlib", "platstdlib") if key in paths]


def _search_root(file: Path) -> Path | None:
    """The sys.path entry (site-packages, a project folder) that ``file`` is under, longest first."""
    roots = sorted((Path(p).resolve() for p in sys.path if p), key=lambda p: len(p.parts), reverse=True)
    return next((root for root in roots if root in file.parents), None)


def _is_internal(file: str) -> bool:
    """torch, aotpack, their helpers, the standard library, or generated code ('<string>')."""
    if file.startswith("<"):
        return True
    path = Path(file).resolve()
    if Path(aotpack.__file__).resolve().parent in path.parents:
        return True
    if any(root in path.parents for root in _stdlib_roots()) and "site-packages" not in path.parts:
        return True
    root = _search_root(path)
    return root is not None and path.relative_to(root).parts[0] in _INTERNAL_PACKAGES


def failing_frame(frames: list[Frame]) -> Frame | None:
    """The innermost frame outside torch/aotpack internals and the standard library: the
    line of the user's model or of the library it calls (torchvision, transformers...)."""
    outside = [f for f in frames if not _is_internal(f.file)]
    return outside[-1] if outside else None


def traceback_frames(exc: BaseException) -> list[Frame]:
    """The frames of ``exc``'s traceback, outermost first."""
    return [Frame(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(exc.__traceback__)]


def stack_trace_frames(stack_trace: str | None) -> list[Frame]:
    """The frames of an FX node's ``meta['stack_trace']`` text, outermost first."""
    return [Frame(m["file"], int(m["line"]), m["name"]) for m in _FRAME.finditer(stack_trace or "")]


def describe_frame(frame: Frame | None, model_path: Path) -> str:
    """' (line N in function)' for the model file itself, else ' at file:line in function'
    with the file relative to the model's folder or its sys.path entry; '' for None."""
    if frame is None:
        return ""
    path = Path(frame.file).resolve()
    if path == model_path:
        return f" (line {frame.line} in {frame.name})"
    if model_path.parent in path.parents:
        shown = path.relative_to(model_path.parent)
    else:
        root = _search_root(path)
        shown = path.relative_to(root) if root is not None else path
    return f" at {shown}:{frame.line} in {frame.name}"


def _expression(first_line: str) -> str:
    found = re.search(r"data-dependent expression (.+?)(?: \(unhinted:|$)", first_line)
    return found.group(1).strip() if found else first_line


def classify(exc: BaseException) -> tuple[str, str]:
    """(cause, advice) of a torch.export exception, both short phrases.

    Data-dependent guards are told apart by torch's 'Size-like symbols' note: a size that
    depends on tensor values (e.g. NMS's box count) vs a branch on a tensor value.
    """
    first = _first_line(exc)
    if "data-dependent" not in first:
        return f"{type(exc).__name__}: {first}", GENERIC_ADVICE
    expression = _expression(first)
    if "extract specialized" in first:
        return f"tensor value used as a Python number (data-dependent: {expression})", NUMBER_ADVICE
    size_like = re.search(r"Size-like symbols: ([^)]*)\)", first)
    if size_like and size_like.group(1).strip() not in ("", "none"):
        return f"data-dependent shape (guard {expression})", SHAPE_ADVICE
    return f"data-dependent control flow, a branch on a tensor value (guard {expression})", BRANCH_ADVICE


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def fit(head: str, cause: str, tail: str) -> str:
    """``head + cause + tail`` with ``cause`` shortened so the line stays within
    ``MAX_MESSAGE`` characters where it can (head and tail are kept whole)."""
    room = max(MAX_MESSAGE - len(head) - len(tail), 40)
    return head + shorten(cause, room) + tail


def log_note(log_file: Path | None) -> str:
    """Where torch's full output went, or how to keep it."""
    return f"torch's log: {log_file}" if log_file else "torch's log: --debug-dir DIR"


def export_failure(model_path: Path, exc: BaseException, log_file: Path | None) -> str:
    """The one-line message of a failed ``torch.export`` of ``model_path``."""
    where = describe_frame(failing_frame(traceback_frames(exc)), model_path)
    cause, advice = classify(exc)
    return fit(f"{model_path}: torch.export failed{where}: ", cause, f"; {advice}; {log_note(log_file)}")


def data_dependent_node(ep: torch.export.ExportedProgram):
    """The first node whose result has a data-dependent size or is a tensor value read as
    a number (``.item()``), or None: aotpack compiles static shapes only."""
    for node in ep.graph.nodes:
        if node.op != "call_function":
            continue
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and not all(isinstance(d, int) for d in value.shape):
            return node
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return node
    return None


def data_dependent_output(model_path: Path, node) -> str:
    """The one-line message for :func:`data_dependent_node`'s ``node``."""
    where = describe_frame(failing_frame(stack_trace_frames(node.meta.get("stack_trace"))), model_path)
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        shape = "[" + ", ".join(str(d) for d in value.shape) + "]"
        cause, advice = f"{node.target} returns shape {shape}", SHAPE_ADVICE
    else:
        cause, advice = f"{node.target} reads a tensor value as a Python number", NUMBER_ADVICE
    return fit(f"{model_path}: data-dependent shape from torch.export{where}: ", cause, f"; {advice}")


def write_log(debug_dir: Path, model_path: Path, exc: BaseException, torch_output: str) -> Path:
    """Write torch's full error, traceback and captured output to
    ``<debug_dir>/<model stem>/export.log`` (atomically); returns its path."""
    target = Path(debug_dir) / model_path.stem / EXPORT_LOG
    text = (f"torch.export of {model_path} failed (torch {torch.__version__})\n\n"
            f"== error ==\n{type(exc).__name__}: {exc}\n\n"
            f"== traceback ==\n{''.join(traceback.format_exception(exc))}\n"
            f"== torch's output (log records, stderr, warnings) ==\n{torch_output}")
    cache.write_atomic(target, text)
    return target
