"""Every path inside a ``.aotpack`` archive, and the archive's format version, in one place.

The writer (``aotpack.archive.writer``, ``aotpack.build``), the checks (``aotpack.commands.verify``), the
generated model C++ (``aotpack.backends.cpu.cpp_wrapper``) and the tests use these names; the C++
runtime uses the same values from ``native/include/aotpack/archive_layout.h``, which
this module generates (``header()``). After changing a value here regenerate it::

    python -m aotpack.archive.layout --header > native/include/aotpack/archive_layout.h

(tests/unit/test_layout.py fails while the checked-in header differs). Paths are relative,
``/``-separated, as stored in the tar. Format: docs/archive.md. ``DTYPE_CODES`` mirrors the
other way round: native/include/aotpack/model_abi.h defines the codes, a test compares.
"""
from __future__ import annotations

import argparse
import sys

# Bump on any change a reader of the previous version would misread: a moved or renamed
# path below, a changed file format, a manifest key with a new meaning. Adding manifest
# keys or optional files is not such a change. The runtime refuses any other version.
#: Version 2: kernels use the versioned launch ABI of native/include/aotpack/kernel_abi.h
#: (aotpack_kernel_launch with an AotpackKernelLaunch struct); model ABI 2, host ABI 1.
#: Version 3: a constant may be stored under another name (manifest ``weight_aliases``:
#: tied and repeated weights are stored once).
FORMAT_VERSION = 3
#: MAJOR of the model ABI (model_abi.h) that manifests record as ``model.abi_version``.
MODEL_ABI_VERSION_MAJOR = 2
#: Backends (manifest ``backend``) whose binaries are host shared libraries behind the model
#: and kernel ABIs: the native runtime runs their archives and refuses any other backend.
HOST_BACKENDS = ("cpu", "portable")
#: Manifest dtype name -> AotpackDType code (model_abi.h: c10::ScalarType numbering), the
#: dtype of a tensor crossing the model ABI and the C API (tests/unit/test_layout.py checks the
#: header's enum against it).
DTYPE_CODES = {"uint8": 0, "int8": 1, "int16": 2, "int32": 3, "int64": 4, "float16": 5,
               "float32": 6, "float64": 7, "bool": 11, "bfloat16": 15}

MANIFEST_PATH = "manifest.json"  # always the first entry
MANIFEST_DIGEST_PATH = "manifest.sha256"  # always the second entry: sha256 of manifest.json
MANIFEST_SIGNATURE_PATH = "manifest.sig"  # optional third entry: Ed25519 signature of the digest
MODEL_LIBRARY_PATH = "model/model.so"
MODEL_SOURCE_PATH = "model/model.cpp"
KERNEL_IR_PATH = "model/kernels.ir"  # the graph's steps and every fused kernel's IR, as text
WEIGHTS_PATH = "weights/weights.safetensors"
SELFTEST_INPUTS_PATH = "selftest/inputs.safetensors"  # only with --selftest
SELFTEST_OUTPUTS_PATH = "selftest/outputs.safetensors"  # only with --selftest

#: Bytes to which the writer aligns each constant's data in WEIGHTS_PATH (when its size is
#: a multiple of it) and at which the runtime uses a constant's mapped bytes in place.
WEIGHTS_ALIGNMENT = 64

# ---- reading limits: both readers (native/src/limits.h, aotpack/archive/reader.py) use these ----
# docs/archive.md, "Reading rules" 2, 4 and 5. The AOTPACK_MAX_* variables override the
# defaults with a value from 1 to LIMIT_VALUE_MAX (decimal digits only).
#: Longest archive path, bytes. A cache file's path is <cache root>/<64 hex>/<archive path>
#: (runtime/tmp/<name>/<archive path> while extracted): with this bound it stays under
#: PATH_MAX (4096) for any cache root up to ~2.9 KB; real archives' paths are < 150 bytes.
MAX_PATH_BYTES = 1024
#: Most components ("a/b/c" has 3) in an archive path; real archives have at most 5
#: (kernels/<kernel>/static_kernel/<key>/kernel.so).
MAX_PATH_COMPONENTS = 32
#: Longest path component, bytes: NAME_MAX of Linux file systems, so every listed file can
#: be written where the runtime extracts it.
MAX_NAME_BYTES = 255
#: Deepest nesting of arrays/objects in manifest.json and in a safetensors header.
MAX_JSON_DEPTH = 64
DEFAULT_MAX_ENTRIES = 100_000  # AOTPACK_MAX_ENTRIES
DEFAULT_MAX_ENTRY_BYTES = 64 << 30  # AOTPACK_MAX_ENTRY_BYTES (64 GiB)
DEFAULT_MAX_TOTAL_BYTES = 64 << 30  # AOTPACK_MAX_TOTAL_BYTES (64 GiB)
DEFAULT_MAX_MANIFEST_BYTES = 64 << 20  # AOTPACK_MAX_MANIFEST_BYTES (64 MiB)
#: Largest value an AOTPACK_MAX_* variable may take (int64's maximum: sizes are int64).
LIMIT_VALUE_MAX = (1 << 63) - 1

