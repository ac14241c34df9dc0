"""The runtime's C API (``native/include/aotpack/runtime.h``) seen from Python through ctypes:
its structs, the library with its functions' signatures declared, the ``_aotpack_binding``
extension beside it, the DLPack capsule plumbing, and the per-call runner used when the
extension is absent (``CtypesRunner``). ``loader.Model`` is built on these.
"""
from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import logging
import sysconfig
import threading
from pathlib import Path

import torch

from aotpack.archive import layout
from aotpack import env
from aotpack.errors import AotpackError
from aotpack.runtime.native import find_runtime_library

# DLPack 1.x capsule names; a capsule keeps a pointer to its name, so these live forever.
VERSIONED_NAME = ctypes.c_char_p(b"dltensor_versioned")
_USED_NAME = ctypes.c_char_p(b"used_dltensor_versioned")  # a consumer took ownership


class DLManagedTensorVersioned(ctypes.Structure):
    """The head of DLManagedTensorVersioned (dlpack.h v1.x) up to dl_tensor.data."""

    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.CFUNCTYPE(None, ctypes.c_void_p)),
                ("flags", ctypes.c_uint64), ("data", ctypes.c_void_p)]


class CTensorSpec(ctypes.Structure):
    """``AotpackTensorSpec`` of runtime.h."""
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int64),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64))]


class LoadOptions(ctypes.Structure):
    """``AotpackLoadOptions`` of runtime.h (fields only ever appended)."""
    _fields_ = [("struct_size", ctypes.c_uint32), ("device_limit", ctypes.c_int32),
                ("trusted_keys", ctypes.POINTER(ctypes.c_char_p)), ("num_trusted_keys", ctypes.c_int64),
                ("verify_archive", ctypes.c_int32), ("require_signature", ctypes.c_int32),
                ("cores", ctypes.POINTER(ctypes.c_int32)), ("num_cores", ctypes.c_int64),
                ("private_extraction", ctypes.c_int32)]


#: AotpackDType code -> torch dtype.
DTYPES = {code: getattr(torch, name) for name, code in layout.DTYPE_CODES.items()}


class RunStats(ctypes.Structure):
    _fields_ = [("runs", ctypes.c_int64), ("inputs_used", ctypes.c_int64),
                ("inputs_copied", ctypes.c_int64)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype, _capsule_new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p,
                                                                 ctypes.c_void_p]
capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
capsule_is_valid.restype, capsule_is_valid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
_capsule_set_name = ctypes.pythonapi.PyCapsule_SetName
_capsule_set_name.restype, _capsule_set_name.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]


#: torch's own exporter, which ``Tensor.__dlpack__`` calls after its checks (~1 us here
#: against ~7 us through ``__dlpack__``, a third of a small model's call); private, so
#: only used when present.
_to_dlpack_versioned = getattr(torch._C, "_to_dlpack_versioned", None)
#: torch's own importer of a capsule, which ``torch.from_dlpack`` calls after telling a
#: capsule from an object with ``__dlpack__`` (~0.5 us saved per output); private, so only
#: used when present.
_from_dlpack = getattr(torch._C, "_from_dlpack", None) or torch.from_dlpack
#: Whether ``Tensor._cdata`` (the tensor's c10::TensorImpl* as an int; private, so the fast
#: path is only taken when present) is there: what ``aotpack_model_run_torch`` takes,
#: ~0.2 us per input against ~4 us for a DLPack export and its take.
_HAS_CDATA = hasattr(torch.Tensor, "_cdata")
_STRIDED = torch.strided
_TENSOR = torch.Tensor
#: aotpack_model_run_torch: an input is not a plain dense CPU tensor; pass them by DLPack.
NOT_PLAIN = 2


def fast_capsule(value):
    """The DLPack 1.x capsule of a plain CPU tensor (the checks of ``Tensor.__dlpack__``
    that apply: no autograd, conjugate bit, subclass or non-strided layout), else None.

    ``is_cpu`` rather than ``device.type``: the latter builds a ``torch.device`` and its
    string on every call (~1.5 us of a ~3 us check, measured)."""
    if (type(value) is not torch.Tensor or _to_dlpack_versioned is None or not value.is_cpu
            or value.requires_grad or value.layout is not _STRIDED or value.is_conj()):
        return None
    return _to_dlpack_versioned(value)


def impl_handles(tensors) -> list[int] | None:
    """The TensorImpl address of every input when all are exactly ``torch.Tensor`` (no
    subclass), else None (the DLPack path). The runtime checks the rest (device, layout,
    conjugate bit, autograd) and refuses with ``NOT_PLAIN`` before running."""
    handles = []
    for value in tensors:
        if type(value) is not _TENSOR:
            return None
        handles.append(value._cdata)
    return handles


