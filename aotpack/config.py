"""Build settings: each flag of ``aotpack build`` over its environment variable, parsed and
validated in one place. The variables themselves (names, defaults, rules) are declared in
the registry, ``aotpack.env``; docs/env_vars.md is generated from it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from aotpack import env
from aotpack.backends import DEFAULT as DEFAULT_BACKEND
from aotpack.env import MAX_TOPN, parse_topn  # noqa: F401 - the settings' public rules
from aotpack.errors import AotpackError

log = logging.getLogger("aotpack")

#: A kernel whose default tiling the backend estimates under this many us compiles only its
#: default (``candidates.shortlist``): tuning such kernels saved next to nothing per run but
#: cost many compiles (docs/measurements.md, "Tiny kernels compile only their default").
DEFAULT_TINY_KERNEL_US = env.TINY_KERNEL_US.default
#: A candidate estimated this many times its kernel's best is not compiled, where the backend's
#: estimates rank the kernel's tilings (``candidates._without_far_behind``): just above
#: the highest estimate of a candidate that still won when timed (docs/measurements.md,
#: "Far-behind candidates are not compiled").
DEFAULT_FAR_BEHIND_FACTOR = env.FAR_BEHIND_FACTOR.default
#: Share of the solver's space the cost model keeps for compiling and PGO.
DEFAULT_COSTMODEL_RATIO = env.COSTMODEL_RATIO.default


def available_cores(backend: str = DEFAULT_BACKEND) -> int:
    """Compute units this process may use on ``backend``'s device (``Device.compute_units``:
    on the CPU, the affinity mask bounded by the cgroup CPU quota)."""
    from aotpack import backends

    return backends.get(backend).device().compute_units()


def parse_device_limit(raw: str | int | None, source: str = env.DEVICE_LIMIT.name,
                       backend: str = DEFAULT_BACKEND) -> int:
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
    root = env.raw(env.XDG_CACHE_HOME) or str(Path.home() / ".cache")
    return Path(root) / "aotpack"


#: The debug dir that ``AOTPACK_DEBUG=1`` selects (relative to the working folder).
ENV_DEBUG_DIR = Path("aotpack_debug")


def env_debug_dir() -> Path | None:
    """``ENV_DEBUG_DIR`` when ``AOTPACK_DEBUG=1``, else None."""
    return ENV_DEBUG_DIR if env.get(env.DEBUG) else None


def _number_setting(flag, flag_name: str, var: env.Variable) -> float:
    """The flag when given (checked by the variable's rule, the flag named in errors), else the
    variable (its default when unset)."""
    return var.parse(flag_name, flag) if flag is not None else env.get(var)


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
        """Settings from the environment; keyword arguments (CLI flags) win when not None.

        Raises:
            AotpackError: an invalid flag or variable (the message names it).
        """
        topn = overrides.get("topn")
        topn = parse_topn(topn, "--topn") if topn is not None else env.get(env.TOPN)
        backend = check_backend(overrides.get("backend") or env.get(env.BACKEND))
        limit = overrides.get("device_limit")
        limit = (parse_device_limit(limit, "--device-limit", backend) if limit is not None
                 else parse_device_limit(env.raw(env.DEVICE_LIMIT), backend=backend))
        # compiles run on the host, whose cores the default backend's device counts
        threads = env.get(env.COMPILE_THREADS) or available_cores()
        cache = overrides.get("cache_dir") or env.get(env.CACHE_DIR) or default_cache_dir()
        debug = overrides.get("debug_dir") or env_debug_dir()
        return Settings(topn=topn, cache_dir=Path(cache), device_limit=limit,
                        compile_threads=threads, debug_dir=Path(debug) if debug else None,
                        target_isa=overrides.get("target_isa") or "native",
                        retune=bool(overrides.get("retune")) or env.get(env.RETUNE),
                        tuning_from=Path(overrides["tuning_from"]) if overrides.get("tuning_from") else None,
                        require_coverage=bool(overrides.get("require_coverage")),
                        backend=backend,
                        cost_model=bool(overrides.get("cost_model")) or env.get(env.COSTMODEL),
                        cost_model_ratio=_number_setting(
                            overrides.get("cost_model_ratio"), "--cost-model-ratio", env.COSTMODEL_RATIO),
                        tiny_kernel_us=_number_setting(
                            overrides.get("tiny_kernel_us"), "--tiny-kernel-us", env.TINY_KERNEL_US),
                        far_behind_factor=_number_setting(
                            overrides.get("far_behind_factor"), "--far-behind-factor", env.FAR_BEHIND_FACTOR))
