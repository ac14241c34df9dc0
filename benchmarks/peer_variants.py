"""The five ways benchmarks/peers.py runs a model: eager PyTorch, AOTInductor, ONNX
Runtime, OpenVINO and aotpack. Each variant builds an artifact once per model
(``build``) and loads it once per thread count (``load``) into a callable that takes the
example input tensors and returns a list of output tensors or arrays.

A build or load failure raises; the driver records its one-line message in the table.
AOTInductor and aotpack build in a fresh child process each (``child_process = True``),
with fresh caches, so their build times are cold; their reported time is measured inside
that process (interpreter start-up and imports excluded, as for ONNX export and OpenVINO
conversion in-process). The driver runs those two children concurrently with each other
and with the in-process conversions (the wall time of the whole benchmark matters on a
small machine), so each build time includes that contention.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
#: Build children run at lower priority (the machine is shared; timing runs are not niced,
#: so a second thread is not starved of its time slice mid-run).
BUILD_NICENESS = 10


class VariantError(Exception):
    """A variant could not build or load a model; the message is one line for the table."""


def _child(script: str, args: list[str], env: dict, what: str, timeout: float) -> dict:
    """Run ``script`` in a fresh interpreter; it prints one JSON object as its last line."""
    try:
        done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                              env=env, timeout=timeout, cwd=REPO, preexec_fn=lambda: os.nice(BUILD_NICENESS))
    except subprocess.TimeoutExpired:
        raise VariantError(f"{what} took longer than {timeout:.0f} s") from None
    lines = done.stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
        raise VariantError(f"{what} crashed (exit {done.returncode}): {tail[-1] if tail else 'no output'}") from None
    if report.get("error"):
        raise VariantError(report["error"])
    return report


def _size(*paths: Path) -> int:
    return sum(p.stat().st_size for p in paths if p.exists())


def _numpy_inputs(inputs) -> list[np.ndarray]:
    return [t.detach().numpy() for t in inputs]


class Eager:
    """The model itself under ``torch.inference_mode`` (threads: torch.set_num_threads)."""

    name = "eager"

    def build(self, model_path: Path, module, inputs, work: Path) -> dict:
        self.module = module
        return {"build_s": None, "size_bytes": None}

    def load(self, threads: int):
        module = self.module

        def run(*args):
            with torch.inference_mode():
                return module(*args)
        return run


#: Run before each build's clock starts, in every builder's process: the first torch.export
#: of a process imports TorchDynamo and friends (~1.1 s here). The in-process ONNX exports pay
#: that once for the whole run, so the child-process builders (AOTInductor, aotpack) start
#: warm too, and every build time counts only that model's work.
WARM_EXPORT = "torch.export.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),))"


def warm_torch_export() -> None:
    """``WARM_EXPORT`` in this process (before the in-process conversions)."""
    exec(WARM_EXPORT, {"torch": torch})


AOTI_SCRIPT = r"""
import json, sys, time, traceback
try:
    sys.path.insert(0, sys.argv[3])
    import torch
    from aotpack.frontend.export import load_model_file
    WARM_EXPORT
    start = time.perf_counter()
    mf = load_model_file(sys.argv[1])
    with torch.no_grad():
        ep = torch.export.export(mf.module.eval(), tuple(mf.example_inputs))
        torch._inductor.aoti_compile_and_package(ep, package_path=sys.argv[2])
    print(json.dumps({"build_s": time.perf_counter() - start}))
