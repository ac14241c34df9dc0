"""The kernel launch ABI, defined once: versions, codes, structs and entry points.

Three copies are generated from the definitions below:

* ``header()``: ``native/include/aotpack/kernel_abi.h``, the documented C header (model.cpp
  includes it; checked in, ``tests/unit/test_kernel_abi.py`` fails while it differs). After a change::

      python -m aotpack.backends.host.kernel_abi --header > native/include/aotpack/kernel_abi.h

* ``declarations()``: the same declarations without comments, which generated kernels and
  wrappers inline (they compile without ``-I``); the templates print it as ``kernel_abi``.
* ``ctypes_fields()``: the ``_fields_`` of the ctypes mirrors in ``launch_abi``.
"""
from __future__ import annotations

import argparse
import ctypes
import sys
from dataclasses import dataclass

#: Kernel ABI MAJOR: bumped on an incompatible change (a field moved, removed or re-typed, an
#: entry point's signature or meaning changed); a reader refuses another MAJOR.
VERSION_MAJOR = 1
#: Kernel ABI MINOR: bumped on a compatible addition (an appended field, a new code).
VERSION_MINOR = 0
#: Alignment in bytes the caller gives a workspace.
WORKSPACE_ALIGNMENT = 64


@dataclass(frozen=True)
class Member:
    """One C declaration: a struct field (``c_type name``) or an enum member (``name = value``),
    with its doc comment (one string per comment line)."""

    name: str
    c_type: str | int  # the C type of a field; the value of an enum member
    doc: tuple[str, ...]


@dataclass(frozen=True)
class Declaration:
    """An enum (members are values) or a typedef'd struct (members are fields)."""

    kind: str  # "enum" or "struct"
    name: str
    doc: tuple[str, ...]
    members: tuple[Member, ...]


@dataclass(frozen=True)
class EntryPoint:
    """A function a kernel.so or wrapper.so exports, and the typedef of its pointer.

    params: ``"type name"`` strings. exported_by: ``"kernel"``, ``"wrapper"`` or both.
    """

    symbol: str
    typedef: str
    returns: str
    params: tuple[str, ...]
    exported_by: tuple[str, ...]
    doc: tuple[str, ...]


DEVICE_TYPE = Declaration("enum", "AotpackDeviceType", (
    "Device the launch targets: DLPack DLDeviceType codes (same numbers).",), (
    Member("AOTPACK_DEVICE_CPU", 1, ("kDLCPU: host memory, stream NULL",)),
    Member("AOTPACK_DEVICE_CUDA", 2, ("kDLCUDA",)),
    Member("AOTPACK_DEVICE_ROCM", 10, ("kDLROCM",)),
    Member("AOTPACK_DEVICE_EXT_DEV", 12, ("kDLExtDev: vendor accelerators (e.g. an NPU)",)),
))

KERNEL_STATUS = Declaration("enum", "AotpackKernelStatus", (
    "Status of aotpack_kernel_launch(): 0 = ok, anything else = nothing was computed.",), (
    Member("AOTPACK_KERNEL_OK", 0, ("the kernel ran",)),
    Member("AOTPACK_KERNEL_ERR_STRUCT_SIZE", 1, ("launch is NULL or struct_size too small",)),
    Member("AOTPACK_KERNEL_ERR_DEVICE", 2, ("device_type/device_id not served here",)),
    Member("AOTPACK_KERNEL_ERR_WORKSPACE", 3, ("workspace NULL or below the declared bytes",)),
    Member("AOTPACK_KERNEL_ERR_THREADS", 4, ("max_threads < 0",)),
    Member("AOTPACK_KERNEL_ERR_ARGS", 5, ("args is NULL",)),
))

KERNEL_LAUNCH = Declaration("struct", "AotpackKernelLaunch", (
    "One launch of a kernel (ABI 1.0 layout: sizeof 48 on LP64, natural alignment).",), (
    Member("struct_size", "uint32_t", (
        "sizeof(AotpackKernelLaunch) as the caller compiled it; fields past it are",
        "absent (treated as their default). Must be >= AOTPACK_KERNEL_LAUNCH_V1_SIZE.")),
    Member("device_type", "int32_t", (
        "An AotpackDeviceType (DLPack code); CPU kernels accept only AOTPACK_DEVICE_CPU.",)),
    Member("device_id", "int32_t", ("Device ordinal (DLPack device_id); 0 on CPU.",)),
    Member("stream", "void*", (
        "Queue the kernel is enqueued on (cudaStream_t, aclrtStream, ...); NULL on CPU,",
        "where the launch is synchronous.")),
    Member("workspace", "void*", (
        "Scratch memory of at least the TilingInfo's workspace_bytes, aligned to",
        "AOTPACK_WORKSPACE_ALIGNMENT, owned by the caller; may be NULL when that is 0. Its",
        "contents on entry are unspecified and it is not preserved between launches.")),
    Member("workspace_bytes", "uint64_t", ("Size of `workspace` in bytes.",)),
    Member("max_threads", "int32_t", (
        "Cap on the threads (CPU) or cores the kernel may use: 0 = the tiling's own",
        "block_dim, n > 0 = min(n, block_dim). The runtime passes its device limit here; a",
        "wrapper lowers it to the launched candidate's block_dim (candidates that differ only",
        "in block_dim share one binary, rendered for the most threads).")),
))

