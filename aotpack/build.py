"""``aotpack build``: run every pipeline stage in order and write the archive.

model file -> export -> lower/fuse (``lowering``) -> TopN candidates (``candidates``) ->
compile (``compile``) -> Python-mode run + PGO autotune (``autotune``) -> CppWrapper
codegen (``codegen``) -> model library -> archive (``package``). Each stage returns an
immutable result that the next one reads; device specifics come from the backend.
"""
from __future__ import annotations

import copy
import logging
import os
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils._pytree import tree_flatten_with_path, tree_leaves

import aotpack
from aotpack import backends
from aotpack.tune import autotune
from aotpack.tune import cache
from aotpack.tune import candidates
from aotpack.codegen import wrapper as codegen
from aotpack.tune import compile as compile_stage
from aotpack.archive import layout
from aotpack.archive import writer as package
from aotpack import leftovers
from aotpack.commands import debug_artifacts
from aotpack.ir import gemm
from aotpack.tune import choice_cache
from aotpack.runtime import parity
from aotpack.tune import replay
from aotpack.runtime import native as runtime
from aotpack.archive import signing
from aotpack.commands import verify
from aotpack.archive import weights
from aotpack.config import Settings
from aotpack.errors import AotpackError
from aotpack.frontend.export import check_version, export_model, load_model
from aotpack.lower.lowering import lower
from aotpack.commands.progress import BuildProgress

log = logging.getLogger("aotpack")

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class BuildResult:
    """What a build produced, with its timings in seconds."""

    archive: Path
    manifest: dict
    seconds: dict = field(default_factory=dict)
    max_abs_error: float = 0.0
    compiled: int = 0


def _output_names(structure) -> list[str]:
    """Names of the flattened outputs: dict keys where forward returns a dict
    (``logits``, ``aux.0``), else ``output_<i>`` in flattening order."""
    names = []
    for i, (path, leaf) in enumerate(tree_flatten_with_path(structure)[0]):
        keys = [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]
        has_key = any(hasattr(k, "key") for k in path)
        names.append(".".join(keys) if has_key else f"output_{i}")
    return names if len(set(names)) == len(names) else [f"output_{i}" for i in range(len(names))]


def _eager_reference(model_file) -> tuple[list[torch.Tensor], list[str]]:
    """Eager outputs (flattened) on copies of the example inputs, and their names."""
    module = copy.deepcopy(model_file.module).eval()
    with torch.no_grad():
        out = module(*[t.clone() for t in model_file.example_inputs])
    return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)], _output_names(out)


def _kernel_files(compiled: dict, choices: dict, shipped: dict) -> dict[str, bytes]:
    """Archive entries of every kernel: the winner's binary and source, the shipped
    wrapper and its source, and ``optimize_tiling``."""
    files = {}
    for kid, c in compiled.items():
        name, index = c.candidate_set.kernel.name, choices[kid].index
        winner = c.candidate_set.candidates[index]
        wrapper, wrapper_source = shipped[kid]
        files[layout.lib_kernel_path(name, winner.kernel_key)] = cache.verified_bytes(c.binary(index))
        files[layout.lib_kernel_source_path(name, winner.kernel_key)] = c.candidate_set.sources[index].encode()
        files[layout.wrapper_path(name)] = cache.verified_bytes(wrapper)
        files[layout.wrapper_source_path(name)] = wrapper_source.encode()
        files[layout.optimize_tiling_path(name)] = (winner.optimize_tiling + "\n").encode()
    return files


def _native_check(archive: Path, model_file, reference: list[torch.Tensor]) -> None:
    """Run the finished archive in-process (aotpack.load) on the example inputs and compare
    with eager: the build's last word is about the model library, not only the Python-mode run.

    Raises:
        AotpackError: the native outputs differ from eager (an aotpack bug).
    """
    try:
        runtime.find_runtime_library()
    except AotpackError:
        log.warning("native runtime not built (make runtime): skipped running the archive before writing it")
        return
    from aotpack.runtime.loader import load

    with load(archive, private_extraction=True) as model:  # no cache entry per build
        outputs = model.run(*[t.clone() for t in model_file.example_inputs])  # may write inputs
    check = parity.compare(outputs, reference)
    if not check.ok:
        raise AotpackError(f"{model_file.path}: the archive's native run disagrees with eager PyTorch: "
                           f"{'; '.join(check.problems)}. This is an aotpack bug; please report it with "
                           "the model file")
    log.info("native runtime vs eager PyTorch: max abs error %.3g", check.max_abs_error)


def _check_parity(model_file, outputs: list[torch.Tensor], reference: list[torch.Tensor],
                  allow_mismatch: bool) -> parity.Parity:
    """The Python-mode run's outputs against eager PyTorch's.

    Raises:
        AotpackError: they disagree (an aotpack bug), unless ``allow_mismatch`` (then a warning).
    """
    check = parity.compare(outputs, reference)
    log.info("compiled graph vs eager PyTorch: max abs error %.3g", check.max_abs_error)
    if not check.ok:
        message = (f"{model_file.path}: the compiled graph disagrees with eager PyTorch: "
                   f"{'; '.join(check.problems)}. This is an aotpack bug; please report it with the "
                   "model file")
        if not allow_mismatch:
            raise AotpackError(message + " (--allow-mismatch writes the archive anyway)")
        log.warning("%s", message)
    return check


