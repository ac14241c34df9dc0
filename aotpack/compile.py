"""Stage: compile every candidate of every fused kernel into its own static kernel.

Cache layout (the seed's, under ``AOTPACK_CACHE_DIR``)::

    <cache>/cpu/<kernel>/<artifact_hash>/
        wrapper.cpp, wrapper.so            kernel_key -> TilingInfo map + entry points
        static_kernel/<kernel_key>/kernel.cpp, kernel.so
        optimize_tiling                    "tiling_repr|workspace|block_dim" of the winner
        compile.lock                       serialises compile + autotune across processes

``artifact_hash`` covers the generated sources (which exclude the kernel's name), the
compiler and its flags, the target ISA and the device limit. An existing
``optimize_tiling`` whose winner is on disk is a cache hit: nothing is compiled or timed.
Every file is written to a temp name and renamed, so a crash never leaves a
half-written entry.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock, Timeout

from aotpack.errors import AotpackError
from aotpack.kernel_ir import FusedKernel
from aotpack.backends.cpu.renderer import render_kernel
from aotpack.render import render
from aotpack.backends.cpu.tiling import Tiling, solve

log = logging.getLogger("aotpack")

CXX = os.environ.get("CXX", "g++")
#: Flags of every static kernel. No -ffast-math: masks use -inf and NaN must survive.
KERNEL_FLAGS = ["-O3", "-fopenmp", "-fPIC", "-shared", "-std=c++17",
                "-fno-math-errno", "-fno-trapping-math"]
WRAPPER_FLAGS = ["-O2", "-fPIC", "-shared", "-std=c++17"]
LOCK_TIMEOUT_S = 900

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


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``path`` via a temp file in the same folder + rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@functools.lru_cache(maxsize=None)
def compiler_version() -> str:
    """First line of ``$CXX --version`` (part of every cache key).

    Raises:
        AotpackError: no working C++ compiler.
    """
    try:
        out = subprocess.run([CXX, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise AotpackError(f"C++ compiler '{CXX}' not found or broken ({exc}); install g++ "
                           "(apt-get install g++) or set CXX") from exc
    return out.splitlines()[0]


@functools.lru_cache(maxsize=None)
def target_isa(march: str) -> dict:
    """``{"march", "features"}``: what ``-march=<march>`` resolves to and requires."""
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


def compile_so(source: Path, output: Path, flags: list[str], march: str | None) -> None:
    """Compile one C++ file into a shared library, atomically.

    Raises:
        AotpackError: the compiler failed; the message names the source file and
            carries the compiler's first error lines.
    """
    tmp = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    arch = [f"-march={march}"] if march else []
    cmd = [CXX, *flags, *arch, str(source), "-o", str(tmp)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        errors = "\n".join(result.stderr.strip().splitlines()[:20])
        raise AotpackError(f"compiling {source} failed (this is an aotpack bug; please report it "
                           f"with the file):\n{errors}")
    os.replace(tmp, output)


@dataclass
class KernelArtifacts:
    """A fused kernel's candidates and where their compiled forms live."""

    kernel: FusedKernel
    candidates: list[Tiling]
    directory: Path
    sources: dict[str, str] = field(default_factory=dict)  # kernel_key -> kernel.cpp
    wrapper_source: str = ""
    winner: Tiling | None = None  # known after a cache hit or autotune
    timings_us: list[float] = field(default_factory=list)
    visited: bool = False
    cache_hit: bool = False

    def kernel_dir(self, tiling: Tiling) -> Path:
        """``static_kernel/<kernel_key>/`` of one candidate."""
        return self.directory / "static_kernel" / tiling.kernel_key

    @property
    def wrapper_path(self) -> Path:
        """The kernel's ``wrapper.so``."""
        return self.directory / "wrapper.so"

    @property
    def optimize_tiling_path(self) -> Path:
        """The ``optimize_tiling`` file: ``tiling_repr|workspace|block_dim`` of the winner."""
        return self.directory / "optimize_tiling"

    @property
    def timings_path(self) -> Path:
        """Candidate timings (us) of the autotune that chose the winner, for reports."""
        return self.directory / "timings.json"

    def needs_autotune(self) -> bool:
        """No winner yet and more than one candidate to choose from."""
        return self.winner is None and len(self.candidates) > 1


