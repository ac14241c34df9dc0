"""``aotpack.load``: run an archive inside this Python process, tensors crossing without copies.

    model = aotpack.load("dist/mlp-0.1.0.aotpack")
    (y,) = model(x)        # torch tensors or numpy arrays in, a list of torch tensors out

The model is loaded through the C API of ``native/include/aotpack/runtime.h`` with ctypes
(``aotpack_model_load``, ``aotpack_model_manifest_json``, ...): that C API is the runtime's
stable boundary (opaque handles, status codes, a thread-local error message, no C++ types).
Each call goes through ``_aotpack_binding``, a small CPython extension built beside the
runtime library (``native/python/binding.cpp``) when Python's headers are there: it passes
the inputs' TensorImpls to ``aotpack_model_run_torch`` and wraps the outputs as torch
tensors in C++: views_cat takes 3.2-3.3 us per call, against 5.6 us through ctypes before
it (2 threads). It calls the runtime through the function addresses ctypes resolved, so
both always use the one library that loaded the model. Without the extension (no Python
headers when the runtime was built, another Python version, ``AOTPACK_BINDING=ctypes``) the
same path runs through ctypes. Either way the foreign call runs without the GIL, so threads run
concurrently up to the runtime's own per-model lock.

Per call (``benchmarks/call_overhead.py`` re-measures it): when every input is exactly a
CPU ``torch.Tensor``, its own c10::TensorImpl goes in (``Tensor._cdata``, one attribute
read; ``aotpack_model_run_torch``: the runtime shares this process's libtorch, so it
uses the caller's tensor itself, no DLPack export); anything else (numpy arrays,
subclasses, autograd or conjugate tensors, which the runtime refuses before running)
goes by DLPack: one export per input (torch's own exporter, two capsule calls that hand
its DLManagedTensorVersioned over). Then one ctypes call of the run without argtypes,
over pointer arrays the model keeps, and one capsule plus torch's importer per output.
The DLPack export and take of an input cost ~4 us from Python, and more after a kernel
that has evicted the interpreter's caches (views_cat: two inputs, ~33 us above the C
API's own run by DLPack, ~10 us by TensorImpl, measured interleaved at 1 thread).

Zero copy: inputs go in as the caller's own tensor or the producer's own DLPack export
(``__dlpack__``), which the runtime adopts; either way it keeps the memory alive while an
output views it, and it uses inputs in place when dtype, shape and strides match the
manifest and copies only other strides. Outputs come back as DLPack tensors that share
the runtime's memory (``torch.from_dlpack``); they stay valid after the model is closed.
As in eager PyTorch, an output that the model returns as a view of an input or of a
weight shares that memory.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import importlib.machinery
import importlib.util
import json
import logging
import os
import sysconfig
import threading
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from aotpack.archive import layout
from aotpack.config import ENV_BINDING
from aotpack.errors import AotpackError
from aotpack.runtime.native import find_runtime_library

# DLPack 1.x capsule names; a capsule keeps a pointer to its name, so these live forever.
_VERSIONED_NAME = ctypes.c_char_p(b"dltensor_versioned")
_USED_NAME = ctypes.c_char_p(b"used_dltensor_versioned")  # a consumer took ownership


class _DLManagedTensorVersioned(ctypes.Structure):
    """The head of DLManagedTensorVersioned (dlpack.h v1.x) up to dl_tensor.data."""

    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.CFUNCTYPE(None, ctypes.c_void_p)),
                ("flags", ctypes.c_uint64), ("data", ctypes.c_void_p)]


class _TensorSpec(ctypes.Structure):
    """``AotpackTensorSpec`` of runtime.h."""
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int64),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64))]


class _LoadOptions(ctypes.Structure):
    """``AotpackLoadOptions`` of runtime.h (fields only ever appended)."""
    _fields_ = [("struct_size", ctypes.c_uint32), ("device_limit", ctypes.c_int32),
                ("trusted_keys", ctypes.POINTER(ctypes.c_char_p)), ("num_trusted_keys", ctypes.c_int64),
                ("verify_archive", ctypes.c_int32), ("require_signature", ctypes.c_int32),
                ("cores", ctypes.POINTER(ctypes.c_int32)), ("num_cores", ctypes.c_int64),
                ("private_extraction", ctypes.c_int32)]


#: AotpackDType code -> torch dtype.
_DTYPES = {code: getattr(torch, name) for name, code in layout.DTYPE_CODES.items()}


class _RunStats(ctypes.Structure):
    _fields_ = [("runs", ctypes.c_int64), ("inputs_used", ctypes.c_int64),
                ("inputs_copied", ctypes.c_int64)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype, _capsule_new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p,
                                                                 ctypes.c_void_p]
_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype, _capsule_is_valid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
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
_NOT_PLAIN = 2


def _fast_capsule(value):
    """The DLPack 1.x capsule of a plain CPU tensor (the checks of ``Tensor.__dlpack__``
    that apply: no autograd, conjugate bit, subclass or non-strided layout), else None.

    ``is_cpu`` rather than ``device.type``: the latter builds a ``torch.device`` and its
    string on every call (~1.5 us of a ~3 us check, measured)."""
    if (type(value) is not torch.Tensor or _to_dlpack_versioned is None or not value.is_cpu
            or value.requires_grad or value.layout is not _STRIDED or value.is_conj()):
        return None
    return _to_dlpack_versioned(value)


def _impl_handles(tensors) -> list[int] | None:
    """The TensorImpl address of every input when all are exactly ``torch.Tensor`` (no
    subclass), else None (the DLPack path). The runtime checks the rest (device, layout,
    conjugate bit, autograd) and refuses with ``_NOT_PLAIN`` before running."""
    handles = []
    for value in tensors:
        if type(value) is not _TENSOR:
            return None
        handles.append(value._cdata)
    return handles


def _take(capsule) -> int:
    """The DLManagedTensorVersioned of a capsule, now owned by the caller (the capsule is
    renamed as used, so its destructor no longer frees it)."""
    pointer = _capsule_pointer(capsule, _VERSIONED_NAME)
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
#: Models not yet closed: closed at exit, so their extraction folders never stay behind.
_open_models: "weakref.WeakSet[Model]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for model in list(_open_models):
        model.close()


def _library() -> ctypes.CDLL:
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
                "aotpack_model_load_with": (i32, [ctypes.c_char_p, ctypes.POINTER(_LoadOptions),
                                                   ctypes.POINTER(p)]),
                "aotpack_model_free": (None, [p]),
                "aotpack_model_manifest_json": (i32, [p, ctypes.POINTER(ctypes.c_char_p)]),
                "aotpack_model_name": (i32, [p, ctypes.POINTER(ctypes.c_char_p)]),
                "aotpack_model_warnings": (i32, [p, ctypes.POINTER(ctypes.c_char_p)]),
                "aotpack_model_version": (i32, [p, ctypes.POINTER(ctypes.c_char_p)]),
                "aotpack_model_num_inputs": (i32, [p, ctypes.POINTER(i64)]),
                "aotpack_model_num_outputs": (i32, [p, ctypes.POINTER(i64)]),
                "aotpack_model_input_spec": (i32, [p, i64, ctypes.POINTER(_TensorSpec)]),
                "aotpack_model_output_spec": (i32, [p, i64, ctypes.POINTER(_TensorSpec)]),
                "aotpack_model_run_dlpack": (i32, [p, ctypes.POINTER(p), i64, ctypes.POINTER(p), i64]),
                "aotpack_model_run_torch": (i32, [p, ctypes.POINTER(p), i64, ctypes.POINTER(p), i64]),
                "aotpack_model_stats": (i32, [p, ctypes.POINTER(_RunStats)]),
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


def _binding():
    """``_aotpack_binding`` from the runtime library's folder (native/build, or aotpack/lib of
    a wheel), or None: not built, built for another Python, or ``$AOTPACK_BINDING=ctypes``."""
    global _binding_module, _binding_looked_for
    if os.environ.get(ENV_BINDING, "") == "ctypes":  # read at every load, not only the first
        return None
    with _library_lock:
        if not _binding_looked_for:
            _binding_looked_for = True
            _binding_module = _import_binding(find_runtime_library().parent)
        return _binding_module


def _import_binding(folder: Path):
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


def _last_error(lib: ctypes.CDLL) -> str:
    return lib.aotpack_last_error().decode("utf-8", "replace") or "unknown runtime error"


def live_runtime_tensors() -> int:
    """Outputs the runtime lent out by DLPack whose memory is still in use (all models).

    A diagnostic: it rises by one per output returned and falls when the last torch
    tensor viewing that memory is freed, which shows outputs are the runtime's memory,
    not copies, and that none leak."""
    return int(_library().aotpack_dlpack_live_tensors())


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of the model's signature (from manifest.json).

    shape and strides are in elements; the runtime accepts exactly this dtype and shape.
    """

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    @classmethod
    def from_manifest(cls, entry: dict) -> "TensorSpec":
        return cls(entry["name"], getattr(torch, entry["dtype"]), tuple(entry["shape"]),
                   tuple(entry["strides"]))

    @classmethod
    def from_runtime(cls, spec: _TensorSpec) -> "TensorSpec":
        """From the C API's ``AotpackTensorSpec`` (the runtime parsed the manifest)."""
        ndim, name = spec.ndim, spec.name.decode("utf-8")
        if spec.dtype not in _DTYPES:
            raise AotpackError(f"the runtime reports dtype code {spec.dtype} for '{name}', which this "
                               "aotpack does not know; use the aotpack the runtime was built with")
        return cls(name, _DTYPES[spec.dtype], tuple(spec.shape[:ndim]), tuple(spec.strides[:ndim]))