def _check_output_dir(out_dir: Path) -> None:
    """Fail before any compile when the archive could not be written into ``out_dir``
    (which is created only when the archive is written).

    Raises:
        AotpackError: it is a file, or it (or the folder it would be created in) is not writable.
    """
    if out_dir.exists():
        if not out_dir.is_dir():
            raise AotpackError(f"output folder {out_dir} is a file, not a folder; choose another with -o")
        if not os.access(out_dir, os.W_OK | os.X_OK):
            raise AotpackError(f"output folder {out_dir} is not writable; choose another with -o")
        return
    parent = next(p for p in out_dir.absolute().parents if p.exists())
    if not parent.is_dir():
        raise AotpackError(f"cannot create output folder {out_dir}: {parent} is a file; choose another with -o")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise AotpackError(f"cannot create output folder {out_dir}: {parent} is not writable; choose "
                           "another with -o")


def _check_coverage(settings, model_file, sets: dict, choices: dict) -> None:
    """``--require-coverage``: every kernel must be reached by the example or calibration inputs.

    Raises:
        AotpackError: naming every kernel left unvisited.
    """
    unvisited = [cs.kernel.name for kid, cs in sets.items() if not choices[kid].visited]
    if settings.require_coverage and unvisited:
        raise AotpackError(f"{model_file.path}: --require-coverage: {len(unvisited)} kernel(s) not reached by the "
                           f"example and calibration inputs: {', '.join(unvisited)}; add calibration_inputs() "
                           "that take those paths (e.g. both torch.cond branches), or drop --require-coverage")