def _artifact_hash(sources: list[str], wrapper: str, march: str, device_limit: int) -> str:
    digest = hashlib.sha256()
    for part in [*sources, wrapper, compiler_version(), " ".join(KERNEL_FLAGS), target_fingerprint(march),
                 str(device_limit)]:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:24]


def _read_cached_winner(art: KernelArtifacts) -> Tiling | None:
    """The winner recorded in optimize_tiling, if it and its kernel.so are intact."""
    try:
        text = art.optimize_tiling_path.read_text().strip()
    except OSError:
        return None
    for tiling in art.candidates:
        if tiling.optimize_tiling == text and (art.kernel_dir(tiling) / "kernel.so").is_file() \
                and art.wrapper_path.is_file():
            try:
                art.timings_us = json.loads(art.timings_path.read_text())
            except (OSError, ValueError):
                art.timings_us = []
            return tiling
    return None


def prepare(kernels: list[FusedKernel], topn: int, device_limit: int, march: str,
            cache_dir: Path) -> tuple[list[KernelArtifacts], dict[int, KernelArtifacts]]:
    """Solve tilings and choose each kernel's cache folder.

    Identical kernels (same generated sources, e.g. repeated layers) share one
    ``KernelArtifacts``: compiled once, tuned once, shipped once.

    Returns:
        (unique artifacts in first-use order, ``id(FusedKernel) -> KernelArtifacts``)
    """
    unique: dict[Path, KernelArtifacts] = {}
    by_kernel = {}
    for kernel in kernels:
        candidates = solve(kernel, device_limit)[:topn]
        sources = [render_kernel(kernel, t) for t in candidates]
        wrapper = render("cpu_wrapper.cpp.j2", candidates=candidates)
        directory = cache_dir / "cpu" / kernel.base_name / _artifact_hash(sources, wrapper, march, device_limit)
        if directory not in unique:
            unique[directory] = KernelArtifacts(
                kernel, candidates, directory, dict(zip((t.kernel_key for t in candidates), sources)), wrapper)
        by_kernel[id(kernel)] = unique[directory]
    return list(unique.values()), by_kernel


def lock_all(arts: list[KernelArtifacts]) -> list[FileLock]:
    """Take every kernel's compile.lock, in path order (no deadlock between builds).

    Raises:
        AotpackError: a lock was held by another process for longer than the timeout.
    """
    locks = []
    for directory in sorted({a.directory for a in arts}):
        directory.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(directory / "compile.lock"), timeout=LOCK_TIMEOUT_S)
        try:
            lock.acquire()
        except Timeout:
            for held in locks:
                held.release()
            raise AotpackError(f"{directory / 'compile.lock'} is held by another aotpack process for "
                               f"over {LOCK_TIMEOUT_S} s; wait for it or remove the stale lock") from None
        locks.append(lock)
    return locks


def compile_all(arts: list[KernelArtifacts], march: str, threads: int, retune: bool = False) -> int:
    """Compile what the cache lacks, in parallel compiler processes; returns the count.

    A kernel whose ``optimize_tiling`` names an intact winner is a cache hit: only
    that winner is needed, so nothing of it is compiled. ``retune`` ignores recorded
    winners (compiled candidates are still reused) so every kernel is timed again.
    """
    jobs = []
    for art in arts:
        art.winner = None if retune else _read_cached_winner(art)
        art.cache_hit = art.winner is not None
        if art.cache_hit:
            continue
        for tiling in art.candidates:
            so = art.kernel_dir(tiling) / "kernel.so"
            src = art.kernel_dir(tiling) / "kernel.cpp"
            write_atomic(src, art.sources[tiling.kernel_key])
            if not so.is_file():
                jobs.append((src, so, KERNEL_FLAGS, march))
        wrapper_src = art.directory / "wrapper.cpp"
        write_atomic(wrapper_src, art.wrapper_source)
        if not art.wrapper_path.is_file():
            jobs.append((wrapper_src, art.wrapper_path, WRAPPER_FLAGS + ["-ldl"], None))
    if threads <= 1:
        for job in jobs:
            compile_so(*job)
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            for future in [pool.submit(compile_so, *job) for job in jobs]:
                future.result()
    return len(jobs)


def save_winner(art: KernelArtifacts, winner: Tiling) -> None:
    """Record the chosen candidate in ``optimize_tiling`` and its timings (atomic)."""
    art.winner = winner
    write_atomic(art.timings_path, json.dumps([round(t, 3) for t in art.timings_us]))
    write_atomic(art.optimize_tiling_path, winner.optimize_tiling + "\n")