def take(capsule) -> int:
    """The DLManagedTensorVersioned of a capsule, now owned by the caller (the capsule is
    renamed as used, so its destructor no longer frees it)."""
    pointer = _capsule_pointer(capsule, VERSIONED_NAME)
    _capsule_set_name(capsule, _USED_NAME)
    return pointer


_library_lock = threading.Lock()
_library_handle: ctypes.CDLL | None = None
log = logging.getLogger("aotpack")
BINDING_NAME = "_aotpack_binding"
#: The extension module beside the runtime library, once looked for (None: not there or not
#: importable, so ctypes runs every call).
_binding_module = None
_binding_looked_for = False


def library() -> ctypes.CDLL:
    """libaotpack_runtime, loaded once per process with its C API's signatures declared."""
    global _library_handle
    with _library_lock:
        if _library_handle is None:
            path = find_runtime_library()
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as exc:
                raise AotpackError(f"cannot load {path}: {exc}; rebuild it against this torch "
                                   "(`make runtime`)") from None
            p, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
            signatures = {
                "aotpack_last_error": (ctypes.c_char_p, []),
                "aotpack_model_load_with": (i32, [ctypes.c_char_p, ctypes.POINTER(LoadOptions),
                                                   ctypes.POINTER(p)]),
                "aotpack_model_free": (None, [p]),
                "aotpack_model_manifest_json": (i32, [p, ctypes.POINTER(ctypes.c_char_p)]),
                "aotpack_model_name": (i32, [p, ctypes.POINTER(ctypes.c_char_p)]),
                "aotpack_model_warnings": (i32, [p, ctypes.POINTER(ctypes.c_char_p)]),
                "aotpack_model_version": (i32, [p, ctypes.POINTER(ctypes.c_char_p)]),
                "aotpack_model_num_inputs": (i32, [p, ctypes.POINTER(i64)]),
                "aotpack_model_num_outputs": (i32, [p, ctypes.POINTER(i64)]),
                "aotpack_model_input_spec": (i32, [p, i64, ctypes.POINTER(CTensorSpec)]),
                "aotpack_model_output_spec": (i32, [p, i64, ctypes.POINTER(CTensorSpec)]),
                "aotpack_model_run_dlpack": (i32, [p, ctypes.POINTER(p), i64, ctypes.POINTER(p), i64]),
                "aotpack_model_run_torch": (i32, [p, ctypes.POINTER(p), i64, ctypes.POINTER(p), i64]),
                "aotpack_model_stats": (i32, [p, ctypes.POINTER(RunStats)]),
                "aotpack_dlpack_live_tensors": (i64, []),
                "aotpack_npy_load": (i32, [ctypes.c_char_p, ctypes.POINTER(p)]),
                "aotpack_model_signature": (i32, [p, ctypes.POINTER(i32), ctypes.POINTER(ctypes.c_char_p),
                                                   ctypes.POINTER(ctypes.c_char_p)]),
            }
            for name, (restype, argtypes) in signatures.items():
                try:
                    function = getattr(lib, name)
                except AttributeError:
                    raise AotpackError(f"{path} does not export {name}; it is older than this aotpack, "
                                       "rebuild it (`make runtime`)") from None
                function.restype, function.argtypes = restype, argtypes
            _library_handle = lib
        return _library_handle


def binding():
    """``_aotpack_binding`` from the runtime library's folder (native/build, or aotpack/lib of
    a wheel), or None: not built, built for another Python, or ``$AOTPACK_BINDING=ctypes``."""
    global _binding_module, _binding_looked_for
    if env.get(env.BINDING) == "ctypes":  # read at every load, not only the first
        return None
    with _library_lock:
        if not _binding_looked_for:
            _binding_looked_for = True
            _binding_module = import_binding(find_runtime_library().parent)
        return _binding_module