TILING_INFO = Declaration("struct", "AotpackTilingInfo", (
    "What a wrapper.so knows about one kernel_key (the solver's triple).",), (
    Member("struct_size", "uint32_t", (
        "Set by the caller: sizeof(AotpackTilingInfo) as it compiled it; the wrapper",
        "fills only the fields this covers.")),
    Member("block_dim", "int32_t", ("Threads/cores the tiling was generated for (its parallel width).",)),
    Member("workspace_bytes", "uint64_t", ("Scratch bytes each launch needs (0 = none); the caller allocates them.",)),
    Member("tiling_repr", "const char*", ("The tiling's canonical text, NUL-terminated; static storage of wrapper.so.",)),
))

#: Every enum and struct, in header order.
DECLARATIONS = (DEVICE_TYPE, KERNEL_STATUS, KERNEL_LAUNCH, TILING_INFO)

#: Every entry point, in header order (a symbol both export has one typedef).
ENTRY_POINTS = (
    EntryPoint("aotpack_kernel_abi_version", "aotpack_kernel_abi_version_fn", "int32_t", ("void",),
               ("kernel", "wrapper"), ("AOTPACK_KERNEL_ABI_VERSION the kernel was generated for.",)),
    EntryPoint("aotpack_kernel_launch", "aotpack_kernel_launch_fn", "int32_t",
               ("const AotpackKernelLaunch* launch", "void* const* args"), ("kernel",), (
                   "Runs the kernel once, synchronously on CPU. args: data pointers of the inputs, then",
                   "the outputs, in the kernel's argument order, laid out exactly as generated.",
                   "Returns an AotpackKernelStatus.")),
    EntryPoint("aotpack_init", "aotpack_wrapper_init_fn", "int32_t", ("const char* kernel_dir",), ("wrapper",), (
        "dlopen static_kernel/<kernel_key>/kernel.so under kernel_dir for each kernel_key",
        "present; refuses one of another kernel ABI MAJOR. Returns the count loaded (>= 1).")),
    EntryPoint("aotpack_tiling_info", "aotpack_tiling_info_fn", "int32_t",
               ("const char* kernel_key", "AotpackTilingInfo* info"), ("wrapper",), (
                   "The TilingInfo of kernel_key (loaded or not); the caller sets info->struct_size.",)),
    EntryPoint("aotpack_launch", "aotpack_wrapper_launch_fn", "int32_t",
               ("const char* kernel_key", "const AotpackKernelLaunch* launch", "void* const* args"), ("wrapper",), (
                   "Checks the launch against the TilingInfo (workspace_bytes, struct_size) and runs it.",)),
    EntryPoint("aotpack_release", "aotpack_wrapper_release_fn", "int32_t", ("const char* keep_kernel_key",),
               ("wrapper",), ("Unloads every kernel.so but keep_kernel_key.",)),
    EntryPoint("aotpack_last_error", "aotpack_wrapper_last_error_fn", "const char*", ("void",), ("wrapper",), ()),
)

#: C type of a struct field -> its ctypes type.
CTYPES = {"uint32_t": ctypes.c_uint32, "int32_t": ctypes.c_int32, "uint64_t": ctypes.c_uint64,
          "void*": ctypes.c_void_p, "const char*": ctypes.c_char_p}

#: Longest line of a generated entry-point typedef before its parameters wrap.
_WIDTH = 110

