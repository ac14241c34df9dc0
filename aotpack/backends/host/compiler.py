"""The host compiler's identity, part of every cache key of a host backend's binaries."""
from __future__ import annotations

import functools
import subprocess

from aotpack.errors import AotpackError


@functools.lru_cache(maxsize=None)
def compiler_version(compiler: str, what: str, advice: str) -> str:
    """First line of ``<compiler> --version``.

    Raises:
        AotpackError: ``"<what> '<compiler>' not found or broken (...); <advice>"``.
    """
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise AotpackError(f"{what} '{compiler}' not found or broken ({exc}); {advice}") from exc
    return out.splitlines()[0]
