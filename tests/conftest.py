"""Shared fixtures: one kernel cache per test session, the runtime's extraction cache, markers by
folder (``tests/unit`` and ``tests/golden``: no compiler; ``tests/native``: g++ and the runtime).
Plain helpers live in ``helpers.py``."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `from helpers import ...` from every folder

from aotpack.build import build  # noqa: E402
from aotpack.config import Settings  # noqa: E402

# The test models are all tiny kernels; the tests of tuning need every kernel's TopN, so the
# tiny-kernel and far-behind shortcuts are off here (builds and CLI runs inherit them) except where
# a test turns them on.
os.environ["AOTPACK_TINY_KERNEL_US"] = "0"
os.environ["AOTPACK_FAR_BEHIND_FACTOR"] = "0"


@pytest.fixture(scope="session", autouse=True)
def runtime_cache(tmp_path_factory) -> Path:
    """The native runtime's extraction cache ($XDG_CACHE_HOME/aotpack/runtime) of this
    session, so tests never write to the user's ~/.cache."""
    root = tmp_path_factory.mktemp("xdg-cache")
    os.environ["XDG_CACHE_HOME"] = str(root)
    return root


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kernel-cache")


@pytest.fixture(scope="session")
def build_model(cache_dir, tmp_path_factory):
    """build(path, topn=..., **kw) into a fresh folder with the session cache; memoised."""
    done = {}

    def _build(path, topn=1, **kwargs):
        key = (str(path), topn, tuple(sorted(kwargs.items())))
        if key not in done:
            out = tmp_path_factory.mktemp("dist")
            settings = Settings.from_env(topn=topn, cache_dir=cache_dir)
            done[key] = build(path, out, settings=settings, **kwargs)
        return done[key]

    return _build


def pytest_collection_modifyitems(items):
    """A test's folder says what it needs: ``unit`` (``unit/``, ``golden/``: no compiler) or
    ``native`` (``native/``: g++ and the runtime)."""
    root = Path(__file__).resolve().parent
    for item in items:
        if any(m.name in ("unit", "native") for m in item.iter_markers()):
            continue  # a unit test among native ones says so itself
        folder = Path(str(item.fspath)).resolve().relative_to(root).parts[0]
        item.add_marker(pytest.mark.native if folder == "native" else pytest.mark.unit)
