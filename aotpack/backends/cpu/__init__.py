"""The CPU backend (built in; the reference backend, runs everywhere and in CI).

Kernels are C++ rendered from Jinja templates (``templates/cpu_*.j2``) with every
shape, stride and tiling knob a compile-time constant, compiled by the system C++
compiler (``toolchain``), parallel over OpenMP threads (``block_dim``).

Files: ``tiling`` (TopN solver), ``gemm_template`` / ``conv_template``,
``depthwise_template``, ``bmm_template``, ``winograd_template``, ``attention_template`` (the GEMM,
convolution, depthwise convolution, batched GEMM, Winograd 3x3 convolution and fused attention
templates' tilings and sources), ``cost_model`` (ranks candidates before compiling), ``formulas`` + ``renderer`` (kernel IR -> C++),
``toolchain`` (compiler, flags, -march, OpenMP rules), ``launcher`` (ctypes PGO
launcher), ``cpp_wrapper`` (model.cpp), ``wrapper_slot`` (per-kernel wrappers from one binary),
``device`` (cores, ATen threads, the timing noise probes), ``binaries`` (file suffixes, the ELF
check), ``gemm_menu`` (the ATen, MKL and oneDNN implementations offered for a matched GEMM).
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from aotpack import leftovers
from aotpack.tune import cache
from aotpack.backends.base import Backend, Limits
from aotpack.backends.cpu import (attention_template, bmm_template, conv_template, cost_model, cpp_wrapper,
                                  depthwise_template, gemm_menu, gemm_template, templating, tiling, winograd_template,
                                  wrapper_slot)
from aotpack.backends.host import binaries
from aotpack.backends.cpu.device import CpuDevice
from aotpack.backends.cpu.formulas import C_TYPES
from aotpack.backends.cpu import weights
from aotpack.backends.cpu.launcher import CpuLauncher
from aotpack.backends.cpu.renderer import render_kernel
from aotpack.backends.cpu.toolchain import CpuToolchain, target_isa
from aotpack.ir.template_kernels import (AttentionKernel, BmmKernel, ConvKernel, DepthwiseConvKernel, GemmKernel,
                                         WinogradConvKernel)


#: Kernel kinds with a template of their own: each module has ``solve``, ``estimate_us``
#: and ``render_kernel``; every other kernel is a ``FusedKernel`` (``tiling``, ``renderer``).
TEMPLATES = {GemmKernel: gemm_template, ConvKernel: conv_template, DepthwiseConvKernel: depthwise_template,
             BmmKernel: bmm_template, WinogradConvKernel: winograd_template,
             AttentionKernel: attention_template}

#: Templates whose ``estimate_us`` ranks tilings (flops over a tile-shape efficiency): on
#: ResNet-18, MobileNetV3-Small and ViT-S/16 every candidate they estimated >= 1.4x the best
#: (``Settings.far_behind_factor``) measured >= 1.12x the winner. The depthwise template's
#: estimate does not (it put MobileNetV3-Small's tilings 1.6-1.8x apart that measured within
#: 4%), nor does the pointwise roofline (``cost_model``), built to rank loop orders and SIMD
#: widths, not to be trusted that far.
RANKED_BY_ESTIMATE = (GemmKernel, ConvKernel, BmmKernel, WinogradConvKernel)


class CpuBackend(binaries.HostBinaries, Backend):
    """Static C++/OpenMP kernels for the build machine's CPU family."""

    name = "cpu"
    dtypes = frozenset(C_TYPES)
    model_abi_version = cpp_wrapper.MODEL_ABI_VERSION
    source_suffix = binaries.SOURCE_SUFFIX
    #: ~0.7 us of recomputation at 8 float lanes a cycle and 3 GHz (an estimate), less than the
    #: ~2.2 us the runtime spends on its smallest kernel (Model::run of x + 1 on 4x4, measured).
    recompute_budget = 16384
    template_kinds = frozenset({"bmm", "attention"})

    def __init__(self):
        self._device = CpuDevice()

    @classmethod
    def build_options(cls, parser) -> None:
        """``--target-isa``: the ``-march`` the kernels are compiled for (``toolchain.target_isa``)."""
        parser.add_argument("--target-isa", default=None,
                            help="target ISA the kernels are compiled for (default: native, this machine; "
                                 "e.g. x86-64-v3)")

    @classmethod
    def settings_from(cls, args) -> dict:
        """``target_isa`` from ``--target-isa`` (None: the default, native)."""
        return {"target_isa": getattr(args, "target_isa", None)}

    def device(self) -> CpuDevice:
        """This machine's CPU (``device.CpuDevice``)."""
        return self._device

    def gemm_variants(self, lw, match, operands) -> list | None:
        """``gemm_menu.variants``: ATen, MKL and oneDNN calls beside aotpack's templates."""
        return gemm_menu.variants(lw, match, operands)

    def template_dir(self) -> Path:
        """``templates/`` of this folder (``templating.TEMPLATE_DIR``), also for subclasses
        defined elsewhere."""
        return templating.TEMPLATE_DIR

    def limits(self, settings) -> Limits:
        """``device_limit`` from the settings; ``vector_bytes`` from the target ISA (64 where
        it has AVX-512F)."""
        return Limits(settings.device_limit, cost_model.vector_bytes(self.target(settings)["features"]))

    def weight_transform(self, kind: str):
        """``weights.TRANSFORMS[kind]``: GEMM panels of ``weights.GEMM_PANEL`` columns, their
        padded bias, Winograd filters."""
        return weights.TRANSFORMS[kind]

    def solve(self, kernel, limits: Limits, count: int) -> list:
        template = TEMPLATES.get(type(kernel))
        if template is not None:  # every template takes the vector width as a knob
            return template.solve(kernel, limits.device_limit, count, vector_bytes=limits.vector_bytes)
        return tiling.solve(kernel, limits.device_limit, count)

    def estimate_us(self, kernel, candidate, settings) -> float:
        template = TEMPLATES.get(type(kernel))
        if template is not None:
            return template.estimate_us(kernel, candidate)
        return cost_model.estimate_us(kernel, candidate, self.target(settings)["features"])

    def ranks_tilings(self, kernel) -> bool:
        """True for the templates in ``RANKED_BY_ESTIMATE``."""
        return isinstance(kernel, RANKED_BY_ESTIMATE)

    def share_binaries(self, candidates: tuple) -> tuple:
        """Candidates that differ only in ``block_dim`` share the binary of the one with the
        most threads: every kernel already caps its OpenMP threads at the launch's
        ``max_threads``, and the wrapper caps each launch at its candidate's own
        ``block_dim``, so one compile serves them all (11 of transformer_block's 42 kernel
        compiles at ``--topn 3``). Only where their workspace is the same: a per-thread
        workspace (depthwise, staged convolution, packed bmm) would change the narrow
        candidate's workspace and so its ``kernel_key``, which ``--tuning-from`` and the
        tuning cache match on."""
        widest: dict = {}
        for c in candidates:
            key = dataclasses.replace(c, block_dim=0)
            if key not in widest or c.block_dim > widest[key].block_dim:
                widest[key] = c
        return tuple(widest[dataclasses.replace(c, block_dim=0)] for c in candidates)

    def render_kernel(self, kernel, candidate) -> str:
        template = TEMPLATES.get(type(kernel))
        if template is not None:
            return template.render_kernel(kernel, candidate)
        return render_kernel(kernel, candidate)

    def render_wrapper(self, candidates: list) -> str:
        return wrapper_slot.render(candidates)

    def toolchain(self, settings) -> CpuToolchain:
        """The compiler driver; its wrappers come from one slot binary in the build cache's
        binary store (``wrapper_slot``)."""
        return CpuToolchain(settings.target_isa, slot_dir=settings.cache_dir / self.name / "binaries",
                            temp_root=leftovers.compiler_temp_root(settings.cache_dir))

    def load_wrapper(self, wrapper: Path, kernel_dir: Path, name: str) -> CpuLauncher:
        return CpuLauncher(wrapper, kernel_dir, name)

    def target(self, settings) -> dict:
        """``{"march", "features"}`` (the runtime refuses a CPU lacking a feature)."""
        return target_isa(settings.target_isa)

    def generate_model(self, graph, kernels: list, meta: dict) -> str:
        return cpp_wrapper.generate(graph, kernels, meta)

    def compile_model(self, source: str, workdir: Path, settings) -> tuple[Path, float]:
        """model.so of ``source`` in ``workdir``, from the build cache's source-keyed store
        (``<cache>/cpu/models``) when an earlier build compiled the same model.cpp with the same
        toolchain and headers: a warm rebuild skips its ~1-2 s compile."""
        toolchain = self.toolchain(settings)
        store = cache.BinaryStore(settings.cache_dir / self.name / "models", toolchain.model_fingerprint(),
                                  self.binary_suffix, self.source_suffix)
        out = workdir / "model.so"
        start = time.perf_counter()
        with cache.locked([store.path(source).parent]):  # another build may be writing the same entry
            store.provide(source, out, workdir / "model.cpp", toolchain.compile_model)
        return out, time.perf_counter() - start


def create() -> CpuBackend:
    """The registry's factory."""
    return CpuBackend()


#: The class the registry asks for the backend's build flags (``Backend.build_options``).
BACKEND = CpuBackend