KERNELS_DIR = "kernels"  # one folder per kernel: kernels/<kernel name>/
WRAPPER_NAME = "wrapper.so"
WRAPPER_SOURCE_NAME = "wrapper.cpp"
OPTIMIZE_TILING_NAME = "optimize_tiling"
STATIC_KERNEL_DIR = "static_kernel"  # kernels/<name>/static_kernel/<kernel_key>/
LIB_KERNEL_NAME = "kernel.so"
LIB_KERNEL_SOURCE_NAME = "kernel.cpp"

# (C macro suffix, value) of every integer constant, in header order (unsigned long long).
_HEADER_NUMBERS = [
    ("MAX_PATH_BYTES", MAX_PATH_BYTES),
    ("MAX_PATH_COMPONENTS", MAX_PATH_COMPONENTS),
    ("MAX_NAME_BYTES", MAX_NAME_BYTES),
    ("MAX_JSON_DEPTH", MAX_JSON_DEPTH),
    ("DEFAULT_MAX_ENTRIES", DEFAULT_MAX_ENTRIES),
    ("DEFAULT_MAX_ENTRY_BYTES", DEFAULT_MAX_ENTRY_BYTES),
    ("DEFAULT_MAX_TOTAL_BYTES", DEFAULT_MAX_TOTAL_BYTES),
    ("DEFAULT_MAX_MANIFEST_BYTES", DEFAULT_MAX_MANIFEST_BYTES),
    ("LIMIT_VALUE_MAX", LIMIT_VALUE_MAX),
]

# (C macro suffix, value) of every path constant, in header order.
_HEADER_CONSTANTS = [
    ("MANIFEST_PATH", MANIFEST_PATH),
    ("MANIFEST_DIGEST_PATH", MANIFEST_DIGEST_PATH),
    ("MANIFEST_SIGNATURE_PATH", MANIFEST_SIGNATURE_PATH),
    ("MODEL_LIBRARY_PATH", MODEL_LIBRARY_PATH),
    ("MODEL_SOURCE_PATH", MODEL_SOURCE_PATH),
    ("KERNEL_IR_PATH", KERNEL_IR_PATH),
    ("WEIGHTS_PATH", WEIGHTS_PATH),
    ("SELFTEST_INPUTS_PATH", SELFTEST_INPUTS_PATH),
    ("SELFTEST_OUTPUTS_PATH", SELFTEST_OUTPUTS_PATH),
    ("KERNELS_DIR", KERNELS_DIR),
    ("WRAPPER_NAME", WRAPPER_NAME),
    ("WRAPPER_SOURCE_NAME", WRAPPER_SOURCE_NAME),
    ("OPTIMIZE_TILING_NAME", OPTIMIZE_TILING_NAME),
    ("STATIC_KERNEL_DIR", STATIC_KERNEL_DIR),
    ("LIB_KERNEL_NAME", LIB_KERNEL_NAME),
    ("LIB_KERNEL_SOURCE_NAME", LIB_KERNEL_SOURCE_NAME),
]


def _component(value: str, what: str) -> str:
    if not value or "/" in value or value in (".", ".."):
        raise ValueError(f"{what} {value!r} is not a single archive path component")
    return value


def kernel_dir(name: str) -> str:
    """``kernels/<name>``: the folder of one kernel.

    Raises:
        ValueError: ``name`` is empty, ``.``/``..`` or contains ``/``.
    """
    return f"{KERNELS_DIR}/{_component(name, 'kernel name')}"


def wrapper_path(name: str) -> str:
    """``kernels/<name>/wrapper.so`` (kernel_key -> TilingInfo map + launch entry points)."""
    return f"{kernel_dir(name)}/{WRAPPER_NAME}"


