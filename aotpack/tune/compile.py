"""Stage: compile every candidate of every kernel into its own static kernel (``compile_all``).

Compiles run in parallel compiler processes (``AOTPACK_COMPILE_THREADS``), across all
kernels at once, and only for what the cache (``aotpack.tune.cache``) lacks. A kernel whose
tuning record (``aotpack.tune.choice_cache``) names a winner among the same candidates is a
cache hit: only the winner is needed, so nothing else of it is compiled, and nothing is timed.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from aotpack import leftovers
from aotpack.archive import layout
from aotpack.tune import cache
from aotpack.tune.candidates import CandidateSet


@dataclass(frozen=True)
class CompiledSet:
    """Where one kernel's compiled candidates live.

    ``cached_choice``: (winner index, timings us, contended) recorded by an earlier build for the
    same candidates (``choice_cache``), or None when the kernel must be timed.
    """

    candidate_set: CandidateSet
    folder: cache.KernelFolder
    cached_choice: tuple | None

    def binary(self, index: int) -> Path:
        """The kernel binary of candidate ``index``."""
        return self.folder.static_kernel(self.candidate_set.candidates[index].kernel_key) / layout.LIB_KERNEL_NAME

    def source_file(self, index: int) -> Path:
        """The kernel source of candidate ``index``."""
        return self.folder.static_kernel(self.candidate_set.candidates[index].kernel_key) / layout.LIB_KERNEL_SOURCE_NAME


def kernel_folders(sets: dict[str, CandidateSet], backend, settings, toolchain) -> dict[str, cache.KernelFolder]:
    """The cache folder of each kernel (``<cache>/<backend>/<base name>/<artifact_hash>``)."""
    fingerprint = toolchain.fingerprint()
    return {kid: cache.KernelFolder(settings.cache_dir / backend.name / cs.kernel.base_name /
                                    cache.artifact_hash(kid, fingerprint, settings.device_limit,
                                                        [c.kernel_key for c in cs.candidates]))
            for kid, cs in sets.items()}


def binary_store(backend, settings, toolchain) -> cache.BinaryStore:
    """The backend's source-keyed binary store under the cache."""
    return cache.BinaryStore(settings.cache_dir / backend.name / "binaries", toolchain.fingerprint(),
                             backend.binary_suffix, backend.source_suffix)


def _jobs(compiled: CompiledSet, toolchain) -> list:
    """(compile function, source file, source text, output, shared in the binary store) of
    what the cache lacks.

    Every candidate binary present is checked against its record, needed or not: the
    wrapper loads each one it finds, and a damaged file must be quarantined first.
    """
    cs = compiled.candidate_set
    needed = {compiled.cached_choice[0]} if compiled.cached_choice else set(range(len(cs.candidates)))
    jobs = []
    for i in range(len(cs.candidates)):
        current = cache.is_current(compiled.binary(i), compiled.source_file(i), cs.sources[i])
        if i in needed and not current:
            jobs.append((toolchain.compile_kernel, compiled.source_file(i), cs.sources[i], compiled.binary(i), True))
    # the Python-mode run launches through the PGO wrapper, also on a cache hit
    folder = compiled.folder
    if not cache.is_current(folder.wrapper, folder.wrapper_source, cs.wrapper_source):
        jobs.append((toolchain.compile_wrapper, folder.wrapper_source, cs.wrapper_source, folder.wrapper, False))
    return jobs


