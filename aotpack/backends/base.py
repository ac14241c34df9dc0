"""What a backend provides: the seam between the generic pipeline and a device.

The pipeline (export -> lower -> candidates -> compile -> tune -> codegen -> package)
knows kernels only as ``kernel_ir.FusedKernel`` and candidates only as the triple
``(tiling_repr, workspace, block_dim)``. Everything device-specific lives in one
folder ``aotpack/backends/<name>/`` behind ``Backend``:

* ``solve`` – the tiling solver: TopN candidates per kernel, the default first;
* ``render_kernel`` / ``render_wrapper`` – kernel IR + tiling -> source text;
* ``toolchain`` – compiles sources, and says what goes into cache keys;
* ``load_wrapper`` – a launcher for PGO in the build process (launch, synchronize);
* ``generate_model`` / ``compile_model`` – the CppWrapper: host code with the winners
  baked in;
* ``target`` – the target description recorded in the manifest, ``check_target`` its
  schema when an archive is read;
* ``device`` – the ``Device``: compute units, tuning buffers, synchronize, the noise
  probes that timing reads, the key of device state that changes timings;
* ``gemm_variants`` – the implementations offered for a matched linear or convolution;
* ``recompute_budget`` – how much work lowering may recompute instead of buffering;
* ``binary_suffix`` / ``source_suffix`` / ``check_binary`` – its binaries' file names and
  their content check before loading.
* ``target`` – the target description recorded in the manifest;
* ``template_dir`` – the backend's own Jinja template folder (``codegen.render.render_from``).

A backend is registered by name in ``aotpack.backends`` (``--backend NAME``).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import time
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch


def kernel_key(tiling_repr: str, workspace: int, block_dim: int) -> str:
    """``md5(f"{tiling_repr}|{workspace}|{block_dim}")`` as 32 hex digits (the static kernel's id)."""
    return hashlib.md5(f"{tiling_repr}|{workspace}|{block_dim}".encode()).hexdigest()


class Candidate:
    """One tiling of a kernel; a backend's own tiling class derives from it.

    Subclasses provide ``tiling_repr`` (canonical text of every knob: equal tilings give
    equal text), ``workspace`` (scratch bytes the kernel needs, allocated by the runtime)
    and ``block_dim`` (parallel blocks: CPU threads, NPU AI cores).
    """

    tiling_repr: str
    workspace: int
    block_dim: int

    @property
    def kernel_key(self) -> str:
        """``md5(tiling_repr|workspace|block_dim)``."""
        return kernel_key(self.tiling_repr, self.workspace, self.block_dim)

    @property
    def optimize_tiling(self) -> str:
        """Content of the ``optimize_tiling`` file: ``tiling_repr|workspace|block_dim``."""
        return f"{self.tiling_repr}|{self.workspace}|{self.block_dim}"


@dataclass(frozen=True)
class Limits:
    """Resources kernels may use. device_limit: CPU cores or NPU AI cores (>= 1);
    vector_bytes: the widest vector register a template may compute in (bytes: 16 SSE,
    32 AVX2, 64 AVX-512 on the CPU), offered to the solvers as a tiling knob."""

    device_limit: int
    vector_bytes: int = 32


class WallClockProbe:
    """Run-queue wait estimated as wall time minus this thread's CPU time (ns, monotonic):
    sees the launching thread preempted, not a late worker. Any device's fallback."""

    def open(self) -> None:
        """Nothing to open."""

    def read(self) -> int:
        """Wait so far (ns)."""
        return time.perf_counter_ns() - time.thread_time_ns()

    def close(self) -> None:
        """Nothing to release."""


class Device:
    """The compute device a backend builds for and tunes on.

    Defaults describe a device without noise probes whose launches are synchronous; a
    backend overrides what its device has (``compute_units`` always).
    """

    def compute_units(self) -> int:
        """Compute units this process may use (>= 1): the ``device_limit`` default and bound."""
        raise NotImplementedError

    @contextlib.contextmanager
    def extern_parallelism(self, units: int) -> Iterator[None]:
        """Inside the block, extern (ATen) calls use at most ``units`` compute units, as the
        backend's kernels do; restored after, also on an error. Default: nothing to set."""
        yield

    def empty(self, shape: tuple, strides: tuple, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor of ``shape``/``strides`` (elements) and ``dtype`` where the
        device's kernels read and write during tuning."""
        return torch.empty_strided(shape, strides, dtype=dtype)

    def synchronize(self) -> None:
        """Wait until every launched extern call finished (a no-op where they are synchronous)."""

    def run_delay_probe(self):
        """A run-queue wait source (``open``/``read`` ns/``close``) for ``tune.timing``."""
        return WallClockProbe()

    def steal_ticks(self) -> int:
        """Clock ticks a hypervisor has stolen from this machine so far (0: not known)."""
        return 0

    def clock_ticks_per_s(self) -> int:
        """Ticks per second of ``steal_ticks``."""
        return 100

    def tuning_key(self, device_limit: int) -> tuple:
        """Strings naming the device state a recorded implementation timing depends on
        (cached GEMM-step winners are keyed on them)."""
        return (str(device_limit),)


class Toolchain(ABC):
    """Compiles generated sources into loadable binaries."""

    #: (optional) folder under the build cache where each compiler run gets its own TMPDIR
    #: (``leftovers.compiler_tmpdir``); None: compilers use the inherited TMPDIR.
    temp_root: Path | None = None

    @abstractmethod
    def fingerprint(self) -> str:
        """Everything besides the source that changes a binary (compiler, flags, target)."""

    @abstractmethod
    def compile_kernel(self, source: Path, output: Path) -> None:
        """Compile one static kernel. Raises ``AotpackError`` naming the source."""

    @abstractmethod
    def compile_wrapper(self, source: Path, output: Path) -> None:
        """Compile one kernel's wrapper. Raises ``AotpackError`` naming the source."""

    @abstractmethod
    def command(self, source: Path, output: Path, kind: str, source_text: str = "") -> list[str]:
        """The exact compile command of ``kind`` (``kernel``, ``wrapper``, ``model``);
        ``source_text``: the source's contents, where the flags depend on them."""


class Launcher(ABC):
    """A kernel's wrapper loaded in the build process, for the Python-mode run and PGO."""

    def arguments(self, tensors: list):
        """(optional) ``tensors`` packed once for repeated launches; default: the list itself."""
        return tensors

    @abstractmethod
    def launch(self, kernel_key: str, tensors: list) -> None:
        """Run candidate ``kernel_key`` on ``tensors`` (inputs, then outputs), as ``arguments`` packs them."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait until every launched kernel finished (a no-op where launches are synchronous)."""

    @abstractmethod
    def release(self, keep_kernel_key: str) -> None:
        """Unload every candidate but ``keep_kernel_key``."""


class Backend(ABC):
    """One device family. See the module docstring for the contract."""

    #: ``--backend`` name and the cache folder under ``AOTPACK_CACHE_DIR``.
    name: str
    #: dtypes the backend's fused kernels compute in (others run as extern calls).
    dtypes: frozenset
    #: version of the generated host library's ABI (recorded in the manifest).
    model_abi_version: int

    #: File suffixes of the backend's compiled binaries and of their sources (archive and
    #: cache file names: ``kernel<binary_suffix>``, ``model<source_suffix>``).
    binary_suffix: str
    source_suffix: str
    #: What the verify line says ``check_binary`` proved of every binary.
    binary_check_phrase: str
    #: Element-ops (elements x ops x extra users) a fan-out may recompute instead of getting
    #: a buffer (lowering's fusion budget).
    recompute_budget: int
    #: Template kernel kinds lowering offers as a bmm or attention step's variant beside the
    #: ATen calls (``"bmm"``, ``"attention"``); none by default: those run as ATen calls.
    template_kinds: frozenset = frozenset()

    @classmethod
    def build_options(cls, parser) -> None:
        """Add the backend's own ``aotpack build`` flags to ``parser`` (an ``argparse``
        parser). Called on the class (``backends.build_options``), before any backend is
        created, for every registered backend. Default: none."""

    @classmethod
    def settings_from(cls, args) -> dict:
        """``config.Settings.from_env`` overrides from the flags ``build_options`` added
        (``args``: the parsed ``argparse.Namespace``). Default: none."""
        return {}

    @abstractmethod
    def device(self) -> Device:
        """The device kernels run on (one per backend object)."""

    @abstractmethod
    def check_binary(self, handle, label: str) -> None:
        """Check the binary in the open file ``handle`` (seekable, read from the start)
        before it may be loaded, with bounded reads; nothing in it is executed.

        Raises:
            AotpackError: naming ``label``, on a malformed binary or one for another machine.
        """

    @abstractmethod
    def manifest_target(self, target: dict) -> dict:
        """The manifest keys that record ``target`` (``target(settings)``), merged into the
        manifest's top level."""

    def describe_target(self, doc: dict) -> str:
        """One phrase naming the target the manifest ``doc`` records (``aotpack inspect``)."""
        return "target " + json.dumps(doc.get("target", {}), sort_keys=True)

    @abstractmethod
    def check_target(self, doc: dict, fields) -> None:
        """Check the target keys of the manifest ``doc`` as the runtime does, with the
        manifest reader's field checks ``fields`` (``obj``, ``str``, ``strings``: each takes
        ``(container, key, where)``, returns the value, raises ``AotpackError``)."""

    def gemm_variants(self, lw, match, operands) -> list | None:
        """The implementations (``gemm.GemmVariant``, in timing order) offered for a matched
        linear or convolution, or None to lower it as its ATen call alone (the default).

        ``lw``: the ``Lowerer``; ``match``: the ``gemm_match.GemmMatch``; ``operands``: the
        ``gemm_lowering.GemmOperands`` (views of x, weight, bias, residual, the outputs and
        the ATen variant's steps).
        """
        return None
    def template_dir(self) -> Path:
        """The backend's Jinja templates: ``templates/`` beside the module defining the backend
        class (``aotpack/backends/<name>/templates/``), shipped as package data."""
        return Path(sys.modules[type(self).__module__].__file__).resolve().parent / "templates"

    def limits(self, settings) -> Limits:
        """Resources from the build settings (``Settings.device_limit``)."""
        return Limits(settings.device_limit)

    def weight_transform(self, kind: str):
        """The build-time transform ``fn(tensor) -> tensor`` that lays a constant out as the
        backend's template kernels read it: ``gemm_panels`` (a ``[N, K]`` weight), ``gemm_bias``
        (``[N]``), ``winograd`` (a ``[C_out, C_in, 3, 3]`` filter). Lowering applies it at build
        time; a weight packed at load instead (``gemm.resolve``) records the same function.

        Raises:
            KeyError: for a kind the backend has no template kernel for.
        """
        raise KeyError(f"backend {self.name!r} has no weight transform {kind!r}")

    @abstractmethod
    def solve(self, kernel, limits: Limits, count: int) -> list[Candidate]:
        """At most ``count`` candidates for ``kernel``, the heuristic default first."""

    def estimate_us(self, kernel, candidate: Candidate, settings) -> float | None:
        """Estimated us of one launch (the cost model that ranks candidates before they
        are compiled, ``--cost-model``); None when the backend has no model."""
        return None

    def ranks_tilings(self, kernel) -> bool:
        """Whether ``estimate_us`` ranks ``kernel``'s tilings well enough that a candidate
        estimated far behind the best (``Settings.far_behind_factor``) need not be compiled.
        Default: no kernel (every candidate is compiled and timed)."""
        return False

    def share_binaries(self, candidates: tuple) -> tuple:
        """Per candidate, the tiling its binary is rendered from (the candidates themselves
        are compiled for, launched and keyed as they are).

        A backend whose kernels take ``block_dim`` at launch time renders candidates that
        differ only in ``block_dim`` from one tiling, so they share one binary. Default:
        every candidate is its own build.
        """
        return candidates

    @abstractmethod
    def render_kernel(self, kernel, candidate: Candidate) -> str:
        """Source of ``kernel`` with ``candidate``'s tiling fixed at compile time."""

    @abstractmethod
    def render_wrapper(self, candidates: list[Candidate]) -> str:
        """Source of a wrapper holding the ``kernel_key -> TilingInfo`` map of ``candidates``."""

    @abstractmethod
    def toolchain(self, settings) -> Toolchain:
        """The compiler driver for these settings (target ISA and the like)."""

    @abstractmethod
    def load_wrapper(self, wrapper: Path, kernel_dir: Path, name: str) -> Launcher:
        """Load a compiled wrapper whose static kernels live under ``kernel_dir``."""

    @abstractmethod
    def target(self, settings) -> dict:
        """Target description for the manifest (checked by the runtime at load)."""

    @abstractmethod
    def generate_model(self, graph, kernels: list, meta: dict) -> str:
        """The CppWrapper: host source of ``graph`` with each kernel's winner baked in.

        ``kernels``: one ``(FusedKernel, winner Candidate)`` per distinct kernel, in order;
        every ``KernelCall`` names one of them by ``kernel_id``.
        """

    @abstractmethod
    def compile_model(self, source: str, workdir: Path, settings) -> tuple[Path, float]:
        """The host library of ``source`` in ``workdir`` (compiled, or from the build cache);
        returns (library path, seconds)."""
