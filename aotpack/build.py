"""``aotpack build``: run every pipeline stage in order and write the archive.

model file -> export -> lower/fuse -> TopN tilings -> compile candidates ->
Python-mode run + PGO autotune -> CppWrapper codegen -> model.so -> archive.
"""
from __future__ import annotations

import copy
import logging
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import safetensors.torch
import torch
from torch.utils._pytree import tree_flatten_with_path, tree_leaves

import aotpack
from aotpack import autotune, compile as compile_stage, cpp_wrapper, package, parity, runtime, signing, verify
from aotpack.config import Settings
from aotpack.errors import AotpackError
from aotpack.export import check_version, export_model, load_model_file
from aotpack.lowering import lower

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


def _signature(buffers, names) -> list[dict]:
    return [{"name": n, "dtype": str(b.dtype).removeprefix("torch."), "shape": list(b.shape),
             "strides": list(b.strides)} for n, b in zip(names, buffers)]


def _output_signature(graph, names: list[str]) -> list[dict]:
    return [{"name": name, "dtype": str(base.dtype).removeprefix("torch."),
             "shape": list(sizes), "strides": list(strides)}
            for name, (base, sizes, strides, _) in zip(names, graph.outputs)]


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


def _kernel_entries(arts) -> tuple[list[dict], dict[str, bytes]]:
    entries, files = [], {}
    for art in arts:
        lit = cpp_wrapper.kernel_literal(art)
        win = art.winner
        entries.append({
            "name": art.kernel.name, "kernel_key": win.kernel_key, "tiling_repr": win.repr,
            "workspace": win.workspace, "block_dim": win.block_dim, "candidates": len(art.candidates),
            "candidate_tilings": [t.repr for t in art.candidates],
            "timings_us": [round(t, 3) for t in art.timings_us], "visited": art.visited,
            "lib_kernel": lit.lib_kernel, "wrapper": lit.wrapper,
        })
        kernel_dir = art.kernel_dir(win)
        files[lit.lib_kernel] = (kernel_dir / "kernel.so").read_bytes()
        files[lit.lib_kernel.replace("kernel.so", "kernel.cpp")] = (kernel_dir / "kernel.cpp").read_bytes()
        files[lit.wrapper] = art.wrapper_path.read_bytes()
        files[f"{lit.kernel_dir}/wrapper.cpp"] = (art.directory / "wrapper.cpp").read_bytes()
        files[f"{lit.kernel_dir}/optimize_tiling"] = (win.optimize_tiling + "\n").encode()
    return entries, files


def _dump_debug(debug_dir: Path, name: str, arts, model_source: str) -> None:
    """Copy every generated source (all candidates, wrappers, model.cpp) for inspection."""
    root = Path(debug_dir) / name
    for art in arts:
        folder = root / "kernels" / art.kernel.name
        for tiling in art.candidates:
            target = folder / "static_kernel" / tiling.kernel_key / "kernel.cpp"
            compile_stage.write_atomic(target, art.sources[tiling.kernel_key])
        compile_stage.write_atomic(folder / "wrapper.cpp", art.wrapper_source)
    compile_stage.write_atomic(root / "model.cpp", model_source)
    log.info("generated sources copied to %s", root)


def _native_check(archive: Path, model_file, reference: list[torch.Tensor]) -> None:
    """Run the finished archive with the C++ runtime on the example inputs and compare
    with eager: the build's last word is about model.so, not only the Python-mode run.

    Raises:
        AotpackError: the native outputs differ from eager (an aotpack bug).
    """
    try:
        runtime.find_runtime()
    except AotpackError:
        log.warning("native runtime not built (make runtime): skipped running the archive before writing it")
        return
    with tempfile.TemporaryDirectory(prefix="aotpack-check-") as work:
        outputs, _ = runtime.run_tensors(archive, model_file.example_inputs, work)
    check = parity.compare(outputs, reference)
    if not check.ok:
        raise AotpackError(f"{model_file.path}: the archive's native run disagrees with eager PyTorch: "
                           f"{'; '.join(check.problems)}. This is an aotpack bug; please report it with "
                           "the model file")
    log.info("native runtime vs eager PyTorch: max abs error %.3g", check.max_abs_error)