def import_binding(folder: Path):
    path = folder / f"{BINDING_NAME}{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not path.is_file():
        log.debug("%s not found: aotpack.load calls the runtime through ctypes", path)
        return None
    try:
        loader = importlib.machinery.ExtensionFileLoader(BINDING_NAME, str(path))
        spec = importlib.util.spec_from_file_location(BINDING_NAME, path, loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except Exception as exc:  # e.g. built against another torch: ctypes still works
        log.warning("cannot import %s (%s); aotpack.load calls the runtime through ctypes "
                    "(~2.5 us more per call); rebuild it with `make runtime`", path, exc)
        return None
    return module


def last_error(lib: ctypes.CDLL) -> str:
    return lib.aotpack_last_error().decode("utf-8", "replace") or "unknown runtime error"


def live_runtime_tensors() -> int:
    """Outputs the runtime lent out by DLPack whose memory is still in use (all models).

    A diagnostic: it rises by one per output returned and falls when the last torch
    tensor viewing that memory is freed, which shows outputs are the runtime's memory,
    not copies, and that none leak."""
    return int(library().aotpack_dlpack_live_tensors())
class CtypesRunner:
    """One model's run path without ``_aotpack_binding``: the same interface as its
    ``Runner`` (``run``, ``enter``, ``leave``, ``close``), over ctypes.

    ``run`` passes the inputs' TensorImpls (``impl_handles``) to ``aotpack_model_run_torch``
    and returns the outputs, or None when an input must go by DLPack (nothing ran).
    ``enter`` / ``leave`` bracket any other use of the handle; ``close`` waits for them and
    returns True for the first close (its caller frees the handle)."""

    def __init__(self, lib: ctypes.CDLL, handle: ctypes.c_void_p, num_outputs: int, name: str):
        self._lib, self._handle, self._name = lib, handle, name
        # The entry point without argtypes: run() passes ready-made ctypes objects (the
        # handle, pointer arrays, int64 counts), so no per-argument conversion is needed.
        self._run_torch = lib["aotpack_model_run_torch"] if _HAS_CDATA else None
        if self._run_torch is not None:
            self._run_torch.restype = ctypes.c_int32
        self._num_outputs = num_outputs
        self._count = ctypes.c_int64(num_outputs)
        # _lock guards _active, _closing and _slots; close() waits on _state (over the same
        # lock). A plain Lock, not the Condition's Python-level __enter__: ~0.2 against
        # ~0.7 us per acquisition, twice a call.
        self._lock = threading.Lock()
        self._state = threading.Condition(self._lock)
        self._active = 0
        self._closing = False
        #: Idle (input, output) pointer arrays, reused so a call allocates none; a call
        #: that finds none (another thread holds them) makes its own.
        self._slots: list = []

    def enter(self) -> None:
        with self._lock:
            if self._closing:
                raise AotpackError(f"{self._name} is closed")
            self._active += 1

    def leave(self) -> None:
        with self._lock:
            self._active -= 1
            if self._closing:
                self._state.notify_all()

    def close(self) -> bool:
        with self._state:
            first, self._closing = not self._closing, True
            while self._active:
                self._state.wait()
        return first

    def run(self, *tensors) -> list[torch.Tensor] | None:
        impls = impl_handles(tensors) if self._run_torch is not None else None
        if impls is None:
            return None
        with self._lock:  # enter() and a slot in one acquisition
            if self._closing:
                raise AotpackError(f"{self._name} is closed")
            self._active += 1
            slots = self._slots.pop() if self._slots else None
        if slots is None or len(slots[0]) < len(impls):
            slots = new_slots(len(impls), self._num_outputs)
        inputs, outputs = slots
        inputs[:len(impls)] = impls
        try:
            status = self._run_torch(self._handle, inputs, ctypes.c_int64(len(impls)), outputs, self._count)
            pointers = outputs[:self._num_outputs]
        finally:
            with self._lock:  # leave() and the slot back in one acquisition
                self._active -= 1
                self._slots.append(slots)
                if self._closing:
                    self._state.notify_all()
        if status == NOT_PLAIN:
            return None
        if status:
            raise AotpackError(last_error(self._lib))
        return to_torch(pointers)


def new_slots(num_inputs: int, num_outputs: int):
    return ((ctypes.c_void_p * max(num_inputs, 1))(), (ctypes.c_void_p * max(num_outputs, 1))())


def runner(lib: ctypes.CDLL, handle: ctypes.c_void_p, num_outputs: int, name: str):
    """``_aotpack_binding.Runner`` over this model where the extension is there, else
    ``CtypesRunner``."""
    module = binding()
    if module is None:
        return CtypesRunner(lib, handle, num_outputs, name)
    return module.Runner(run_torch=_address(lib.aotpack_model_run_torch), last_error=_address(lib.aotpack_last_error),
                          model=handle.value, num_outputs=num_outputs, error_type=AotpackError, name=name)


def _address(function) -> int:
    """Where a function ctypes resolved lives in memory (what the extension calls)."""
    return ctypes.cast(function, ctypes.c_void_p).value

def to_torch(pointers: list[int]) -> list[torch.Tensor]:
    """torch tensors over DLManagedTensorVersioned the runtime handed out; frees what it
    cannot convert, so nothing leaks on error."""
    tensors = []
    for number, pointer in enumerate(pointers):
        capsule = _capsule_new(pointer, VERSIONED_NAME, None)
        try:
            tensors.append(_from_dlpack(capsule))
        except BaseException:
            for rest in [capsule, *[_capsule_new(p, VERSIONED_NAME, None) for p in pointers[number + 1:]]]:
                if capsule_is_valid(rest, VERSIONED_NAME):  # not taken over by torch
                    managed = DLManagedTensorVersioned.from_address(_capsule_pointer(rest, VERSIONED_NAME))
                    managed.deleter(ctypes.addressof(managed))
            raise
    return tensors
