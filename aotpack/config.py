"""Every environment setting aotpack reads, parsed and validated in one place.

Each setting has a CLI flag that overrides it (see docs/env_vars.md). Values are read
when a build starts (``Settings.from_env``), never scattered through the code.
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

from aotpack.backends import DEFAULT as DEFAULT_BACKEND
from aotpack.errors import AotpackError

log = logging.getLogger("aotpack")

#: Candidates requested from the tiling solver per kernel (TopN, at most 10).
MAX_TOPN = 10

ENV_TOPN = "AOTPACK_AUTOTUNE_TOPN"
ENV_CACHE_DIR = "AOTPACK_CACHE_DIR"
ENV_DEVICE_LIMIT = "AOTPACK_DEVICE_LIMIT"
ENV_COMPILE_THREADS = "AOTPACK_COMPILE_THREADS"
ENV_DEBUG = "AOTPACK_DEBUG"
ENV_RUNTIME = "AOTPACK_RUNTIME"
ENV_RUNTIME_LIB = "AOTPACK_RUNTIME_LIB"
#: The aotpack-serve binary ``aotpack serve`` runs (default: found as aotpack-run is).
ENV_SERVER = "AOTPACK_SERVE"
#: ``ctypes``: aotpack.load calls the runtime through ctypes even where ``_aotpack_binding`` is built.
ENV_BINDING = "AOTPACK_BINDING"
ENV_RETUNE = "AOTPACK_RETUNE"
ENV_BACKEND = "AOTPACK_BACKEND"
ENV_COSTMODEL = "AOTPACK_COSTMODEL"
ENV_COSTMODEL_RATIO = "AOTPACK_COSTMODEL_RATIO"
#: Share of the solver's space the cost model keeps for compiling and PGO.
DEFAULT_COSTMODEL_RATIO = 0.25
ENV_TINY_KERNEL_US = "AOTPACK_TINY_KERNEL_US"
#: A kernel whose default tiling the backend estimates under this many us compiles only its
#: default (``candidates.shortlist``). MobileNetV3-Small, --topn 3, 2 threads: 16 of its 57
#: kernels were under it (squeeze-excite 1x1 convolutions and means), and had run 0-0.74 us
#: faster with their best candidate than with their default, 1.9 us of a 3.4 ms model; with the
#: 15 epilogue kernels of the extern-library alternatives of those convolutions, 62 of 356 compiles.
#: With the cost model's cache tier (``cost_model.CACHE_RESIDENT_BYTES``): 25 of its 58.
DEFAULT_TINY_KERNEL_US = 10.0
ENV_FAR_BEHIND_FACTOR = "AOTPACK_FAR_BEHIND_FACTOR"
#: A candidate estimated this many times its kernel's best is not compiled, where the backend's
#: estimates rank the kernel's tilings (``candidates._without_far_behind``). ResNet-18,
#: MobileNetV3-Small and ViT-S/16 at --topn 3 (Zen 3, 2 threads): the 48 template candidates
#: estimated 1.46-3.8x their kernel's best measured 1.12-2.7x its winner (25 of them 1-thread
#: twins, which save timing, not a compile); one estimated 1.38x (a 1x1 stride-2 convolution,
#: its copy then at 10 GB/s) won by 12%, hence 1.4, not 1.3.
DEFAULT_FAR_BEHIND_FACTOR = 1.4


def parse_topn(raw: str | int, source: str = ENV_TOPN) -> int:
    """Validate a TopN setting: a positive integer, clamped to ``MAX_TOPN`` with a warning.

    Raises:
        AotpackError: ``"<source> must be a positive integer"`` for a non-integer,
            ``"<source> must be >= 1"`` for zero or a negative number.
    """
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise AotpackError(f"{source} must be a positive integer, got {raw!r}") from None
    if value < 1:
        raise AotpackError(f"{source} must be >= 1, got {value}")
    if value > MAX_TOPN:
        log.warning("%s=%d exceeds the maximum of %d candidates; using %d",
                    source, value, MAX_TOPN, MAX_TOPN)
        value = MAX_TOPN
    return value


def available_cores(backend: str = DEFAULT_BACKEND) -> int:
    """Compute units this process may use on ``backend``'s device (``Device.compute_units``:
    on the CPU, the affinity mask bounded by the cgroup CPU quota)."""
    from aotpack import backends

    return backends.get(backend).device().compute_units()


def parse_device_limit(raw: str | int | None, source: str = ENV_DEVICE_LIMIT, backend: str = DEFAULT_BACKEND) -> int:
    """Compute units the kernels may use (block_dim upper bound), at most what ``backend``'s
    device has (``available_cores``); ``None``/empty = all available.

    Read once in the parent process and shipped to compile workers.

    Raises:
        AotpackError: for a non-integer or a value < 1.
    """
    cores = available_cores(backend)
    if raw is None or str(raw).strip() == "":
        return cores
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise AotpackError(f"{source} must be a positive integer, got {raw!r}") from None
    if value < 1:
        raise AotpackError(f"{source} must be >= 1, got {value}")
    if value > cores:
        log.warning("%s=%d exceeds the %d cores available here; using %d", source, value, cores, cores)
    return min(value, cores)


def check_backend(name: str) -> str:
    """The backend to build for, by registered name (``aotpack.backends``).

    Raises:
        AotpackError: an unknown backend, or one that cannot run here.
    """
    from aotpack import backends

    return backends.check(name)


def default_cache_dir() -> Path:
    """``$AOTPACK_CACHE_DIR`` or ``$XDG_CACHE_HOME/aotpack`` (``~/.cache/aotpack``)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "aotpack"


