"""PGO launcher of the CPU backend: a kernel's ``wrapper.so`` loaded through ctypes.

Launches are synchronous on the CPU (a kernel returns when its OpenMP region ends),
so ``synchronize`` has nothing to wait for.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

from aotpack.backends.base import Launcher
from aotpack.errors import AotpackError


class CpuLauncher(Launcher):
    """``wrapper.so`` with every static kernel found under ``kernel_dir`` loaded.

    Raises (constructor):
        AotpackError: the wrapper loads no static kernel (a damaged cache entry).
    """

    def __init__(self, wrapper: Path, kernel_dir: Path, name: str):
        self.name = name
        self.lib = ctypes.CDLL(str(wrapper), mode=ctypes.RTLD_LOCAL)
        self.lib.aotpack_init.argtypes = [ctypes.c_char_p]
        self.lib.aotpack_launch.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        self.lib.aotpack_release.argtypes = [ctypes.c_char_p]
        self.lib.aotpack_last_error.restype = ctypes.c_char_p
        if self.lib.aotpack_init(str(kernel_dir).encode()) < 1:
            raise AotpackError(f"kernel {name}: {self._error()} (cache {kernel_dir}); "
                               "remove that folder and build again")

    def _error(self) -> str:
        return (self.lib.aotpack_last_error() or b"").decode()

    def arguments(self, tensors) -> ctypes.Array:
        """The data pointers of ``tensors`` as the ``void* const*`` argument array."""
        return (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])

    def launch(self, kernel_key: str, tensors) -> None:
        """Run candidate ``kernel_key``; ``tensors`` is a list of tensors or an ``arguments`` array.

        Raises:
            AotpackError: the key is not loaded (the wrapper's message included).
        """
        args = tensors if isinstance(tensors, ctypes.Array) else self.arguments(tensors)
        if self.lib.aotpack_launch(kernel_key.encode(), args) != 0:
            raise AotpackError(f"kernel {self.name}: {self._error()}")

    def synchronize(self) -> None:
        """CPU launches are synchronous."""

    def release(self, keep_kernel_key: str) -> None:
        """Unload every candidate but ``keep_kernel_key``.

        Raises:
            AotpackError: ``keep_kernel_key`` is not loaded.
        """
        if self.lib.aotpack_release(keep_kernel_key.encode()) != 0:
            raise AotpackError(f"kernel {self.name}: {self._error()}")
