"""Backend registry: ``--backend NAME`` -> a ``base.Backend``.

Adding a backend = one folder ``aotpack/backends/<name>/`` with a ``Backend``
subclass, plus one line in ``_FACTORIES`` below. Modules load lazily, so a backend
whose toolkit is missing costs nothing until it is chosen. A backend module that names its
class as ``BACKEND`` gets its own ``aotpack build`` flags (``Backend.build_options``).
"""
from __future__ import annotations

import functools
import importlib

from aotpack.errors import AotpackError

#: The backend used when none is chosen.
DEFAULT = "cpu"

#: name -> module path of the backend's package (it defines ``create() -> Backend``).
_FACTORIES = {
    "cpu": "aotpack.backends.cpu",
    "npu": "aotpack.backends.npu",
    "portable": "aotpack.backends.portable",
}


def names() -> list[str]:
    """Registered backend names."""
    return list(_FACTORIES)


def check(name: str) -> str:
    """``name`` if it is a backend that can run here.

    Raises:
        AotpackError: an unknown backend, or one whose toolkit is missing (the
            backend's own message says what to install).
    """
    get(name)
    return name


@functools.lru_cache(maxsize=None)
def get(name: str):
    """The ``Backend`` registered as ``name`` (created once per process).

    Raises:
        AotpackError: unknown name, or the backend cannot run here.
    """
    if name not in _FACTORIES:
        raise AotpackError(f"unknown backend {name!r}; choose one of {', '.join(_FACTORIES)}")
    return importlib.import_module(_FACTORIES[name]).create()


def _classes() -> list:
    """The ``Backend`` subclass of every registered backend whose module names one (``BACKEND``)."""
    found = (getattr(importlib.import_module(path), "BACKEND", None) for path in _FACTORIES.values())
    return [cls for cls in found if cls is not None]


def build_options(parser) -> None:
    """Add every registered backend's own ``aotpack build`` flags to ``parser``
    (``Backend.build_options``, in registry order; no backend is created)."""
    for cls in _classes():
        cls.build_options(parser)


def settings_from(args) -> dict:
    """The ``config.Settings.from_env`` overrides of every backend's flags in ``args``
    (``Backend.settings_from``)."""
    overrides: dict = {}
    for cls in _classes():
        overrides.update(cls.settings_from(args))
    return overrides
