"""Helpers shared by the tests of the native runtime's trust boundary (test_reliability,
test_cache_trust, test_signature_policy): aotpack-run in a private environment, the
extraction cache's folders, signed copies of an archive."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from aotpack.archive import writer
from test_native_runtime import RUN, require


def run_native(env: dict, *args, timeout: float = 120) -> subprocess.CompletedProcess:
    """``aotpack-run ARGS`` with environment ``env``; stdout and stderr captured as text."""
    return subprocess.run([str(require(RUN)), *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=timeout)


def cache_root(env: dict) -> Path:
    """The runtime's extraction cache under ``env``'s XDG_CACHE_HOME."""
    return Path(env["XDG_CACHE_HOME"]) / "aotpack" / "runtime"


def cache_entries(env: dict) -> list[str]:
    """Names of the published cache entries (sorted; the tmp folder left out)."""
    root = cache_root(env)
    return sorted(p.name for p in root.iterdir() if p.name != "tmp") if root.exists() else []


def leftovers(env: dict) -> list[str]:
    """Everything in ``env``'s TMPDIR and the cache's tmp folder: empty after a clean exit."""
    tmp = cache_root(env) / "tmp"
    return sorted(os.listdir(env["TMPDIR"])) + (sorted(os.listdir(tmp)) if tmp.exists() else [])


def signed_copy(archive: Path, private_key: Path, folder: Path) -> Path:
    """A copy of ``archive`` in ``folder`` signed with ``private_key`` (the original untouched)."""
    path = folder / f"signed-{archive.name}"
    path.write_bytes(archive.read_bytes())
    writer.sign_archive(path, private_key)
    return path