#: The debug dir that ``AOTPACK_DEBUG=1`` selects (relative to the working folder).
ENV_DEBUG_DIR = Path("aotpack_debug")


def env_debug_dir() -> Path | None:
    """``ENV_DEBUG_DIR`` when ``AOTPACK_DEBUG=1``, else None."""
    return ENV_DEBUG_DIR if os.environ.get(ENV_DEBUG) == "1" else None


def parse_number(raw: str | float, source: str, valid, expected: str) -> float:
    """``raw`` as a float that ``valid`` accepts; ``source`` (a flag or variable name) and
    ``expected`` (e.g. ``a number in (0, 1]``) word the error.

    Raises:
        AotpackError: ``<source> must be <expected>, got <raw>``: not a number, or not valid.
    """
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = None
    if value is None or not valid(value):
        raise AotpackError(f"{source} must be {expected}, got {raw!r}") from None
    return value


def _number_setting(flag, flag_name: str, env, env_name: str, default: float, valid, expected: str) -> float:
    """The flag when given, else the environment variable, else ``default`` (``parse_number``)."""
    if flag is not None:
        return parse_number(flag, flag_name, valid, expected)
    return parse_number(env.get(env_name, default), env_name, valid, expected)


@dataclass(frozen=True)
class Settings:
    """Build settings; every field has an environment variable and a CLI flag."""

    topn: int = 1
    cache_dir: Path = Path()
    device_limit: int = 1
    compile_threads: int = 2
    debug_dir: Path | None = None
    target_isa: str = "native"
    retune: bool = False
    tuning_from: Path | None = None  # an archive whose recorded winners are replayed
    require_coverage: bool = False  # every kernel must be reached by the real inputs
    backend: str = DEFAULT_BACKEND
    cost_model: bool = False  # rank the solver's whole space, compile the best share
    cost_model_ratio: float = DEFAULT_COSTMODEL_RATIO
    tiny_kernel_us: float = DEFAULT_TINY_KERNEL_US  # a kernel estimated under this compiles only its default
    far_behind_factor: float = DEFAULT_FAR_BEHIND_FACTOR  # a candidate estimated this x the best is dropped; 0: off

    @staticmethod
    def from_env(**overrides) -> "Settings":
        """Settings from the environment; keyword arguments (CLI flags) win when not None."""
        env = os.environ
        topn = overrides.get("topn")
        topn = parse_topn(topn, "--topn") if topn is not None else parse_topn(env.get(ENV_TOPN, "1"))
        backend = check_backend(overrides.get("backend") or env.get(ENV_BACKEND, DEFAULT_BACKEND))
        limit = overrides.get("device_limit")
        limit = (parse_device_limit(limit, "--device-limit", backend) if limit is not None
                 else parse_device_limit(env.get(ENV_DEVICE_LIMIT), backend=backend))
        # compiles run on the host, whose cores the default backend's device counts
        threads_raw = env.get(ENV_COMPILE_THREADS, str(available_cores()))
        try:
            threads = max(1, int(threads_raw))
        except ValueError:
            raise AotpackError(f"{ENV_COMPILE_THREADS} must be a positive integer, got {threads_raw!r}") from None
        cache = overrides.get("cache_dir") or env.get(ENV_CACHE_DIR) or default_cache_dir()
        debug = overrides.get("debug_dir") or env_debug_dir()
        return Settings(topn=topn, cache_dir=Path(cache), device_limit=limit,
                        compile_threads=threads, debug_dir=Path(debug) if debug else None,
                        target_isa=overrides.get("target_isa") or "native",
                        retune=bool(overrides.get("retune")) or env.get(ENV_RETUNE) == "1",
                        tuning_from=Path(overrides["tuning_from"]) if overrides.get("tuning_from") else None,
                        require_coverage=bool(overrides.get("require_coverage")),
                        backend=backend,
                        cost_model=bool(overrides.get("cost_model")) or env.get(ENV_COSTMODEL) == "1",
                        cost_model_ratio=_number_setting(
                            overrides.get("cost_model_ratio"), "--cost-model-ratio", env, ENV_COSTMODEL_RATIO,
                            DEFAULT_COSTMODEL_RATIO, lambda v: 0 < v <= 1, "a number in (0, 1]"),
                        tiny_kernel_us=_number_setting(
                            overrides.get("tiny_kernel_us"), "--tiny-kernel-us", env, ENV_TINY_KERNEL_US,
                            DEFAULT_TINY_KERNEL_US, lambda v: v >= 0, "a number of microseconds >= 0"),
                        far_behind_factor=_number_setting(
                            overrides.get("far_behind_factor"), "--far-behind-factor", env, ENV_FAR_BEHIND_FACTOR,
                            DEFAULT_FAR_BEHIND_FACTOR, lambda v: v == 0 or 1 < v < math.inf, "0 (off) or a number > 1"))