except BaseException as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: " + " ".join(str(exc).split())[:400]}))
""".replace("WARM_EXPORT", WARM_EXPORT)


class AOTInductor:
    """``torch._inductor.aoti_compile_and_package`` of the exported program (child process,
    fresh TORCHINDUCTOR_CACHE_DIR), run by ``aoti_load_package`` (threads:
    torch.set_num_threads, which its OpenMP kernels follow)."""

    name = "aoti"
    child_process = True

    def build(self, model_path: Path, module, inputs, work: Path) -> dict:
        self.package = work / "model.pt2"
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(work / "inductor-cache"))
        report = _child(AOTI_SCRIPT, [str(model_path), str(self.package), str(REPO)], env,
                        "AOTInductor compile", timeout=1200)
        return {"build_s": report["build_s"], "size_bytes": _size(self.package)}

    def load(self, threads: int):
        runner = torch._inductor.aoti_load_package(str(self.package))

        def run(*args):
            with torch.inference_mode():
                return runner(*args)
        return run


class OnnxRuntime:
    """``torch.onnx.export(dynamo=True)`` to a .onnx file, run by a default CPU
    InferenceSession with ``intra_op_num_threads``."""

    name = "onnxruntime"

    def build(self, model_path: Path, module, inputs, work: Path) -> dict:
        import warnings

        self.path = work / "model.onnx"
        start = time.perf_counter()
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(module, tuple(inputs), dynamo=True, verbose=False)
            program.save(str(self.path))
        seconds = time.perf_counter() - start
        return {"build_s": seconds, "size_bytes": _size(self.path, Path(str(self.path) + ".data"))}

    def load(self, threads: int):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]

        def run(*args):
            return session.run(None, dict(zip(names, _numpy_inputs(args))))
        return run


class OpenVINO:
    """``openvino.convert_model`` of the module (TorchScript tracing; where that fails, of its
    torch.export program), saved as IR without fp16 weight compression, compiled
    for "CPU" with f32 inference precision, the LATENCY hint and INFERENCE_NUM_THREADS."""

    name = "openvino"

    def build(self, model_path: Path, module, inputs, work: Path) -> dict:
        import openvino as ov

        self.xml = work / "model.xml"
        start = time.perf_counter()
        with torch.no_grad():
            try:
                converted = ov.convert_model(module, example_input=tuple(inputs))
            except Exception as traced_error:  # TorchScript tracing failed: try the exported program
                try:
                    converted = ov.convert_model(torch.export.export(module, tuple(inputs)))
                except Exception:
                    raise traced_error from None
        ov.save_model(converted, str(self.xml), compress_to_fp16=False)
        seconds = time.perf_counter() - start
        return {"build_s": seconds, "size_bytes": _size(self.xml, self.xml.with_suffix(".bin"))}

    def load(self, threads: int):
        import openvino as ov

        core = ov.Core()
        compiled = core.compile_model(str(self.xml), "CPU", {
            "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_NUM_THREADS": threads})
        request = compiled.create_infer_request()
        outputs = compiled.outputs

        def run(*args):
            result = request.infer(_numpy_inputs(args))
            return [result[o] for o in outputs]
        return run


AOTPACK_SCRIPT = r"""
import json, logging, sys
logging.basicConfig(level=logging.WARNING)
try:
    sys.path.insert(0, sys.argv[4])
    from aotpack.build import build
    from aotpack.config import Settings
    from aotpack.errors import AotpackError
    settings = Settings.from_env(topn=sys.argv[3])
    import torch
    WARM_EXPORT
    result = build(sys.argv[1], sys.argv[2], settings=settings)
    seconds = dict(result.seconds)
    try:  # the same build again on the now warm cache (a cache hit: nothing compiled or timed)
        seconds["warm_rebuild"] = build(sys.argv[1], sys.argv[2] + "-warm", settings=settings).seconds["total"]
    except Exception:  # the cold build stands; the table shows no warm time
        seconds["warm_rebuild"] = None
    # one archive tuned for each smaller thread count the benchmark runs at (--device-limit N)
    archives = {}
    for limit in filter(None, sys.argv[5].split(",")):
        tuned = Settings.from_env(topn=sys.argv[3], device_limit=limit)
        archives[limit] = str(build(sys.argv[1], f"{sys.argv[2]}-limit{limit}", settings=tuned).archive)
    print(json.dumps({"archive": str(result.archive), "seconds": seconds, "archives": archives}))
except AotpackError as exc:
    print(json.dumps({"error": " ".join(str(exc).split())}))
except BaseException as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: " + " ".join(str(exc).split())[:400]}))
""".replace("WARM_EXPORT", WARM_EXPORT)


class Aotpack:
    """``aotpack.build`` in a child process with a private, empty kernel cache, run
    in-process by ``aotpack.load(path, device_limit=threads)``. The child builds twice:
    the cold build is the variant's build time, the second one (phase ``warm_rebuild``)
    shows a rebuild on the warm cache. PGO tunes for the build's device limit (all cores
    by default), so for each smaller thread count in ``tuned_limits`` the child also builds
    the archive a user deploying on that many cores would, with ``--device-limit N`` (on
    the warm cache: only the candidates whose block_dim differs are compiled), and
    ``load(N)`` runs that one."""

    name = "aotpack"
    child_process = True

    def __init__(self, topn: int = 1, tuned_limits: tuple = ()):
        self.topn = topn
        self.tuned_limits = tuple(tuned_limits)
        self.tuned_archives: dict[int, Path] = {}

    def build(self, model_path: Path, module, inputs, work: Path) -> dict:
        env = dict(os.environ, AOTPACK_CACHE_DIR=str(work / "aotpack-cache"))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        limits = ",".join(str(n) for n in self.tuned_limits)
        report = _child(AOTPACK_SCRIPT, [str(model_path), str(work / "dist"), str(self.topn), str(REPO), limits],
                        env, "aotpack build", timeout=1800)
        self.archive = Path(report["archive"])
        self.tuned_archives = {int(n): Path(path) for n, path in report.get("archives", {}).items()}
        seconds = dict(report["seconds"])
        return {"build_s": seconds.get("total"), "size_bytes": _size(self.archive), "phases": seconds}

    def load(self, threads: int):
        import aotpack

        model = aotpack.load(self.tuned_archives.get(threads, self.archive), device_limit=threads)
        return model


def all_variants(topn: int = 1, threads: tuple = ()) -> list:
    """One fresh instance of each variant, in table order; aotpack also builds an archive
    tuned for each of ``threads`` below this machine's core count."""
    from aotpack.config import available_cores

    smaller = tuple(sorted(n for n in set(threads) if n < available_cores()))
    return [Eager(), AOTInductor(), OnnxRuntime(), OpenVINO(), Aotpack(topn, smaller)]
