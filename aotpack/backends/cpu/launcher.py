"""PGO launcher of the CPU backend: a kernel's ``wrapper.so`` loaded through ctypes.

Launches go through the kernel launch ABI (``launch_abi``: the launch struct carries the
workspace the caller allocates). They are synchronous on the CPU (a kernel returns when
its OpenMP region ends), so ``synchronize`` has nothing to wait for.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

from aotpack.backends.base import Launcher
from aotpack.backends.host.launch_abi import WrapperLauncher
from aotpack.errors import AotpackError


class CpuLauncher(Launcher):
    """``wrapper.so`` with every static kernel found under ``kernel_dir`` loaded.

    Raises (constructor):
        AotpackError: the wrapper loads no static kernel or speaks another kernel ABI
            (a damaged or stale cache entry).
    """

    def __init__(self, wrapper: Path, kernel_dir: Path, name: str):
        lib = ctypes.CDLL(str(wrapper), mode=ctypes.RTLD_LOCAL)
        try:
            self.abi = WrapperLauncher(lib, f"kernel {name}")
            self.abi.init(kernel_dir)
        except AotpackError as exc:
            raise AotpackError(f"{exc} (cache {kernel_dir}); remove that folder and build again") from None

    def arguments(self, tensors) -> ctypes.Array:
        """The data pointers of ``tensors`` as the ``void* const*`` argument array."""
        return (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])

    def launch(self, kernel_key: str, tensors) -> None:
        """Run candidate ``kernel_key``; ``tensors`` is a list of tensors or an ``arguments`` array.

        Raises:
            AotpackError: the key is not loaded or the kernel refused the launch.
        """
        self.abi.launch(kernel_key, tensors if isinstance(tensors, ctypes.Array) else self.arguments(tensors))

    def synchronize(self) -> None:
        """CPU launches are synchronous."""

    def release(self, keep_kernel_key: str) -> None:
        """Unload every candidate but ``keep_kernel_key``.

        Raises:
            AotpackError: ``keep_kernel_key`` is not loaded.
        """
        self.abi.release(keep_kernel_key)
