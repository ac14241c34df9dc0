"""The CPU toolchain: the system C++ compiler, its flags, the target ISA and OpenMP rules.

Static kernels use OpenMP (``num_threads(block_dim)``) and only OpenMP <= 5.0
features: torch ships its own ``libgomp.so.1``, which every kernel then shares (never
load a second libgomp by path: two runtimes oversubscribe the cores). So ``$CXX`` (default
g++) must emit GCC's OpenMP ABI (``KERNEL_LIBS``), as torch's own build does. The target ISA
(``-march``) is a build option; what it resolves to, and every CPU feature it turns on,
is recorded in the manifest and checked by the runtime at load.
"""
from __future__ import annotations

import contextlib
import functools
import os
import re
import subprocess
import threading
from pathlib import Path

from aotpack import env, leftovers
from aotpack.tune import cache
from aotpack.backends.base import Toolchain
from aotpack.backends.cpu import wrapper_slot
from aotpack.backends.host import binaries
from aotpack.backends.host import compiler as host_compiler
from aotpack.errors import AotpackError
from aotpack.codegen.render import include_dir

CXX = env.get(env.CXX)  # read once, when the backend is imported
#: Flags of every static kernel. No -ffast-math: masks use -inf and NaN must survive.
#: -O3, not -O2: -O2 compiles faster but the models ran slower (docs/measurements.md,
#: "Kernels at -O3").
KERNEL_FLAGS = ["-O3", "-fopenmp", "-fPIC", "-shared", "-std=c++17",
                "-fno-math-errno", "-fno-trapping-math", "-fno-exceptions", "-pipe", "-nodefaultlibs"]
#: How kernels and wrappers are linked, for a fast dlopen (a model loads two libraries per
#: kernel). noseparate-code puts the ELF headers, code and read-only data in one executable
#: segment, binutils' layout before 2.31: two mappings per library instead of four. The cost:
#: constants and headers become executable bytes, more gadgets for an exploit of a memory bug
#: elsewhere in the process. RELRO stays: -z norelro would leave .dynamic, .fini_array and
#: the GOT writable in every kernel the runtime loads (docs/measurements.md, "Fast-loading link").
LOAD_FAST_LINK = ["-Wl,-z,noseparate-code"]
#: What a kernel links: g++'s default libraries less libstdc++, whose symbols no kernel uses
#: (Winograd's <utility> is header-only); -fno-exceptions drops the personality routine that
#: OpenMP regions' terminate-on-throw cleanups would take from it. Both that and -pipe (no
#: temporary assembly file) shorten every kernel compile (docs/measurements.md, "Kernels link
#: without libstdc++, compile with -pipe"). Kernels use GCC's
#: OpenMP ABI (GOMP_*), so $CXX must be g++ or a compiler emitting it (clang's -fopenmp
#: emits libomp's __kmpc_* calls, which -lgomp does not provide).
KERNEL_LIBS = ["-lm", "-lgomp", "-lgcc_s", "-lpthread", "-lc", "-lgcc_s", *LOAD_FAST_LINK]
#: A kernel source whose leading comment holds this line compiles at -O2 instead (the flag is
#: in the source, so the build cache and the binary store, keyed on the source, follow it).
#: The direct convolution template carries it: its inner loops are explicit vectors unrolled
#: by pragmas, where -O3's loop passes have nothing left to gain: it compiles in under half
#: the time and runs level. The Winograd and lanes templates stay at -O3, where they run
#: faster (docs/measurements.md, "The direct convolution template at -O2").
O2_MARK = "// aotpack: compile at -O2"
#: A wrapper is glue (a kernel_key lookup and one indirect call per launch), compiled once per
#: toolchain (wrapper_slot: each kernel's map is written into that binary; PGO launches through
#: it, the archive ships it): -O0 builds it faster and costs only ~10 ns more per launch
#: (docs/measurements.md, "Wrappers at -O0 without libstdc++").
WRAPPER_FLAGS = ["-O0", "-fPIC", "-shared", "-std=c++17", "-pipe", "-nodefaultlibs"]
#: A wrapper calls libc and dlopen only (C headers), so it links without libstdc++, which
#: compiles it faster.
WRAPPER_LIBS = ["-ldl", "-lc", *LOAD_FAST_LINK]
#: model.so is glue (one long function of calls into kernels and ATen), compiled at -O0: a
#: launch is a few calls through the host table at any level, and -O1's passes over the long
#: function cost most of its compile (docs/measurements.md, "model.so at -O0").
MODEL_FLAGS = ["-O0", "-fPIC", "-shared", "-std=c++17", "-pipe"]
MODEL_LIBS = ["-ldl"]
#: A compile that runs longer than this is stuck (a kernel TU takes well under 10 s).
COMPILE_TIMEOUT_S = 300