def build(model_path: str | Path, out_dir: str | Path = "dist", name: str | None = None,
          version: str | None = None, settings: Settings | None = None,
          allow_mismatch: bool = False, selftest: bool = False,
          inputs_path: str | Path | None = None, sign_key: str | Path | None = None,
          progress: BuildProgress | None = None) -> BuildResult:
    """Build ``<out_dir>/<name>-<version>.aotpack`` from a model file, or from a ``.pt2``
    exported program with ``inputs_path`` (a torch.save'd tuple of example inputs, or a
    list of tuples: example set, then calibration sets). ``sign_key``: an Ed25519 private
    key (PEM) that signs the archive's manifest.

    The Python-mode run (the same compiled kernels and extern calls the archive runs)
    is checked against eager PyTorch on the example inputs (``aotpack.runtime.parity``). With
    ``selftest``, those inputs and eager outputs go into the archive for ``aotpack verify``.
    ``sign_key``: an Ed25519 private key (PEM) that signs the archive (``aotpack.archive.signing``).

    Raises:
        AotpackError: any problem the user can fix (bad model file, export failure,
            unsupported construct, bad setting), or outputs that disagree with eager
            (unless ``allow_mismatch``); nothing is left in ``out_dir``.
    """
    settings = settings or Settings.from_env()
    progress = progress or BuildProgress()
    start = time.perf_counter()
    model_file = load_model(model_path, inputs_path)
    name = name or model_file.path.stem
    if not NAME_PATTERN.match(name):
        raise AotpackError(f"archive name {name!r} must start with a letter or digit and hold only "
                           "letters, digits, '_', '.' or '-'; choose one with --name")
    version = check_version((model_file.version or "0.1.0") if version is None else version)
    archive = Path(out_dir) / f"{name}-{version}.aotpack"
    _check_output_dir(Path(out_dir))
    leftovers.clean_tmpdir()
    backend = backends.get(settings.backend)
    if sign_key is not None:
        signing.sign_bytes(b"", sign_key)  # an unusable key fails now, not after the compile
    replayed = replay.recorded_winners(settings.tuning_from) if settings.tuning_from else None

    with progress.phase("export", f"exporting {model_file.path.name} (torch.export)"):
        ep = export_model(model_file, settings.debug_dir)
    with progress.phase("lower", "lowering and fusing"):
        try:
            graph = lower(ep, backend)
        except AotpackError as exc:
            raise AotpackError(f"{model_file.path}: {exc}") from None
    choice_steps = len(gemm.gemm_steps(graph))
    # Counted before PGO picks each GEMM/conv step's implementation: the kernels of every
    # template variant are in it; the final line counts what the archive launches.
    log.info("lowered %s: %d fused kernel launches of %d distinct kernels (counting every candidate "
             "implementation of %d GEMM/conv steps), %d extern calls", name, len(graph.kernels),
             len(graph.distinct_kernels()), choice_steps, len(graph.extern_calls()))

    toolchain = backend.toolchain(settings)
    target = backend.target(settings)
    sets = candidates.prepare(graph, backend, settings, replayed)
    folders = compile_stage.kernel_folders(sets, backend, settings, toolchain)
    store = compile_stage.binary_store(backend, settings, toolchain)
    steps = gemm.gemm_steps(graph)
    points = [*sets.values(), *steps]  # every choice point: kernels' tilings, steps' implementations
    records = settings.cache_dir / backend.name / "choices"
    versions = choice_cache.kernel_versions(sets, toolchain.fingerprint())
    with autotune.extern_threads(backend, settings.device_limit):
        device_key = backend.device().tuning_key(settings.device_limit)  # the thread count PGO times with
    with cache.locked([f.path for f in folders.values()]):
        recorded = {} if settings.retune else choice_cache.read_all(records, points, device_key, versions)
        with progress.phase("compile_kernels", "compiling candidates"):
            compiled, compiled_count = compile_stage.compile_all(
                sets, folders, toolchain, store, settings,
                lambda done, total: progress.count(done, total, "candidates compiled"), recorded)
        with progress.phase("autotune", "autotuning on the real inputs (PGO)"), \
                autotune.extern_threads(backend, settings.device_limit):
            captured = {} if settings.debug_dir else None
            choices, outputs = autotune.tune(
                graph, compiled, [model_file.example_inputs, *model_file.calibration_inputs], backend,
                on_tuned=lambda done, total: progress.count(done, total, "kernels tuned"), captured=captured,
                recorded={**recorded, **(replayed or {})})
            choice_cache.write_all(records, points, choices, device_key, versions)
        graph = gemm.resolve(graph, choices)  # each GEMM step's winner; only the kernels it launches
        used = {k.kernel_id for k in graph.kernels}
        sets = {kid: cs for kid, cs in sets.items() if kid in used}
        compiled = {kid: c for kid, c in compiled.items() if kid in used}
        _check_coverage(settings, model_file, sets, choices)
        meta = {"name": name, "version": version, "aotpack_version": aotpack.__version__,
                "device_limit": settings.device_limit}
        source = codegen.generate(graph, backend, sets, choices, meta)
        # the model library compiles beside the eager check, unless compiles run one at a time
        # (AOTPACK_COMPILE_THREADS=1)
        with progress.phase("compile_model_so", f"compiling {layout.MODEL_LIBRARY_PATH}"), \
                tempfile.TemporaryDirectory(prefix=leftovers.temp_prefix("model")) as work, \
                ThreadPoolExecutor(max_workers=1) as background:
            beside = settings.compile_threads > 1
            model_so = background.submit(backend.compile_model, source, Path(work), settings) if beside else None
            reference, output_names = _eager_reference(model_file)
            check = _check_parity(model_file, outputs, reference, allow_mismatch)
            library = model_so.result()[0] if beside else backend.compile_model(source, Path(work), settings)[0]
            files = {layout.MODEL_LIBRARY_PATH: cache.verified_bytes(library),
                     layout.MODEL_SOURCE_PATH: source.encode(), layout.KERNEL_IR_PATH: graph.dump().encode()}
    seconds = progress.seconds
    stored = weights.plan(graph)  # each tied or repeated weight once, the rest as aliases
    files[layout.WEIGHTS_PATH] = stored.safetensors_bytes()
    files.update(_kernel_files(compiled, choices, compile_stage.shipped_wrappers(compiled)))
    if selftest:
        files.update(verify.selftest_files(model_file.example_inputs, reference, output_names))
    manifest = package.manifest(
        name=name, version=version, backend=backend, target=target, settings=settings, graph=graph,
        output_names=output_names, kernels=package.kernel_entries(sets, choices), weight_aliases=stored.aliases,
        choices=package.choice_entries([*sets.values(), *steps], choices))
    if replayed is not None:
        manifest["tuning_from"] = {"archive": Path(settings.tuning_from).name,
                                   "replayed": sum(1 for kid in sets if kid in replayed)}
    if selftest:
        manifest["selftest"] = {"inputs": layout.SELFTEST_INPUTS_PATH, "outputs": layout.SELFTEST_OUTPUTS_PATH,
                                "atol": parity.ATOL, "rtol": parity.RTOL}
    with progress.phase("package_and_native_check", "writing the archive and running it natively"):
        package.write_archive(archive, manifest, files, sign_key=sign_key,
                              before_publish=lambda archive: _native_check(archive, model_file, reference))
    if settings.debug_dir:
        folder = debug_artifacts.write(settings.debug_dir, name, graph, compiled, toolchain, backend.name,
                                       captured, source)
        log.info("sources, compile scripts, kernel inputs and benchmark.py per kernel written to %s", folder)
    seconds["total"] = time.perf_counter() - start
    log.info("wrote %s (%d fused kernel launches of %d distinct kernels, %d compiled, %.1f s)", archive,
             len(graph.kernels), len(sets), compiled_count, seconds["total"])
    return BuildResult(archive, manifest, seconds, check.max_abs_error, compiled_count)
