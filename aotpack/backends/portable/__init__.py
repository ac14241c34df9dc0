"""The portable backend: plain C99 kernels from the same kernel IR, for any host CPU.

One candidate per kernel (a row loop over ``j`` loops, ``c_kernel``), compiled by the system C
compiler without ``-march``, intrinsics or OpenMP (``toolchain``): one thread per kernel, the
compiler's auto-vectoriser only. No template kernels: a matched GEMM, convolution, bmm or
attention block runs as its ATen call(s). It is the numerics reference for the CPU backend and
the starting point for targets without x86 SIMD.

The native runtime loads it as it loads the CPU backend (host ELF shared objects behind the
model ABI and the kernel ABI), so it uses what ``backends/host`` holds for both: the kernel ABI's
declarations and ctypes launcher, and the ELF check. The host CppWrapper (model.cpp, which only
launches kernels through their wrappers and calls ATen through the host table) is still the CPU
backend's ``cpp_wrapper``: it also emits the CPU's GEMM panel packing for tied weights.
"""
from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass
from pathlib import Path

from aotpack.backends.base import Backend, Candidate, Device, Launcher
from aotpack.backends.cpu import cpp_wrapper
from aotpack.backends.host import binaries, kernel_abi
from aotpack.backends.host.launch_abi import WrapperLauncher
from aotpack.backends.portable import c_kernel
from aotpack.backends.portable.c_formulas import C_TYPES
from aotpack.backends.portable.toolchain import PortableToolchain, default_march
from aotpack.codegen.render import render_from
from aotpack.errors import AotpackError
from aotpack.ir.kernel import FusedKernel
from aotpack.tune import cache

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
#: What ``{{ kernel_abi }}`` prints in kernels and wrappers (they compile without ``-I``).
KERNEL_ABI = kernel_abi.declarations()


def render(template: str, **context) -> str:
    """Render ``templates/<template>`` with ``context`` and ``kernel_abi``."""
    return render_from(TEMPLATE_DIR, template, **{"kernel_abi": KERNEL_ABI, **context})


@dataclass(frozen=True)
class RowLoops(Candidate):
    """The one tiling: rows in order, one thread, no workspace."""

    tiling_repr: str = "rows"
    workspace: int = 0
    block_dim: int = 1


class HostDevice(Device):
    """The host CPU; kernels are single-threaded, ATen's extern calls use its threads."""

    def compute_units(self) -> int:
        """CPUs in this process's affinity mask (>= 1)."""
        return max(1, len(os.sched_getaffinity(0)))


class PortableLauncher(Launcher):
    """A kernel's wrapper loaded through ctypes for the Python-mode run and PGO (synchronous).

    Raises (constructor):
        AotpackError: the wrapper loads no static kernel or speaks another kernel ABI.
    """

    def __init__(self, wrapper: Path, kernel_dir: Path, name: str):
        self.abi = WrapperLauncher(ctypes.CDLL(str(wrapper), mode=ctypes.RTLD_LOCAL), f"kernel {name}")
        try:
            self.abi.init(kernel_dir)
        except AotpackError as exc:
            raise AotpackError(f"{exc} (cache {kernel_dir}); remove that folder and build again") from None

    def arguments(self, tensors):
        """The data pointers of ``tensors`` as the ``void* const*`` argument array."""
        return (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])

    def launch(self, kernel_key: str, tensors) -> None:
        """Run candidate ``kernel_key`` on a tensor list or an ``arguments`` array."""
        packed = tensors if isinstance(tensors, ctypes.Array) else self.arguments(tensors)
        self.abi.launch(kernel_key, packed)

    def synchronize(self) -> None:
        """Launches are synchronous."""

    def release(self, keep_kernel_key: str) -> None:
        """Unload every candidate but ``keep_kernel_key``."""
        self.abi.release(keep_kernel_key)


class PortableBackend(binaries.HostBinaries, Backend):
    """Plain C99 kernels, one thread each, for the build machine's architecture."""

    name = "portable"
    dtypes = frozenset(C_TYPES)
    model_abi_version = cpp_wrapper.MODEL_ABI_VERSION
    source_suffix = ".c"
    #: a scalar loop recomputes slower than the vectorised CPU kernels: half their budget
    recompute_budget = 8192

    def __init__(self):
        self._device = HostDevice()

    def device(self) -> HostDevice:
        return self._device

    def solve(self, kernel, limits, count: int) -> list:
        """The one ``RowLoops`` candidate.

        Raises:
            AotpackError: a template kernel (this backend offers none, so lowering makes none).
        """
        if not isinstance(kernel, FusedKernel):
            raise AotpackError(f"internal error: the portable backend has no template for {type(kernel).__name__}")
        return [RowLoops()]

    def render_kernel(self, kernel, candidate) -> str:
        return render("portable_kernel.c.j2", body=c_kernel.build_body(kernel), tiling_repr=candidate.tiling_repr)

    def render_wrapper(self, candidates: list) -> str:
        return render("portable_wrapper.c.j2", candidates=candidates)

    def toolchain(self, settings) -> PortableToolchain:
        return PortableToolchain()

    def load_wrapper(self, wrapper: Path, kernel_dir: Path, name: str) -> PortableLauncher:
        return PortableLauncher(wrapper, kernel_dir, name)

    def target(self, settings) -> dict:
        """``{"march": the C compiler's default, "features": []}``: nothing beyond the
        architecture's baseline is required (``--target-isa`` does not apply)."""
        return {"march": default_march(), "features": []}

    def generate_model(self, graph, kernels: list, meta: dict) -> str:
        """The host CppWrapper shared with the CPU backend (``cpu.cpp_wrapper``)."""
        return cpp_wrapper.generate(graph, kernels, meta)

    def compile_model(self, source: str, workdir: Path, settings) -> tuple[Path, float]:
        """model.so of ``source``, from the build cache's source-keyed store when present."""
        toolchain = self.toolchain(settings)
        store = cache.BinaryStore(settings.cache_dir / self.name / "models", toolchain.model_fingerprint(),
                                  self.binary_suffix, binaries.SOURCE_SUFFIX)
        out = workdir / "model.so"
        start = time.perf_counter()
        with cache.locked([store.path(source).parent]):
            store.provide(source, out, workdir / "model.cpp", toolchain.compile_model)
        return out, time.perf_counter() - start


def create() -> PortableBackend:
    """The registry's factory."""
    return PortableBackend()
