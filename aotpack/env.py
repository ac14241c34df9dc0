"""The registry of every environment variable aotpack reads, declared once: name, type,
default, validation, one doc line and who reads it (the compiler, the Python runtime, the
native runtime, the generated model library, the package build).

No other module reads ``os.environ``: Python code calls ``get`` (parsed and validated, the
default when unset) or ``raw`` (the text, None when unset) where it needs the value, so a
variable read at every load is still read at every load, and tests override variables with
``monkeypatch.setenv``. A child process gets ``child_environment(**overrides)``; keys and
other settings travel to the runtime as arguments, never by writing variables.

The native runtime's names and the reference table are generated from here (tests/unit/test_env.py
fails while a checked-in copy differs)::

    python -m aotpack.env --header > native/include/aotpack/env_vars.h
    python -m aotpack.env --docs > docs/env_vars.md
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass
from typing import Callable

from aotpack.archive import layout
from aotpack.backends import DEFAULT as DEFAULT_BACKEND
from aotpack.errors import AotpackError

log = logging.getLogger("aotpack")

#: Who reads a variable (the "read by" column of docs/env_vars.md).
BUILD = "build"  # aotpack build: the compiler, in Python
PYTHON = "python runtime"  # aotpack.load, run, verify, cache, serve
NATIVE = "native runtime"  # libaotpack_runtime, aotpack-run, aotpack-serve
MODEL = "model library"  # the generated model, when it is created
SETUP = "package build"  # setup.py, during pip install .

#: Candidates requested from the tiling solver per kernel (TopN, at most 10).
MAX_TOPN = 10


@dataclass(frozen=True)
class Variable:
    """One environment variable.

    ``parse(name, text)`` turns a set value into the value ``get`` returns and raises
    ``AotpackError`` for an invalid one; ``default`` is returned when the variable is
    unset (or empty, where ``empty_is_unset``); None means the reader derives it, as
    ``shown`` says. ``standard``: a variable of the system, not aotpack's own.
    """

    name: str
    kind: str
    default: object
    doc: str
    readers: tuple[str, ...]
    parse: Callable[[str, str], object]
    flag: str = ""
    shown: str = ""
    empty_is_unset: bool = True
    standard: bool = False

    @property
    def macro(self) -> str:
        """The C macro naming it in native/include/aotpack/env_vars.h."""
        return "AOTPACK_ENV_" + self.name.removeprefix("AOTPACK_")

    @property
    def shown_default(self) -> str:
        """The default as docs/env_vars.md shows it."""
        return self.shown or str(self.default)


def get(var: Variable):
    """``var``'s value now: parsed from the environment, or its default when unset.

    Raises:
        AotpackError: the value is invalid (the message names the variable).
    """
    text = os.environ.get(var.name)
    if text is None or (text == "" and var.empty_is_unset):
        return var.default
    return var.parse(var.name, text)


def raw(var: Variable) -> str | None:
    """``var``'s text now, None when unset (for readers whose rule is their own)."""
    return os.environ.get(var.name)


def child_environment(**overrides: str) -> dict[str, str]:
    """The environment for a child process: this one's, with ``overrides`` set."""
    return {**os.environ, **overrides}


# ---- validation: each parser takes (name, text) and raises AotpackError naming the variable ----

def parse_topn(raw_value: str | int, source: str = "AOTPACK_AUTOTUNE_TOPN") -> int:
    """Validate a TopN setting: a positive integer, clamped to ``MAX_TOPN`` with a warning.

    Raises:
        AotpackError: ``"<source> must be a positive integer"`` for a non-integer,
            ``"<source> must be >= 1"`` for zero or a negative number.
    """
    try:
        value = int(str(raw_value).strip())
    except ValueError:
        raise AotpackError(f"{source} must be a positive integer, got {raw_value!r}") from None
    if value < 1:
        raise AotpackError(f"{source} must be >= 1, got {value}")
    if value > MAX_TOPN:
        log.warning("%s=%d exceeds the maximum of %d candidates; using %d",
                    source, value, MAX_TOPN, MAX_TOPN)
        value = MAX_TOPN
    return value


def parse_number(raw_value: str | float, source: str, valid, expected: str) -> float:
    """``raw_value`` as a float that ``valid`` accepts; ``source`` (a flag or variable name)
    and ``expected`` (e.g. ``a number in (0, 1]``) word the error.

    Raises:
        AotpackError: ``<source> must be <expected>, got <raw>``: not a number, or not valid.
    """
    try:
        value = float(raw_value)
    except (TypeError, ValueError):
        value = None
    if value is None or not valid(value):
        raise AotpackError(f"{source} must be {expected}, got {raw_value!r}") from None
    return value