class _CtypesRunner:
    """One model's run path without ``_aotpack_binding``: the same interface as its
    ``Runner`` (``run``, ``enter``, ``leave``, ``close``), over ctypes.

    ``run`` passes the inputs' TensorImpls (``_impl_handles``) to ``aotpack_model_run_torch``
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
        impls = _impl_handles(tensors) if self._run_torch is not None else None
        if impls is None:
            return None
        with self._lock:  # enter() and a slot in one acquisition
            if self._closing:
                raise AotpackError(f"{self._name} is closed")
            self._active += 1
            slots = self._slots.pop() if self._slots else None
        if slots is None or len(slots[0]) < len(impls):
            slots = _new_slots(len(impls), self._num_outputs)
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
        if status == _NOT_PLAIN:
            return None
        if status:
            raise AotpackError(_last_error(self._lib))
        return _to_torch(pointers)


def _new_slots(num_inputs: int, num_outputs: int):
    return ((ctypes.c_void_p * max(num_inputs, 1))(), (ctypes.c_void_p * max(num_outputs, 1))())


def _runner(lib: ctypes.CDLL, handle: ctypes.c_void_p, num_outputs: int, name: str):
    """``_aotpack_binding.Runner`` over this model where the extension is there, else
    ``_CtypesRunner``."""
    binding = _binding()
    if binding is None:
        return _CtypesRunner(lib, handle, num_outputs, name)
    return binding.Runner(run_torch=_address(lib.aotpack_model_run_torch), last_error=_address(lib.aotpack_last_error),
                          model=handle.value, num_outputs=num_outputs, error_type=AotpackError, name=name)


def _address(function) -> int:
    """Where a function ctypes resolved lives in memory (what the extension calls)."""
    return ctypes.cast(function, ctypes.c_void_p).value


class Model:
    """A loaded archive; call it like a function. Use :func:`load` to create one.

    Thread-safe: several threads may call one model; the runtime serialises its runs
    (the model may write its buffers in place), and separate models run in parallel.
    """

    def __init__(self, path: str | Path, device_limit: int | None = None, *,
                 trusted_keys: Sequence[str | Path] = (), verify_archive: bool = False,
                 require_signature: bool = False, private_extraction: bool = False,
                 cores: Sequence[int] | str = ()):
        if device_limit is None:
            device_limit = 0
        elif isinstance(device_limit, bool) or not isinstance(device_limit, int) or device_limit < 1:
            raise AotpackError(f"device_limit must be a positive number of cores or None (the "
                               f"limit recorded at build time), got {device_limit!r}")
        self._lib = _library()
        self.path = Path(path)
        keys = [os.fsencode(k) for k in trusted_keys]
        options = _LoadOptions(struct_size=ctypes.sizeof(_LoadOptions), device_limit=device_limit,
                               trusted_keys=(ctypes.c_char_p * max(len(keys), 1))(*keys),
                               num_trusted_keys=len(keys), verify_archive=int(bool(verify_archive)),
                               require_signature=int(bool(require_signature)),
                               private_extraction=int(bool(private_extraction)))
        core_ids = _core_ids(cores)
        if core_ids:
            options.cores = (ctypes.c_int32 * len(core_ids))(*core_ids)
            options.num_cores = len(core_ids)
        handle = ctypes.c_void_p()
        if self._lib.aotpack_model_load_with(os.fsencode(self.path), ctypes.byref(options),
                                             ctypes.byref(handle)):
            raise AotpackError(_last_error(self._lib))
        self._handle = handle
        try:
            self._describe(handle)
            #: How the archive was signed, as checked at load (None: unsigned).
            self.signature: Signature | None = _signature(self._lib, handle)
            for line in filter(None, self._text(handle, "warnings").split("\n")):
                warnings.warn(line, RuntimeWarning, stacklevel=3)
        except BaseException:  # nothing else holds the handle yet
            self._lib.aotpack_model_free(handle)
            raise
        _open_models.add(self)

    def _describe(self, handle: ctypes.c_void_p) -> None:
        """The signature and names from the runtime's accessors, and the runner over ``handle``.

        Not from manifest.json: parsing it in Python (MobileNetV3-Small's is 132 KB, mostly
        file and tuning records) made a repeat load 8.3 instead of 7.5 ms; ``manifest``
        parses it when first read (its text is kept, so it can be read after ``close``)."""
        text = ctypes.c_char_p()
        if self._lib.aotpack_model_manifest_json(handle, ctypes.byref(text)):
            raise AotpackError(_last_error(self._lib))
        self._manifest_text: bytes = text.value
        #: The signature, in the order run() takes and returns tensors.
        self.inputs: list[TensorSpec] = self._specs(handle, "input")
        self.outputs: list[TensorSpec] = self._specs(handle, "output")
        self.name: str = self._text(handle, "name")
        self.version: str = self._text(handle, "version")
        # The DLPack door (numpy arrays, subclasses, autograd tensors), without argtypes as
        # the runner's: run() passes ready-made ctypes objects.
        self._run_dlpack = self._lib["aotpack_model_run_dlpack"]
        self._run_dlpack.restype = ctypes.c_int32
        self._num_outputs = ctypes.c_int64(len(self.outputs))
        #: Every use of the handle goes through it: the per-call path and the close protocol.
        self._runner = _runner(self._lib, handle, len(self.outputs), f"model '{self.name}' {self.version}")

    def _text(self, handle: ctypes.c_void_p, what: str) -> str:
        text = ctypes.c_char_p()
        if getattr(self._lib, f"aotpack_model_{what}")(handle, ctypes.byref(text)):
            raise AotpackError(_last_error(self._lib))
        return text.value.decode("utf-8")

    def _specs(self, handle: ctypes.c_void_p, kind: str) -> list[TensorSpec]:
        count, spec = ctypes.c_int64(), _TensorSpec()
        if getattr(self._lib, f"aotpack_model_num_{kind}s")(handle, ctypes.byref(count)):
            raise AotpackError(_last_error(self._lib))
        specs = []
        for index in range(count.value):
            if getattr(self._lib, f"aotpack_model_{kind}_spec")(handle, index, ctypes.byref(spec)):
                raise AotpackError(_last_error(self._lib))
            specs.append(TensorSpec.from_runtime(spec))
        return specs

    @functools.cached_property
    def manifest(self) -> dict:
        """manifest.json of the archive (docs/archive.md), parsed on first read; later reads
        return the same dict."""
        return json.loads(self._manifest_text.decode("utf-8"))

    @functools.cached_property
    def _mutated(self) -> set[str]:
        """Names of the inputs the model writes in place."""
        return set(self.manifest.get("mutated_inputs", []))

    def __repr__(self) -> str:
        signature = ", ".join(f"{s.name}: {str(s.dtype).removeprefix('torch.')}{list(s.shape)}"
                              for s in self.inputs)
        return f"<aotpack.Model {self.name} {self.version} ({signature})>"

    def _label(self, index: int) -> str:
        name = f" ('{self.inputs[index].name}')" if index < len(self.inputs) else ""
        return f"model '{self.name}' {self.version}: input {index}{name}"

    def _export(self, index: int, value):
        """The DLPack 1.x capsule of one input (kept alive by the caller during the run)."""
        if isinstance(value, torch.Tensor):
            value = value.detach()
        elif isinstance(value, np.ndarray):
            if any(stride < 0 for stride in value.strides):  # DLPack has no negative strides
                value = np.ascontiguousarray(value)
            if (not value.flags.writeable and index < len(self.inputs)
                    and self.inputs[index].name in self._mutated):
                raise AotpackError(f"{self._label(index)}: the model writes this input in place, but "
                                   "the array is read-only; pass a writeable copy")
        else:
            raise AotpackError(f"{self._label(index)}: expected a torch.Tensor or numpy.ndarray, got "
                               f"{type(value).__name__}")
        try:
            capsule = _fast_capsule(value) or value.__dlpack__(max_version=(1, 0))
        except (BufferError, RuntimeError, TypeError, ValueError) as exc:
            raise AotpackError(f"{self._label(index)}: cannot be passed by DLPack: {exc}") from None
        if not _capsule_is_valid(capsule, _VERSIONED_NAME):
            raise AotpackError(f"{self._label(index)}: its DLPack export is not versioned (DLPack "
                               "1.x); upgrade torch or numpy")
        return capsule

    def run(self, *tensors) -> list[torch.Tensor]:
        """Run once.

        Args:
            tensors: one CPU torch.Tensor or numpy.ndarray per input, in manifest order,
                with exactly the dtype and shape of ``self.inputs`` (any strides; those of
                the manifest are used without a copy).

        Returns:
            One torch tensor per output, in manifest order, sharing the runtime's memory.

        Raises:
            AotpackError: wrong number of inputs, wrong type, dtype, shape or device, a
                closed model, or a failure inside the model; one line naming the model
                and the input.
        """
        outputs = self._runner.run(*tensors)
        return self._run_capsules(tensors) if outputs is None else outputs

    __call__ = run

    @contextlib.contextmanager
    def _holding(self):
        """The handle in use for the block (``close`` waits for it; raises once closed)."""
        self._runner.enter()
        try:
            yield self._handle
        finally:
            self._runner.leave()

    def _run_capsules(self, tensors) -> list[torch.Tensor]:
        """Run on DLPack exports of the inputs (numpy arrays, subclasses, autograd tensors)."""
        with self._holding() as handle:
            capsules = []
            for index, value in enumerate(tensors):
                capsule = _fast_capsule(value)  # plain CPU tensors: no further checks needed
                capsules.append(self._export(index, value) if capsule is None else capsule)
            inputs, outputs = _new_slots(len(capsules), len(self.outputs))
            for i, capsule in enumerate(capsules):  # the runtime owns the inputs from here on
                inputs[i] = _take(capsule)
            if self._run_dlpack(handle, inputs, ctypes.c_int64(len(capsules)), outputs, self._num_outputs):
                raise AotpackError(_last_error(self._lib))
            pointers = outputs[:len(self.outputs)]
        return _to_torch(pointers)

    def stats(self) -> dict[str, int]:
        """Counters since load: ``runs``, ``inputs_used`` (passed in place, no copy) and
        ``inputs_copied`` (copied into the manifest's strides first)."""
        stats = _RunStats()
        with self._holding() as handle:
            if self._lib.aotpack_model_stats(handle, ctypes.byref(stats)):
                raise AotpackError(_last_error(self._lib))
        return {"runs": stats.runs, "inputs_used": stats.inputs_used, "inputs_copied": stats.inputs_copied}

    def close(self) -> None:
        """Unload the model (waits for running calls). Outputs already returned stay valid."""
        runner = getattr(self, "_runner", None)
        if runner is not None and runner.close():
            self._lib.aotpack_model_free(self._handle)

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self.close()


#: aotpack_model_signature's states (runtime.h AOTPACK_SIGNATURE_*).
_SIGNATURE_NONE, _SIGNATURE_UNCHECKED, _SIGNATURE_VERIFIED = 0, 1, 2


@dataclass(frozen=True)
class Signature:
    """How a loaded archive was signed (``Model.signature``; None for an unsigned one).

    ``verified``: checked against a trusted key (``trusted_keys=``/AOTPACK_TRUSTED_KEYS);
    False when the archive carries a signature but no key was given to check it, and then
    ``key_path`` and ``key_sha256`` are None. ``key_path``: the trusted key that verified
    it, as it was given. ``key_sha256``: that key's fingerprint, the hex sha256 of its DER
    SubjectPublicKeyInfo (``openssl pkey -pubin -in KEY.pub.pem -outform DER | sha256sum``).
    """

    verified: bool
    key_path: str | None = None
    key_sha256: str | None = None


def _signature(lib: ctypes.CDLL, handle: ctypes.c_void_p) -> Signature | None:
    state, path, fingerprint = ctypes.c_int32(), ctypes.c_char_p(), ctypes.c_char_p()
    if lib.aotpack_model_signature(handle, ctypes.byref(state), ctypes.byref(path), ctypes.byref(fingerprint)):
        raise AotpackError(_last_error(lib))
    if state.value == _SIGNATURE_NONE:
        return None
    if state.value == _SIGNATURE_UNCHECKED:
        return Signature(verified=False)
    return Signature(True, os.fsdecode(path.value), fingerprint.value.decode("ascii"))


def read_npy(path: str | Path) -> torch.Tensor:
    """A ``.npy`` file as a torch tensor, read by the runtime's own reader
    (``aotpack_npy_load``, the one aotpack-run uses): the same checks and messages, 0-dim
    arrays stay 0-dim, nothing is allocated before the header's size matched the file's.

    Raises:
        AotpackError: one line naming the file and the problem (runtime.h lists them).
    """
    lib = _library()
    managed = ctypes.c_void_p()
    if lib.aotpack_npy_load(os.fsencode(path), ctypes.byref(managed)):
        raise AotpackError(_last_error(lib))
    return _to_torch([managed.value])[0]


def _to_torch(pointers: list[int]) -> list[torch.Tensor]:
    """torch tensors over DLManagedTensorVersioned the runtime handed out; frees what it
    cannot convert, so nothing leaks on error."""
    tensors = []
    for number, pointer in enumerate(pointers):
        capsule = _capsule_new(pointer, _VERSIONED_NAME, None)
        try:
            tensors.append(_from_dlpack(capsule))
        except BaseException:
            for rest in [capsule, *[_capsule_new(p, _VERSIONED_NAME, None) for p in pointers[number + 1:]]]:
                if _capsule_is_valid(rest, _VERSIONED_NAME):  # not taken over by torch
                    managed = _DLManagedTensorVersioned.from_address(_capsule_pointer(rest, _VERSIONED_NAME))
                    managed.deleter(ctypes.addressof(managed))
            raise
    return tensors


def _core_ids(cores: Sequence[int] | str) -> list[int]:
    """``cores`` as a list of CPU ids: a sequence of ints or a cpulist string ("0-3,6")."""
    if isinstance(cores, str):
        ids = []
        try:
            for part in filter(None, cores.split(",")):
                first, _, last = part.partition("-")
                ids += range(int(first), int(last or first) + 1)
        except ValueError:
            raise AotpackError(f"cores must be CPU ids like '0-3,6', got {cores!r}") from None
        return ids
    if any(isinstance(c, bool) or not isinstance(c, int) for c in cores):
        raise AotpackError(f"cores must be CPU ids (ints), got {list(cores)!r}")
    return list(cores)


def load(path: str | Path, device_limit: int | None = None, *,
         trusted_keys: Sequence[str | Path] = (), verify_archive: bool = False,
         require_signature: bool = False, private_extraction: bool = False,
         cores: Sequence[int] | str = ()) -> Model:
    """Verify, extract and load an archive into this process (libaotpack_runtime).

    Args:
        path: the ``.aotpack`` file.
        device_limit: cores the kernels may use; None = the limit recorded at build time.
        trusted_keys: Ed25519 public keys (PEM files), in addition to AOTPACK_TRUSTED_KEYS's;
            with any key set the archive must carry a valid signature by one of them.
        verify_archive: read and check every byte of the archive even when its
            extraction-cache entry exists.
        require_signature: refuse the load unless trusted keys are set (also
            AOTPACK_REQUIRE_SIGNATURE=1). ``Model.signature`` says how it was signed.
        private_extraction: extract to a private folder removed when the model is freed;
            the extraction cache is neither read nor written (a build's check of its archive).
        cores: a core partition (CPU ids, or a cpulist such as "0-3"): the model's runs
            execute on a thread of its own pinned to these cores, and its kernels and ATen's
            intra-op threads (that thread's worker team) use exactly that many threads, on
            them only. The device limit is their number; an archive tuned for another
            ``--device-limit`` loads with a RuntimeWarning. Empty = not pinned.

    Raises:
        AotpackError: the runtime library is missing (the message says how to build it)
            or the archive fails a check (checksums, torch version, CPU features, ABI).
    """
    return Model(path, device_limit, trusted_keys=trusted_keys, verify_archive=verify_archive,
                 require_signature=require_signature, private_extraction=private_extraction, cores=cores)