#: CPU features the runtime can test with __builtin_cpu_supports, by gcc macro. Every
#: one that -march enables is recorded, so the runtime refuses a CPU lacking any.
ISA_MACROS = {
    "__SSE__": "sse", "__SSE2__": "sse2", "__SSE3__": "sse3", "__SSSE3__": "ssse3",
    "__SSE4_1__": "sse4.1", "__SSE4_2__": "sse4.2", "__POPCNT__": "popcnt", "__AVX__": "avx",
    "__AVX2__": "avx2", "__FMA__": "fma", "__F16C__": "f16c", "__BMI__": "bmi", "__BMI2__": "bmi2",
    "__AVX512F__": "avx512f", "__AVX512BW__": "avx512bw", "__AVX512VL__": "avx512vl",
    "__AVX512DQ__": "avx512dq", "__AVX512CD__": "avx512cd", "__AVX512VNNI__": "avx512vnni",
    "__AVX512BF16__": "avx512bf16", "__AVX512FP16__": "avx512fp16", "__AVX512VBMI__": "avx512vbmi",
    "__AVX512VBMI2__": "avx512vbmi2", "__AVX512IFMA__": "avx512ifma",
    "__AVX512BITALG__": "avx512bitalg", "__AVX512VPOPCNTDQ__": "avx512vpopcntdq",
    "__AVXVNNI__": "avxvnni", "__GFNI__": "gfni", "__VAES__": "vaes", "__VPCLMULQDQ__": "vpclmulqdq",
}


def compiler_version() -> str:
    """First line of ``$CXX --version`` (part of every cache key).

    Raises:
        AotpackError: no working C++ compiler.
    """
    return host_compiler.compiler_version(CXX, "C++ compiler", "install g++ (apt-get install g++) or set CXX")