def parse_limit(name: str, text: str) -> int:
    """A reading limit: decimal digits only (no sign, space or underscore), from 1 to
    ``layout.LIMIT_VALUE_MAX``, the native runtime's rule (native/src/limits.cpp).

    Raises:
        AotpackError: "<name> must be an integer from 1 to 9223372036854775807, got '<text>'".
    """
    significant = text.lstrip("0")
    digits = text.isascii() and text.isdigit() and len(significant) <= 19  # int() of 5000 digits raises
    if not digits or not 1 <= int(significant or "0") <= layout.LIMIT_VALUE_MAX:
        raise AotpackError(f"{name} must be an integer from 1 to {layout.LIMIT_VALUE_MAX}, got '{text}'")
    return int(significant)


def _text(name: str, text: str) -> str:
    return text


def _is_one(name: str, text: str) -> bool:
    return text == "1"


def _not_zero(name: str, text: str) -> bool:
    return text != "0"


def _profile(name: str, text: str) -> bool:
    return not text.startswith("0")  # the generated model's rule: set, not empty, not starting with 0


def _zero_or_one(name: str, text: str) -> bool:
    if text not in ("0", "1"):
        raise AotpackError(f"{name} must be 0 or 1, got '{text}'")
    return text == "1"


def _threads(name: str, text: str) -> int:
    try:
        return max(1, int(text))
    except ValueError:
        raise AotpackError(f"{name} must be a positive integer, got {text!r}") from None


def _mib(name: str, text: str) -> int:
    if not text.isdigit():
        raise AotpackError(f"{name} must be a whole number of MiB, got '{text}'")
    return int(text)


def _epoch(name: str, text: str) -> int:
    if not text.isdigit():
        raise AotpackError(f"{name} must be a whole number of seconds since 1970, got '{text}'")
    return int(text)


def _keys(name: str, text: str) -> tuple[str, ...]:
    keys = [part for part in text.split(":") if part]
    if not keys:
        raise AotpackError(f"{name} is set but names no key: '{text}'; set it to colon-separated "
                           "PEM public key files, or unset it to load unsigned archives")
    return tuple(keys)


def _number(valid: Callable[[float], bool], expected: str) -> Callable[[str, str], float]:
    return lambda name, text: parse_number(text, name, valid, expected)


# ---- the registry, in the order of docs/env_vars.md ----

VARIABLES: list[Variable] = []


def _declare(name: str, kind: str, default: object, doc: str, readers: tuple[str, ...],
             parse: Callable[[str, str], object] = _text, **details) -> Variable:
    var = Variable(name, kind, default, doc, readers, parse, **details)
    VARIABLES.append(var)
    return var


TOPN = _declare(
    "AOTPACK_AUTOTUNE_TOPN", "integer", 1,
    "candidate tilings kept per fused kernel. Not an integer: error `must be a positive integer`; < 1: "
    "error `must be >= 1`; > 10: warning, clamped to 10. 1 = the default tiling goes straight to "
    "`optimize_tiling`, no profiling.", (BUILD,), lambda name, text: parse_topn(text, name), flag="--topn", empty_is_unset=False)
COSTMODEL = _declare(
    "AOTPACK_COSTMODEL", "flag", False,
    "`1`: rank the solver's whole space (up to 10 tilings) with the backend's cost model and compile "
    "only the best share of it (at most `--topn`).", (BUILD,), _is_one, flag="--cost-model", shown="off")
COSTMODEL_RATIO = _declare(
    "AOTPACK_COSTMODEL_RATIO", "number", 0.25,
    "share of the space the cost model keeps: `ceil(ratio x space)`, at least 1. Not a number in "
    "(0, 1]: error `must be a number in (0, 1]`.", (BUILD,),
    _number(lambda v: 0 < v <= 1, "a number in (0, 1]"), flag="--cost-model-ratio", empty_is_unset=False)
TINY_KERNEL_US = _declare(
    "AOTPACK_TINY_KERNEL_US", "number", 10.0,
    "a kernel whose default tiling the backend estimates under this many us compiles only that default "
    "(its PGO wrapper is shipped as is); `0`: every kernel gets `--topn`. Not a number >= 0: error "
    "`must be a number of microseconds >= 0`.", (BUILD,),
    _number(lambda v: v >= 0, "a number of microseconds >= 0"), flag="--tiny-kernel-us", shown="10",
    empty_is_unset=False)