def build(model_path: str | Path, out_dir: str | Path = "dist", name: str | None = None,
          version: str | None = None, settings: Settings | None = None,
          allow_mismatch: bool = False, selftest: bool = False,
          sign_key: str | Path | None = None) -> BuildResult:
    """Build ``<out_dir>/<name>-<version>.aotpack`` from a model file.

    The Python-mode run (the same compiled kernels and extern calls the archive runs)
    is checked against eager PyTorch on the example inputs (``aotpack.parity``). With
    ``selftest``, those inputs and eager outputs go into the archive for ``aotpack verify``.
    ``sign_key``: an Ed25519 private key (PEM) that signs the archive (``aotpack.signing``).

    Raises:
        AotpackError: any problem the user can fix (bad model file, export failure,
            unsupported construct, bad setting), or outputs that disagree with eager
            (unless ``allow_mismatch``); nothing is left in ``out_dir``.
    """
    settings = settings or Settings.from_env()
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    model_file = load_model_file(model_path)
    name = name or model_file.path.stem
    if not NAME_PATTERN.match(name):
        raise AotpackError(f"archive name {name!r} must start with a letter or digit and hold only "
                           "letters, digits, '_', '.' or '-'; choose one with --name")
    version = check_version((model_file.version or "0.1.0") if version is None else version)
    target = Path(out_dir) / f"{name}-{version}.aotpack"
    if sign_key is not None:
        signing.sign_bytes(b"", sign_key)  # an unusable key fails now, not after the compile

    ep = export_model(model_file)
    seconds["export"] = time.perf_counter() - start
    try:
        graph = lower(ep)
    except AotpackError as exc:
        raise AotpackError(f"{model_file.path}: {exc}") from None
    seconds["lower"] = time.perf_counter() - start - seconds["export"]
    log.info("lowered %s: %d fused kernels, %d steps", name, len(graph.kernels), len(graph.steps))

    isa = compile_stage.target_isa(settings.march)
    arts, art_of = compile_stage.prepare(graph.kernels, settings.topn, settings.device_limit,
                                         settings.march, settings.cache_dir)
    tic = time.perf_counter()
    locks = compile_stage.lock_all(arts)
    try:
        compiled = compile_stage.compile_all(arts, settings.march, settings.compile_threads,
                                             settings.retune)
        seconds["compile_kernels"] = time.perf_counter() - tic
        tic = time.perf_counter()
        outputs = autotune.run_python_mode(graph, art_of,
                                           [model_file.example_inputs, *model_file.calibration_inputs])
        autotune.finish_unvisited(arts)
        seconds["autotune"] = time.perf_counter() - tic
    finally:
        for lock in locks:
            lock.release()
    reference, output_names = _eager_reference(model_file)
    check = parity.compare(outputs, reference)
    log.info("compiled graph vs eager PyTorch: max abs error %.3g", check.max_abs_error)
    if not check.ok:
        message = (f"{model_file.path}: the compiled graph disagrees with eager PyTorch: "
                   f"{'; '.join(check.problems)}. This is an aotpack bug; please report it with the "
                   "model file")
        if not allow_mismatch:
            raise AotpackError(message + " (--allow-mismatch writes the archive anyway)")
        log.warning("%s", message)

    meta = {"name": name, "version": version, "aotpack_version": aotpack.__version__,
            "device_limit": settings.device_limit}
    source = cpp_wrapper.generate(graph, arts, art_of, meta)
    with tempfile.TemporaryDirectory(prefix="aotpack-model-") as work:
        model_so, seconds["compile_model_so"] = cpp_wrapper.compile_model(source, Path(work))
        files = {package.MODEL_LIBRARY: model_so.read_bytes(), package.MODEL_SOURCE: source.encode()}
    constants = {b.name: graph.constant_tensors[b.name] for b in graph.constants}
    files[package.WEIGHTS] = safetensors.torch.save(constants) if constants else safetensors.torch.save({})
    entries, kernel_files = _kernel_entries(arts)
    files.update(kernel_files)
    if selftest:
        files.update(verify.selftest_files(model_file.example_inputs, reference, output_names))
    manifest = {
        "format_version": package.FORMAT_VERSION, "name": name, "version": version,
        "aotpack_version": aotpack.__version__, "torch_version": torch.__version__.split("+")[0],
        "backend": "cpu", "target_isa": isa, "device_limit": settings.device_limit,
        "model": {"library": package.MODEL_LIBRARY, "source": package.MODEL_SOURCE,
                  "abi_version": cpp_wrapper.MODEL_ABI_VERSION},
        "constants": _signature(graph.constants, [b.name for b in graph.constants]),
        "inputs": _signature(graph.inputs, [b.name for b in graph.inputs]),
        "outputs": _output_signature(graph, output_names),
        "mutated_buffers": graph.mutated_buffers,
        "mutated_inputs": graph.mutated_inputs,
        "kernels": entries,
    }
    if selftest:
        manifest["selftest"] = {"inputs": verify.SELFTEST_INPUTS, "outputs": verify.SELFTEST_OUTPUTS,
                                "atol": parity.ATOL, "rtol": parity.RTOL}
    tic = time.perf_counter()
    package.write_archive(target, manifest, files, sign_key=sign_key,
                          before_publish=lambda archive: _native_check(archive, model_file, reference))
    seconds["package_and_native_check"] = time.perf_counter() - tic
    if settings.debug_dir:
        _dump_debug(settings.debug_dir, name, arts, source)
    seconds["total"] = time.perf_counter() - start
    log.info("wrote %s (%d kernels, %d compiled, %.1f s)", target, len(arts), compiled, seconds["total"])
    return BuildResult(target, manifest, seconds, check.max_abs_error, compiled)