def run_parallel(jobs: list, store: cache.BinaryStore, threads: int, on_done=None) -> int:
    """Provide every job's binary, compiling in up to ``threads`` processes; returns the
    number of compiler runs. The first error is raised. ``on_done(done, total)`` is called
    as jobs finish."""
    done = 0

    def finished(ran: bool) -> bool:
        nonlocal done
        done += 1
        if on_done:
            on_done(done, len(jobs))
        return ran

    def run(job) -> bool:
        compile_fn, source_file, source, output, shared = job
        if shared:
            return store.provide(source, output, source_file, compile_fn)
        # a wrapper holds per-process state (its loaded kernels): never share its file,
        # or dlopen would hand one kernel's wrapper to another
        leftovers.remove_dead(output.parent)
        cache.write_atomic(source_file, source)
        compile_fn(source_file, output)
        cache.record(output)
        return True

    if on_done:
        on_done(0, len(jobs))
    first, repeats = _split_repeats(jobs, store)
    if threads <= 1:
        ran = sum(finished(run(job)) for job in first)
    else:
        pool = ThreadPoolExecutor(max_workers=threads)
        try:
            ran = sum(finished(future.result()) for future in [pool.submit(run, job) for job in first])
        except BaseException:  # an error or Ctrl-C: start no further compiles
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        finally:
            pool.shutdown(wait=True)
    return ran + sum(finished(run(job)) for job in repeats)  # links to binaries just compiled


def _split_repeats(jobs: list, store: cache.BinaryStore) -> tuple[list, list]:
    """(jobs with a source of their own, jobs whose shared binary an earlier job provides):
    candidates sharing a binary (``Backend.share_binaries``) or kernels with equal sources
    compile once, not once per thread that happens to start them together."""
    first, repeats, seen = [], [], set()
    for job in jobs:
        _, _, source, _, shared = job
        key = store.path(source) if shared else None
        if key is not None and key in seen:
            repeats.append(job)
            continue
        seen.add(key)
        first.append(job)
    return first, repeats


def compile_all(sets: dict[str, CandidateSet], folders: dict[str, cache.KernelFolder], toolchain,
                store: cache.BinaryStore, settings, on_done=None,
                recorded: dict | None = None) -> tuple[dict[str, CompiledSet], int]:
    """Compile what the cache lacks; returns (``kernel_id -> CompiledSet``, compile count).

    Call with the kernels' ``compile.lock``s held (``cache.locked``). ``recorded``: choice id
    -> ``replay.RecordedWinner`` from the tuning records (``choice_cache.read_all``); a kernel
    whose recorded winner is one of its candidates needs only that one. ``settings.retune``
    ignores them (compiled candidates are still reused).

    Raises:
        AotpackError: a compiler failure, naming the source file.
    """
    temp_root = getattr(toolchain, "temp_root", None)
    if temp_root is not None:  # compiler temp folders of killed builds, also when nothing compiles
        leftovers.remove_dead(temp_root, "aotpack-cc-*")
    compiled = {}
    for kid, cs in sets.items():
        folder = folders[kid]
        for path in [folder.path, *(folder.static_kernel(c.kernel_key) for c in cs.candidates)]:
            leftovers.remove_dead(path)  # temp files of killed builds
        found = None if settings.retune else (recorded or {}).get(kid)
        index = cs.pick(found.candidate) if found else None
        compiled[kid] = CompiledSet(cs, folder, None if index is None else (index, found.timings_us, found.contended))
    jobs = [job for c in compiled.values() for job in _jobs(c, toolchain)]
    return compiled, run_parallel(jobs, store, settings.compile_threads, on_done)


def shipped_wrappers(compiled: dict[str, CompiledSet]) -> dict[str, tuple[Path, str]]:
    """Each kernel's wrapper for the archive: its PGO wrapper as it is.

    The wrapper maps every candidate's ``kernel_key`` to its TilingInfo and loads the static
    kernels it finds; the archive holds only the winner's kernel binary, and the model source names the
    winner's ``kernel_key`` and calls ``release`` keeping it. So the wrapper PGO launched through
    ships unchanged, with no second compile per tuned kernel (docs/measurements.md, "The PGO
    wrapper ships").

    Returns:
        ``kernel_id -> (wrapper binary path, wrapper source)``.
    """
    return {kid: (c.folder.wrapper, c.candidate_set.wrapper_source) for kid, c in compiled.items()}