FAR_BEHIND_FACTOR = _declare(
    "AOTPACK_FAR_BEHIND_FACTOR", "number", 1.4,
    "a candidate whose estimated time (`estimate_us`) is at least this many times its kernel's best is "
    "not compiled, for the kernels whose estimates rank tilings (the CPU's GEMM, convolution, Winograd "
    "and bmm templates); `0`: every candidate is compiled. Not 0 or a number > 1: error `must be 0 (off) "
    "or a number > 1`.", (BUILD,),
    _number(lambda v: v == 0 or 1 < v < float("inf"), "0 (off) or a number > 1"),
    flag="--far-behind-factor", empty_is_unset=False)
DEVICE_LIMIT = _declare(
    "AOTPACK_DEVICE_LIMIT", "integer", None,
    "cores the kernels may use: every candidate's `block_dim` <= it. Bounded by the affinity mask and "
    "the cgroup CPU quota (`config.parse_device_limit`); recorded in the manifest; part of the cache key.",
    (BUILD,), flag="--device-limit", shown="all cores")
CACHE_DIR = _declare(
    "AOTPACK_CACHE_DIR", "path", None,
    "kernel cache: `<dir>/cpu/<kernel>/<artifact_hash>/`. Delete it to force recompiles.", (BUILD,),
    flag="--cache-dir", shown="`$XDG_CACHE_HOME/aotpack` (`~/.cache/aotpack`)")
COMPILE_THREADS = _declare(
    "AOTPACK_COMPILE_THREADS", "integer", None,
    "parallel compiler processes; 1 = compile one at a time (debugging). Not an integer: error "
    "`must be a positive integer`; below 1 counts as 1.", (BUILD,), _threads, shown="cores",
    empty_is_unset=False)
DEBUG = _declare(
    "AOTPACK_DEBUG", "flag", False,
    "`1` copies every generated source (all candidates, wrappers, the model source) to `./aotpack_debug/`; a "
    "failed `torch.export` writes torch's full error, traceback and output to "
    "`./aotpack_debug/<model>/export.log`.", (BUILD,), _is_one, flag="--debug-dir", shown="off")
BACKEND = _declare(
    "AOTPACK_BACKEND", "name", DEFAULT_BACKEND,
    "kernel backend. `npu` (Ascend, via torch_npu) is planned; selecting it fails with a clear message.",
    (BUILD,), flag="--backend", empty_is_unset=False)
RETUNE = _declare(
    "AOTPACK_RETUNE", "flag", False,
    "`1` ignores the build cache's tuning records (autotune winners) and times every candidate again.", (BUILD,),
    _is_one, flag="--retune", shown="off")
RUNTIME = _declare(
    "AOTPACK_RUNTIME", "path", None,
    "the `aotpack-run` binary `runtime.native.run_archive` drives (tests, benchmarks); must be an "
    "executable file.", (PYTHON,),
    shown="`native/build/aotpack-run`, the package's `bin/`, then `PATH`")
SERVE = _declare(
    "AOTPACK_SERVE", "path", None,
    "the server binary `aotpack serve` runs (docs/deploy.md); must be an executable file.", (PYTHON,),
    shown="`native/build/aotpack-serve`, the package's `bin/`, then `PATH`")
RUNTIME_LIB = _declare(
    "AOTPACK_RUNTIME_LIB", "path", None,
    "the runtime library `aotpack.load` loads (`libaotpack_runtime`; `_aotpack_binding` is looked for "
    "in its folder); must be a file. Read at the first load.", (PYTHON,),
    shown="`native/build/`, the package's `lib/`, then `<sys.prefix>/lib`")
BINDING = _declare(
    "AOTPACK_BINDING", "name", "",
    "`ctypes`: `aotpack.load` calls the runtime through ctypes even where `_aotpack_binding` is built "
    "(~2.5 us more per call). Read at every load.", (PYTHON,), shown="extension")
RUNTIME_CACHE = _declare(
    "AOTPACK_RUNTIME_CACHE", "flag", True,
    "`0` makes the native runtime extract each load to a private `$TMPDIR` folder instead of the "
    "extraction cache `$XDG_CACHE_HOME/aotpack/runtime/` (docs/archive.md); a folder a killed runtime "
    "left there is removed by the next such load.", (NATIVE, PYTHON), _not_zero, shown="on")