_INTRO = """\
/* aotpack kernel launch ABI: how a static kernel.so and a per-kernel wrapper.so are called.
 *
 * GENERATED by aotpack/backends/host/kernel_abi.py -- do not edit. Change that module, then run
 *   python -m aotpack.backends.host.kernel_abi --header > native/include/aotpack/kernel_abi.h
 * (tests/unit/test_kernel_abi.py checks that this file is up to date).
 *
 * Three parties, each its own shared object:
 *   kernel.so   one compiled tiling of one fused kernel (static_kernel/<kernel_key>/);
 *   wrapper.so  the kernel_key -> TilingInfo table of a fused kernel; loads the kernel.so
 *               files, checks their kernel ABI, validates launches and forwards them;
 *   caller      the generated model.so at run time, or aotpack's Python launcher during
 *               autotuning (aotpack/backends/host/launch_abi.py).
 *
 * Who allocates what: the CALLER owns every buffer. It asks the wrapper for the kernel's
 * TilingInfo (aotpack_tiling_info), allocates `workspace_bytes` of scratch memory once per
 * kernel at load (64-byte aligned, AOTPACK_WORKSPACE_ALIGNMENT), and passes it with every
 * launch; it also allocates the kernel's inputs and outputs (args). Kernels and wrappers
 * never allocate per launch, and never keep a pointer after the launch returns.
 *
 * Versioning (DLPack style). AOTPACK_KERNEL_ABI_VERSION packs MAJOR << 16 | MINOR:
 *   MAJOR  bumped on an incompatible change: a field moved, removed or re-typed, an entry
 *          point's signature or meaning changed. A reader refuses another MAJOR.
 *   MINOR  bumped on a compatible addition: a field appended to a struct (announced by
 *          struct_size), a new status or device code, a new optional entry point. A reader
 *          accepts any MINOR of its MAJOR: it reads only the fields the caller's struct_size
 *          covers and treats missing ones as their documented default.
 * The wrapper refuses a kernel.so of another MAJOR; model.so refuses a wrapper.so of another
 * MAJOR. The model ABI (model.so <-> runtime) and the host ABI (AotpackHostV1) have their own
 * version numbers in model_abi.h.
 *
 * Generated kernels and wrappers are compiled without any -I flag, so they do not include
 * this header: they inline the same declarations without these comments
 * (kernel_abi.declarations(), the templates' `kernel_abi`).
 */"""

_WRAPPER_ERRORS = (
    "Every entry point returns int32_t: 0 (or a count) = ok, negative = error with the",
    "message in aotpack_last_error() (thread-local, valid until the next call).")


def _signature(entry: EntryPoint, name: str) -> str:
    return f"{entry.returns} {name}({', '.join(entry.params)});"


def _typedef(entry: EntryPoint) -> str:
    """The pointer typedef, its parameters wrapped under the opening parenthesis past ``_WIDTH``."""
    head = f"typedef {entry.returns} (*{entry.typedef})("
    lines, line = [], head
    for i, param in enumerate(entry.params):
        piece = param + (");" if i == len(entry.params) - 1 else ",")
        if line != head and len(line) + 1 + len(piece) > _WIDTH:
            lines.append(line)
            line = " " * len(head) + piece
        else:
            line += ("" if line == head else " ") + piece
    return "\n".join([*lines, line])


def _version_macros(documented: bool) -> list[str]:
    def doc(text: str) -> list[str]:
        return [f"/** \\brief {text} */"] if documented else []

    return [*doc("Kernel ABI MAJOR: incompatible layout or semantics change; refused on mismatch."),
            f"#define AOTPACK_KERNEL_ABI_VERSION_MAJOR {VERSION_MAJOR}",
            *doc("Kernel ABI MINOR: compatible additions (appended fields, new codes)."),
            f"#define AOTPACK_KERNEL_ABI_VERSION_MINOR {VERSION_MINOR}",
            *doc("(MAJOR << 16) | MINOR, as returned by aotpack_kernel_abi_version()."),
            "#define AOTPACK_KERNEL_ABI_VERSION \\",
            "  ((AOTPACK_KERNEL_ABI_VERSION_MAJOR << 16) | AOTPACK_KERNEL_ABI_VERSION_MINOR)",
            *([] if documented else [""]),
            *doc("Alignment in bytes the caller gives a workspace (a cache line, AVX-512 loads)."),
            f"#define AOTPACK_WORKSPACE_ALIGNMENT {WORKSPACE_ALIGNMENT}"]


def _enum(decl: Declaration, documented: bool) -> list[str]:
    width = max(len(f"  {m.name} = {m.c_type},") for m in decl.members)
    lines = [f"/** \\brief {decl.doc[0]} */"] if documented else []
    lines.append(f"enum {decl.name} {{")
    for i, m in enumerate(decl.members):
        text = f"  {m.name} = {m.c_type}" + ("," if i < len(decl.members) - 1 else "")
        lines.append(f"{text:<{width}} /**< \\brief {m.doc[0]} */" if documented else text)
    return [*lines, "};"]


