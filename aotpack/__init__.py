"""aotpack: export a PyTorch model, fuse and autotune its kernels ahead of time, and ship
it as a versioned archive that a C++ runtime runs without Python.

Pipeline stages, in order (see docs/design.md and docs/layout.md): ``export`` ->
``lowering`` (``ir``, ``kernel_ir``) -> ``candidates`` -> ``compile`` -> ``autotune`` ->
``codegen`` -> ``package``; device specifics live in ``backends/<name>/``, and
``runtime`` drives the native runtime and
``loader`` (``aotpack.load``) runs an archive in-process.
"""
from aotpack.errors import AotpackError

__version__ = "0.1.0"
__all__ = ["AotpackError", "Model", "__version__", "load"]


def __getattr__(name: str):
    """``aotpack.load`` and ``aotpack.Model`` import torch only when first used."""
    if name in ("load", "Model"):
        from aotpack.runtime import loader

        return getattr(loader, name)
    raise AttributeError(f"module 'aotpack' has no attribute {name!r}")