RUNTIME_CACHE_MB = _declare(
    "AOTPACK_RUNTIME_CACHE_MB", "MiB", 4096,
    "size cap of the extraction cache in MiB (a whole number; anything else is a load error). Each new "
    "entry evicts the least recently used entries beyond it that no process has loaded; `0` keeps only "
    "entries in use.", (NATIVE, PYTHON), _mib, flag="aotpack cache prune --max-mb")
HOST_CACHE_MB = _declare(
    "AOTPACK_HOST_CACHE_MB", "MiB", 1024,
    "cap in MiB of the idle host buffers the runtime keeps for reuse (native/README.md, host buffer "
    "cache); `0` turns the cache off (buffers come from ATen's CPU allocator). Read once per process, "
    "at the first load; anything but a whole number is a load error.", (NATIVE,), _mib)
PROFILE = _declare(
    "AOTPACK_PROFILE", "flag", False,
    "`1`: the generated model library times each fused kernel launch and, when the model is destroyed "
    "(`aotpack-run` exiting, an `aotpack.load` model deleted), prints per kernel `calls`, `total_us`, "
    "`us/call` and `share` to stderr (native/README.md); unset, empty or starting with `0`: off. Read "
    "when a model is created.", (MODEL,), _profile, shown="off")
TRUSTED_KEYS = _declare(
    "AOTPACK_TRUSTED_KEYS", "keys", (),
    "colon-separated Ed25519 public keys (PEM); when set, the runtime and `aotpack verify` refuse "
    "archives not signed by one of them. Empty components between keys are skipped; set but naming no "
    "key (`\"\"`, `\":\"`, `\"::\"`) is an error (`AOTPACK_TRUSTED_KEYS is set but names no key`), never "
    "\"no signature required\": unset it to load unsigned archives. Read by the runtime at every load; "
    "`--trusted-key` and `aotpack.load(trusted_keys=)` add to it.", (NATIVE, PYTHON), _keys,
    flag="--trusted-key", shown="unset: none", empty_is_unset=False)
REQUIRE_SIGNATURE = _declare(
    "AOTPACK_REQUIRE_SIGNATURE", "flag", False,
    "`1`: every load (runtime, `aotpack.load`, `aotpack run`) and `aotpack verify` fails unless trusted "
    "keys are set, so only a validly signed archive passes; `aotpack build`'s own native check is such a "
    "load too. Not unset, empty, `0` or `1`: error `must be 0 or 1`.", (NATIVE, PYTHON), _zero_or_one,
    flag="--require-signature", shown="off")
MAX_ENTRIES = _declare(
    "AOTPACK_MAX_ENTRIES", "integer", layout.DEFAULT_MAX_ENTRIES,
    "most entries an archive may have (runtime and readers). The four `AOTPACK_MAX_*` limits are read at "
    "every load and `verify` by both readers with one rule: decimal digits only, 1 to "
    "9223372036854775807, else error `<NAME> must be an integer from 1 to 9223372036854775807, got "
    "'<value>'`; empty = default (defaults in `aotpack/archive/layout.py`).", (NATIVE, PYTHON), parse_limit)
MAX_ENTRY_BYTES = _declare(
    "AOTPACK_MAX_ENTRY_BYTES", "bytes", layout.DEFAULT_MAX_ENTRY_BYTES, "largest file in an archive.",
    (NATIVE, PYTHON), parse_limit, shown=f"{layout.DEFAULT_MAX_ENTRY_BYTES} (64 GiB)")
MAX_TOTAL_BYTES = _declare(
    "AOTPACK_MAX_TOTAL_BYTES", "bytes", layout.DEFAULT_MAX_TOTAL_BYTES,
    "most bytes all files of an archive may add up to.", (NATIVE, PYTHON), parse_limit,
    shown=f"{layout.DEFAULT_MAX_TOTAL_BYTES} (64 GiB)")
MAX_MANIFEST_BYTES = _declare(
    "AOTPACK_MAX_MANIFEST_BYTES", "bytes", layout.DEFAULT_MAX_MANIFEST_BYTES, "largest manifest.json.",
    (NATIVE, PYTHON), parse_limit, shown=f"{layout.DEFAULT_MAX_MANIFEST_BYTES} (64 MiB)")
