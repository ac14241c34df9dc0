"""The kernel launch ABI from Python: ctypes mirrors of ``native/include/aotpack/kernel_abi.h``,
built from the same definition (``kernel_abi``).

A kernel's ``wrapper.so`` loads its static ``kernel.so`` candidates and launches one by
``kernel_key`` with an ``AotpackKernelLaunch`` struct (device, stream, workspace, thread
cap). The caller owns the workspace: ``WrapperLauncher`` asks the wrapper for each key's
``TilingInfo`` and allocates that many bytes (64-byte aligned) once per key, before its
first launch. Used by autotuning (Python mode) to time candidates.

Example::

    lib = ctypes.CDLL("cache/.../wrapper.so", mode=ctypes.RTLD_LOCAL)
    launcher = WrapperLauncher(lib, label="kernel k3")
    launcher.init("cache/.../")                  # loads static_kernel/<key>/kernel.so
    launcher.launch(key, [x.data_ptr(), y.data_ptr()])
    launcher.release(key)                         # unload the other candidates
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

from aotpack.backends.host import kernel_abi
from aotpack.errors import AotpackError

#: Kernel ABI this launcher speaks (AOTPACK_KERNEL_ABI_VERSION_MAJOR/_MINOR). MAJOR =
#: incompatible layout or semantics change, refused on mismatch; MINOR = compatible additions.
KERNEL_ABI_VERSION_MAJOR = kernel_abi.VERSION_MAJOR
KERNEL_ABI_VERSION_MINOR = kernel_abi.VERSION_MINOR
KERNEL_ABI_VERSION = (KERNEL_ABI_VERSION_MAJOR << 16) | KERNEL_ABI_VERSION_MINOR
#: Alignment in bytes of every workspace (AOTPACK_WORKSPACE_ALIGNMENT).
WORKSPACE_ALIGNMENT = kernel_abi.WORKSPACE_ALIGNMENT
#: DLPack DLDeviceType code of the host CPU (AOTPACK_DEVICE_CPU, kDLCPU).
DEVICE_CPU = next(m.c_type for m in kernel_abi.DEVICE_TYPE.members if m.name == "AOTPACK_DEVICE_CPU")


class KernelLaunch(ctypes.Structure):
    """``AotpackKernelLaunch`` (kernel ABI 1.0): one launch's device, workspace and thread cap.

    Fields: struct_size (bytes of this struct), device_type (DLPack code, ``DEVICE_CPU``),
    device_id (0 on CPU), stream (NULL on CPU), workspace (pointer, 64-byte aligned),
    workspace_bytes, max_threads (0 = the tiling's block_dim, n > 0 = at most n threads).
    """

    _fields_ = kernel_abi.ctypes_fields(kernel_abi.KERNEL_LAUNCH)


class TilingInfoStruct(ctypes.Structure):
    """``AotpackTilingInfo``: what a wrapper knows about one kernel_key (the caller sets struct_size)."""

    _fields_ = kernel_abi.ctypes_fields(kernel_abi.TILING_INFO)


@dataclass(frozen=True)
class TilingInfo:
    """One kernel_key's tiling as its wrapper reports it.

    tiling_repr: canonical text of the tiling. workspace_bytes: scratch bytes per launch
    (the caller allocates them). block_dim: threads the tiling was generated for.
    """

    tiling_repr: str
    workspace_bytes: int
    block_dim: int


def version_text(packed: int) -> str:
    """``"MAJOR.MINOR"`` of a packed ``(MAJOR << 16) | MINOR`` version."""
    return f"{packed >> 16}.{packed & 0xFFFF}"


def _aligned_buffer(nbytes: int) -> tuple[ctypes.Array | None, int | None]:
    """(owning buffer, address aligned to WORKSPACE_ALIGNMENT) of ``nbytes`` zeroed bytes;
    (None, None) for 0 bytes."""
    if nbytes == 0:
        return None, None
    buffer = ctypes.create_string_buffer(nbytes + WORKSPACE_ALIGNMENT)
    address = ctypes.addressof(buffer)
    return buffer, address + (-address % WORKSPACE_ALIGNMENT)


class WrapperLauncher:
    """Launches the kernels of one loaded ``wrapper.so`` through the kernel launch ABI.

    Args:
        lib: the wrapper, as ``ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)``.
        label: names the kernel in error messages (e.g. ``"kernel k3"``).
        max_threads: thread cap passed with every launch (0 = each tiling's block_dim).

    Raises:
        AotpackError: the wrapper lacks an entry point or implements another kernel ABI MAJOR.
    """

    def __init__(self, lib: ctypes.CDLL, label: str, max_threads: int = 0):
        self.lib, self.label, self.max_threads = lib, label, max_threads
        try:
            lib.aotpack_kernel_abi_version.restype = ctypes.c_int32
            lib.aotpack_init.argtypes = [ctypes.c_char_p]
            lib.aotpack_tiling_info.argtypes = [ctypes.c_char_p, ctypes.POINTER(TilingInfoStruct)]
            lib.aotpack_launch.argtypes = [ctypes.c_char_p, ctypes.POINTER(KernelLaunch),
                                           ctypes.POINTER(ctypes.c_void_p)]
            lib.aotpack_release.argtypes = [ctypes.c_char_p]
            lib.aotpack_last_error.restype = ctypes.c_char_p
        except AttributeError as e:
            raise AotpackError(f"{label}: {lib._name} lacks the kernel launch ABI entry points ({e}); "
                               "it was built by another aotpack: remove it and build again") from None
        found = lib.aotpack_kernel_abi_version()
        if found >> 16 != KERNEL_ABI_VERSION_MAJOR:
            raise AotpackError(f"{label}: {lib._name} implements kernel ABI {version_text(found)}, aotpack "
                               f"implements {version_text(KERNEL_ABI_VERSION)} (the major must match); "
                               "remove it and build again")
        # kernel_key -> (launch struct, workspace buffer keeping it alive)
        self._launches: dict[str, tuple[KernelLaunch, ctypes.Array | None]] = {}

    def error(self) -> str:
        """The wrapper's last error message (empty when none)."""
        return (self.lib.aotpack_last_error() or b"").decode()

    def init(self, kernel_dir: str | Path) -> int:
        """Load every ``static_kernel/<kernel_key>/kernel.so`` present under ``kernel_dir``.

        Returns:
            the number of kernels loaded (>= 1).

        Raises:
            AotpackError: none was found, or one has another kernel ABI (wrapper's message).
        """
        loaded = self.lib.aotpack_init(str(kernel_dir).encode())
        if loaded < 1:
            raise AotpackError(f"{self.label}: {self.error()}")
        return loaded

    def tiling_info(self, key: str) -> TilingInfo:
        """The wrapper's TilingInfo of ``key`` (loaded or not).

        Raises:
            AotpackError: the wrapper does not know ``key``.
        """
        info = TilingInfoStruct(struct_size=ctypes.sizeof(TilingInfoStruct))
        if self.lib.aotpack_tiling_info(key.encode(), ctypes.byref(info)) != 0:
            raise AotpackError(f"{self.label}: {self.error()}")
        return TilingInfo(info.tiling_repr.decode(), int(info.workspace_bytes), int(info.block_dim))

    def _launch_struct(self, key: str) -> KernelLaunch:
        entry = self._launches.get(key)
        if entry is None:
            nbytes = self.tiling_info(key).workspace_bytes
            buffer, address = _aligned_buffer(nbytes)
            launch = KernelLaunch(struct_size=ctypes.sizeof(KernelLaunch), device_type=DEVICE_CPU, device_id=0,
                                  stream=None, workspace=address, workspace_bytes=nbytes,
                                  max_threads=self.max_threads)
            entry = self._launches[key] = (launch, buffer)
        return entry[0]

    def launch(self, key: str, args) -> None:
        """Run candidate ``key`` once on ``args``: data pointers of the kernel's inputs, then
        outputs (a list of ints or a ``ctypes.c_void_p`` array). Its workspace is allocated on
        the first launch of ``key`` and reused.

        Raises:
            AotpackError: ``key`` is not loaded, or the kernel refused the launch (wrapper's message).
        """
        if not isinstance(args, ctypes.Array):
            args = (ctypes.c_void_p * len(args))(*args)
        if self.lib.aotpack_launch(key.encode(), ctypes.byref(self._launch_struct(key)), args) != 0:
            raise AotpackError(f"{self.label}: {self.error()}")

    def release(self, keep_key: str) -> None:
        """Unload every candidate but ``keep_key`` and free their workspaces.

        Raises:
            AotpackError: ``keep_key`` is not loaded.
        """
        if self.lib.aotpack_release(keep_key.encode()) != 0:
            raise AotpackError(f"{self.label}: {self.error()}")
        self._launches = {k: v for k, v in self._launches.items() if k == keep_key}