def _comment(doc: tuple[str, ...], indent: str) -> list[str]:
    """A ``/** \\brief ... */`` block; continuation lines under `` *  ``."""
    if len(doc) == 1:
        return [f"{indent}/** \\brief {doc[0]} */"]
    return [f"{indent}/** \\brief {doc[0]}", *(f"{indent} *  {line}" for line in doc[1:-1]),
            f"{indent} *  {doc[-1]} */"]


def _struct(decl: Declaration, documented: bool) -> list[str]:
    lines = _comment(decl.doc, "") if documented else []
    lines.append(f"typedef struct {decl.name} {{")
    for m in decl.members:
        lines += [*(_comment(m.doc, "  ") if documented else []), f"  {m.c_type} {m.name};"]
    return [*lines, f"}} {decl.name};"]


def _v1_size(documented: bool) -> list[str]:
    last = KERNEL_LAUNCH.members[-1]
    doc = _comment(("struct_size of the 1.0 AotpackKernelLaunch (through max_threads): the least a",
                    "reader accepts. Stays fixed when fields are appended."), "") if documented else []
    return [*doc, "#define AOTPACK_KERNEL_LAUNCH_V1_SIZE \\",
            f"  ((uint32_t)(offsetof({KERNEL_LAUNCH.name}, {last.name}) + sizeof({last.c_type})))"]


def _entry_point_comment() -> list[str]:
    lines = ["/* ---- exported by every static kernel.so ----", " *"]
    for party in ("kernel", "wrapper"):
        if party == "wrapper":
            lines += [" *", " * ---- exported by every per-kernel wrapper.so ----",
                      *(f" * {line}" for line in _WRAPPER_ERRORS), " *"]
        for entry in (e for e in ENTRY_POINTS if party in e.exported_by):
            doc = entry.doc if party == "kernel" or "kernel" not in entry.exported_by else (
                "AOTPACK_KERNEL_ABI_VERSION the wrapper implements.",)
            lines.append(f" * {_wrapped_signature(entry)}")
            lines += [f" *     {line}" for line in doc]
    return [*lines, " */"]


def _wrapped_signature(entry: EntryPoint) -> str:
    """``returns symbol(params);`` for the comment, wrapped under the parenthesis past 90 columns."""
    text = _signature(entry, entry.symbol)
    if len(text) + 3 <= 92:
        return text
    head = f"{entry.returns} {entry.symbol}("
    first = ", ".join(entry.params[:-1]) + ","
    return f"{head}{first}\n *{' ' * (len(head) + 1)}{entry.params[-1]});"


def _body(documented: bool) -> list[str]:
    lines = ["#ifndef AOTPACK_KERNEL_ABI_H", "#define AOTPACK_KERNEL_ABI_H", "", "#include <stddef.h>",
             "#include <stdint.h>", "", "#ifdef __cplusplus", 'extern "C" {', "#endif", "",
             *_version_macros(documented), ""]
    for decl in DECLARATIONS:
        lines += [*(_enum(decl, documented) if decl.kind == "enum" else _struct(decl, documented)), ""]
        if decl is KERNEL_LAUNCH:
            lines += [*_v1_size(documented), ""]
    if documented:
        lines += _entry_point_comment()
    lines += [_typedef(e) for e in ENTRY_POINTS]
    lines += ["", "#ifdef __cplusplus", "}", "#endif", "", "#endif  /* AOTPACK_KERNEL_ABI_H */" if not documented
              else "#endif /* AOTPACK_KERNEL_ABI_H */"]
    return lines


def header() -> str:
    """Text of ``native/include/aotpack/kernel_abi.h``: every declaration, documented."""
    return "\n".join([_INTRO, *_body(documented=True)]) + "\n"


def declarations() -> str:
    """The declarations generated kernels and wrappers inline (no comments, no final newline:
    the templates print it on a line of its own)."""
    return "\n".join(["// aotpack kernel launch ABI (native/include/aotpack/kernel_abi.h documents every field).",
                      *_body(documented=False)])


def ctypes_fields(struct: Declaration) -> list[tuple[str, type]]:
    """``_fields_`` of the ctypes mirror of ``struct`` (``KERNEL_LAUNCH``, ``TILING_INFO``).

    Raises:
        KeyError: a field's C type has no ctypes equivalent in ``CTYPES``.
    """
    return [(m.name, CTYPES[m.c_type]) for m in struct.members]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the kernel launch ABI's generated C")
    parser.add_argument("--header", action="store_true", help="print native/include/aotpack/kernel_abi.h")
    args = parser.parse_args(argv)
    sys.stdout.write(header() if args.header else declarations() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