SKIP_NATIVE = _declare(
    "AOTPACK_SKIP_NATIVE", "flag", False,
    "`1`: `pip install .` builds a wheel without the native runtime (no CMake run; setup.py), as an "
    "editable install always does.", (SETUP,), _is_one, shown="off")
CXX = _declare(
    "CXX", "path", "g++",
    "the CPU backend's C++ compiler for kernels and the model library: g++ or one emitting GCC's "
    "runtime calls (why: `aotpack/backends/cpu/toolchain.py`). Read when the CPU backend is imported. Each compiler run gets its own `TMPDIR`, `<cache "
    "dir>/tmp/aotpack-cc-pid<N>-*` (the build's `TMPDIR` is left alone), removed when it exits; one left "
    "by a killed build is removed by the next build.", (BUILD,), shown="`g++`", standard=True)
SOURCE_DATE_EPOCH = _declare(
    "SOURCE_DATE_EPOCH", "integer", 0, "mtime of archive entries (reproducible archives).", (BUILD,),
    _epoch, standard=True)
TMPDIR = _declare(
    "TMPDIR", "path", None,
    "where the native runtime makes private folders (extraction with the cache off, temp files); empty: "
    "`/tmp`. `aotpack build` sets it for each compiler run only (see `CXX`).", (NATIVE,), shown="`/tmp`",
    standard=True)
XDG_CACHE_HOME = _declare(
    "XDG_CACHE_HOME", "path", None,
    "holds the kernel cache (`aotpack/`) and the runtime's extraction cache (`aotpack/runtime/`); the "
    "runtime ignores a relative one.", (BUILD, PYTHON, NATIVE), shown="`$HOME/.cache`", standard=True)
HOME = _declare(
    "HOME", "path", None, "the home folder, for `$HOME/.cache` when `XDG_CACHE_HOME` is unset; not "
    "absolute: the extraction cache is off.", (PYTHON, NATIVE), shown="unset: none", standard=True)

BY_NAME = {var.name: var for var in VARIABLES}


# ---- generated files ----

def header() -> str:
    """native/include/aotpack/env_vars.h: the name of every variable the native runtime reads
    (``AOTPACK_ENV_<NAME>``) and the default of each MiB one (``..._DEFAULT``)."""
    lines = [
        "/* Environment variables the native runtime reads (docs/env_vars.md).",
        " *",
        " * GENERATED by aotpack/env.py -- do not edit. Change aotpack/env.py, then run",
        " *   python -m aotpack.env --header > native/include/aotpack/env_vars.h",
        " * (tests/unit/test_env.py checks that this file is up to date, and that native/ names no",
        " * variable but through these macros).",
        " */",
        "#ifndef AOTPACK_ENV_VARS_H",
        "#define AOTPACK_ENV_VARS_H",
        "",
    ]
    for var in VARIABLES:
        if NATIVE not in var.readers:
            continue
        lines.append(f'#define {var.macro} "{var.name}"')
        if var.kind == "MiB":
            lines.append(f"#define {var.macro}_DEFAULT {var.default}ULL")
    lines += ["", "#endif  // AOTPACK_ENV_VARS_H", ""]
    return "\n".join(lines)


def docs() -> str:
    """docs/env_vars.md: one table row per variable, in registry order."""
    lines = [
        "# Environment variables",
        "",
        "Every variable aotpack reads, generated from the registry in `aotpack/env.py` (do not edit; run",
        "`python -m aotpack.env --docs > docs/env_vars.md`). A flag, where there is one, wins over the",
        "variable. \"read by\": `build` is `aotpack build`, `python runtime` is `aotpack.load` and the",
        "`run` / `verify` / `cache` / `serve` commands, `native runtime` is libaotpack_runtime (also in",
        "`aotpack-run` and `aotpack-serve`), `model library` is the generated model, `package build` is setup.py.",
        "",
        "| variable | flag | default | read by | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for var in VARIABLES:
        flag = f"`{var.flag}`" if var.flag else ""
        lines.append(f"| `{var.name}` | {flag} | {var.shown_default} | {', '.join(var.readers)} | {var.doc} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m aotpack.env --header | --docs``: print a generated file to stdout."""
    parser = argparse.ArgumentParser(prog="python -m aotpack.env", description=main.__doc__)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--header", action="store_true", help="native/include/aotpack/env_vars.h")
    which.add_argument("--docs", action="store_true", help="docs/env_vars.md")
    args = parser.parse_args(argv)
    sys.stdout.write(header() if args.header else docs())
    return 0


if __name__ == "__main__":
    sys.exit(main())
