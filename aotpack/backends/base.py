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
* ``target`` – the target description recorded in the manifest;
* ``template_dir`` – the backend's own Jinja template folder (``codegen.render.render_from``).

A backend is registered by name in ``aotpack.backends`` (``--backend NAME``).
"""
from __future__ import annotations

import hashlib
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path


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

    def template_dir(self) -> Path:
        """The backend's Jinja templates: ``templates/`` beside the module defining the backend
        class (``aotpack/backends/<name>/templates/``), shipped as package data."""
        return Path(sys.modules[type(self).__module__].__file__).resolve().parent / "templates"

    def limits(self, settings) -> Limits:
        """Resources from the build settings (``Settings.device_limit``)."""
        return Limits(settings.device_limit)

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