@functools.lru_cache(maxsize=None)
def target_isa(march: str) -> dict:
    """``{"march", "features"}``: what ``-march=<march>`` resolves to and requires.

    Raises:
        AotpackError: the compiler rejects the value.
    """
    compiler_version()
    probe = subprocess.run([CXX, f"-march={march}", "-dM", "-E", "-x", "c++", "/dev/null"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        raise AotpackError(f"the compiler rejects -march={march}: {probe.stderr.strip()}; "
                           "pass a value gcc knows (e.g. native, x86-64-v3)")
    defined = set(re.findall(r"#define (\w+)", probe.stdout))
    resolved = march
    if march == "native":
        query = subprocess.run([CXX, "-march=native", "-Q", "--help=target"],
                               capture_output=True, text=True).stdout
        found = re.search(r"-march=\s+(\S+)", query)
        resolved = found.group(1) if found else march
    features = sorted({name for macro, name in ISA_MACROS.items() if macro in defined})
    return {"march": resolved, "features": features}


@functools.lru_cache(maxsize=None)
def target_fingerprint(march: str) -> str:
    """Everything -march=<march> turns on here (``native`` differs between hosts)."""
    query = subprocess.run([CXX, f"-march={march}", "-Q", "--help=target"], capture_output=True, text=True)
    return query.stdout


def compile_so(cmd_prefix: list[str], source: Path, output: Path, libs: list[str] = (),
               temp_root: Path | None = None) -> None:
    """Compile one C++ file into a shared library linked against ``libs`` (after the
    source, so the linker keeps them), atomically (temp name + rename).

    ``temp_root``: the compiler runs with ``TMPDIR`` (in its environment only) set to a
    folder of its own there (``leftovers.compiler_tmpdir``), removed when it exits and,
    after a SIGKILL, by the next compile: gcc's ``cc*.o`` temp files never pile up in the
    system ``$TMPDIR``. None: the inherited ``TMPDIR``.

    Raises:
        AotpackError: the compiler failed or timed out; the message names the source
            file and carries the compiler's first error lines.
    """
    tmp = output.with_name(f".{output.name}.{leftovers.tag()}.tmp")
    cmd = [*cmd_prefix, str(source), "-o", str(tmp), *libs]
    try:
        with contextlib.ExitStack() as stack:
            environment = None
            if temp_root is not None:
                temp = stack.enter_context(leftovers.compiler_tmpdir(temp_root))
                environment = env.child_environment(**{env.TMPDIR.name: str(temp)})
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, env=environment)
    except subprocess.TimeoutExpired:
        tmp.unlink(missing_ok=True)
        raise AotpackError(f"compiling {source} took over {COMPILE_TIMEOUT_S} s and was stopped; "
                           "the machine may be overloaded (set AOTPACK_COMPILE_THREADS=1)") from None
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        errors = "\n".join(result.stderr.strip().splitlines()[:20])
        raise AotpackError(f"compiling {source} failed (this is an aotpack bug; please report it "
                           f"with the file):\n{errors}")
    os.replace(tmp, output)


def kernel_flags(source_text: str) -> list[str]:
    """``KERNEL_FLAGS``, at -O2 where ``source_text``'s leading ``//`` comment holds ``O2_MARK``."""
    for line in source_text.splitlines():
        if not line.startswith("//"):
            break
        if line == O2_MARK:
            return ["-O2" if flag == "-O3" else flag for flag in KERNEL_FLAGS]
    return KERNEL_FLAGS


class CpuToolchain(Toolchain):
    """g++ (or ``$CXX``) with ``-march=<march>`` for kernels."""

    def __init__(self, march: str, slot_dir: Path | None = None, temp_root: Path | None = None):
        """``slot_dir``: the binary store holding the wrapper slot (``wrapper_slot``); None
        compiles every wrapper. ``temp_root``: where each compiler run gets its own
        ``TMPDIR`` (``compile_so``); None: the inherited one."""
        self.march = march
        self.slot_dir = slot_dir
        self.temp_root = temp_root
        self._slot_lock = threading.Lock()

    def _prefix(self, kind: str, source_text: str = "") -> list[str]:
        if kind == "kernel":
            return [CXX, *kernel_flags(source_text), f"-march={self.march}"]
        if kind == "wrapper":
            return [CXX, *WRAPPER_FLAGS]
        return [CXX, *MODEL_FLAGS, f"-I{include_dir()}"]

    def _libs(self, kind: str) -> list[str]:
        return {"kernel": KERNEL_LIBS, "wrapper": WRAPPER_LIBS}.get(kind, MODEL_LIBS)

    def fingerprint(self) -> str:
        return "\0".join([compiler_version(), " ".join(KERNEL_FLAGS + KERNEL_LIBS),
                          " ".join(kernel_flags(O2_MARK)), " ".join(WRAPPER_FLAGS + WRAPPER_LIBS),
                          target_fingerprint(self.march)])

    def model_fingerprint(self) -> str:
        """Everything besides model.cpp that changes model.so: the compiler, its flags and
        every header in ``include_dir()`` (model.cpp includes two of them; an ABI header
        edited without a new model.cpp must not reuse a stale library)."""
        headers = sorted(include_dir().glob("*.h"))
        return "\0".join([compiler_version(), " ".join(MODEL_FLAGS + MODEL_LIBS),
                          *(f"{h.name}\0{h.read_text(errors='replace')}" for h in headers)])

    def command(self, source: Path, output: Path, kind: str, source_text: str = "") -> list[str]:
        return [*self._prefix(kind, source_text), str(source), "-o", str(output), *self._libs(kind)]

    def _compile(self, source: Path, output: Path, kind: str) -> None:
        text = source.read_text(errors="replace") if kind == "kernel" else ""
        compile_so(self._prefix(kind, text), source, output, self._libs(kind), self.temp_root)

    def compile_kernel(self, source: Path, output: Path) -> None:
        self._compile(source, output, "kernel")

    def compile_wrapper(self, source: Path, output: Path) -> None:
        """wrapper.so of ``source``: the slot binary with its map written in
        (``wrapper_slot.patched``), else a compile."""
        binary = self._patched_wrapper(source.read_text()) if self.slot_dir is not None else None
        if binary is None:
            self._compile(source, output, "wrapper")
            return
        cache.write_atomic(output, binary)

    def _patched_wrapper(self, source: str) -> bytes | None:
        slot = wrapper_slot.slot_source()
        with self._slot_lock:  # the first wrapper compiles the slot, the others wait for it
            stored = cache.BinaryStore(self.slot_dir, self.fingerprint(), binaries.BINARY_SUFFIX, binaries.SOURCE_SUFFIX)
            path = stored.path(slot)
            if not cache.is_current(path, path.with_name("source.cpp"), slot):
                leftovers.remove_dead(path.parent)
                cache.write_atomic(path.with_name("source.cpp"), slot)
                self._compile(path.with_name("source.cpp"), path, "wrapper")
                cache.record(path)
        try:
            binary = path.read_bytes()
        except OSError:  # another build quarantined it meanwhile: compile this wrapper
            return None
        return wrapper_slot.patched(binary, source, slot)

    def compile_model(self, source: Path, output: Path) -> None:
        """Compile model.cpp (it includes model_abi.h and kernel_abi.h) into model.so."""
        self._compile(source, output, "model")