def wrapper_source_path(name: str) -> str:
    """``kernels/<name>/wrapper.cpp``: the source of ``wrapper_path(name)``."""
    return f"{kernel_dir(name)}/{WRAPPER_SOURCE_NAME}"


def optimize_tiling_path(name: str) -> str:
    """``kernels/<name>/optimize_tiling``: ``tiling_repr|workspace|block_dim`` of the winner."""
    return f"{kernel_dir(name)}/{OPTIMIZE_TILING_NAME}"


def lib_kernel_dir(name: str, kernel_key: str) -> str:
    """``kernels/<name>/static_kernel/<kernel_key>``: the winning candidate's folder.

    Raises:
        ValueError: ``name`` or ``kernel_key`` is not a single path component.
    """
    return f"{kernel_dir(name)}/{STATIC_KERNEL_DIR}/{_component(kernel_key, 'kernel_key')}"


def lib_kernel_path(name: str, kernel_key: str) -> str:
    """``kernels/<name>/static_kernel/<kernel_key>/kernel.so``: the compiled winner."""
    return f"{lib_kernel_dir(name, kernel_key)}/{LIB_KERNEL_NAME}"


def lib_kernel_source_path(name: str, kernel_key: str) -> str:
    """``kernels/<name>/static_kernel/<kernel_key>/kernel.cpp``: the winner's source."""
    return f"{lib_kernel_dir(name, kernel_key)}/{LIB_KERNEL_SOURCE_NAME}"


def header() -> str:
    """Text of ``native/include/aotpack/archive_layout.h``: the constants as C macros
    (``AOTPACK_FORMAT_VERSION``, ``AOTPACK_MANIFEST_PATH``, ...), usable from C and C++
    and concatenable with other string literals."""
    lines = [
        "/* Paths inside a .aotpack archive, its format version, weight alignment and reading limits",
        " * (docs/archive.md).",
        " *",
        " * GENERATED by aotpack/archive/layout.py -- do not edit. Change aotpack/archive/layout.py, then run",
        " *   python -m aotpack.archive.layout --header > native/include/aotpack/archive_layout.h",
        " * (tests/unit/test_layout.py checks that this file is up to date).",
        " *",
        " * Per-kernel paths: AOTPACK_KERNELS_DIR \"/<kernel name>/\" then AOTPACK_WRAPPER_NAME,",
        " * AOTPACK_WRAPPER_SOURCE_NAME, AOTPACK_OPTIMIZE_TILING_NAME, or",
        " * AOTPACK_STATIC_KERNEL_DIR \"/<kernel_key>/\" then AOTPACK_LIB_KERNEL_NAME or",
        " * AOTPACK_LIB_KERNEL_SOURCE_NAME.",
        " */",
        "#ifndef AOTPACK_ARCHIVE_LAYOUT_H",
        "#define AOTPACK_ARCHIVE_LAYOUT_H",
        "",
        f"#define AOTPACK_FORMAT_VERSION {FORMAT_VERSION}",
        f"#define AOTPACK_WEIGHTS_ALIGNMENT {WEIGHTS_ALIGNMENT}",
        "",
    ]
    width = max(len(suffix) for suffix, _ in _HEADER_NUMBERS)
    lines += [f"#define AOTPACK_{suffix:<{width}} {value}ULL" for suffix, value in _HEADER_NUMBERS]
    lines.append("")
    width = max(len(suffix) for suffix, _ in _HEADER_CONSTANTS)
    lines += [f'#define AOTPACK_{suffix:<{width}} "{value}"' for suffix, value in _HEADER_CONSTANTS]
    lines += ["", "/* manifest backends the runtime runs (an array initialiser of string literals) */",
              "#define AOTPACK_HOST_BACKENDS {" + ", ".join(f'"{name}"' for name in HOST_BACKENDS) + "}"]
    lines += ["", "#endif /* AOTPACK_ARCHIVE_LAYOUT_H */", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m aotpack.archive.layout --header``: print the generated C header to stdout."""
    parser = argparse.ArgumentParser(prog="python -m aotpack.archive.layout",
                                     description="Archive layout of .aotpack files.")
    parser.add_argument("--header", action="store_true", required=True,
                        help="print native/include/aotpack/archive_layout.h")
    parser.parse_args(argv)
    sys.stdout.write(header())
    return 0


if __name__ == "__main__":
    sys.exit(main())
