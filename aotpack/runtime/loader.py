"""``aotpack.load``: run an archive inside this Python process, tensors crossing without copies.

    model = aotpack.load("dist/mlp-0.1.0.aotpack")
    (y,) = model(x)        # torch tensors or numpy arrays in, a list of torch tensors out

The model is loaded through the C API of ``native/include/aotpack/runtime.h`` with ctypes
(``aotpack_model_load``, ``aotpack_model_manifest_json``, ...; its mirror is ``c_api``): that C API is the runtime's
stable boundary (opaque handles, status codes, a thread-local error message, no C++ types).
Each call goes through ``_aotpack_binding``, a small CPython extension built beside the
runtime library (``native/python/binding.cpp``) when Python's headers are there: it passes
the inputs' TensorImpls to ``aotpack_model_run_torch`` and wraps the outputs as torch
tensors in C++, which cuts the per-call cost (docs/measurements.md, "In-process calls").
It calls the runtime through the function addresses ctypes resolved, so
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
A DLPack export and take costs several times the TensorImpl path per input
(docs/measurements.md, "In-process calls").

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
import json
import os
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from aotpack.errors import AotpackError
from aotpack.runtime import c_api

#: Models not yet closed: closed at exit, so their extraction folders never stay behind.
_open_models: "weakref.WeakSet[Model]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for model in list(_open_models):
        model.close()


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
    def from_runtime(cls, spec: c_api.CTensorSpec) -> "TensorSpec":
        """From the C API's ``AotpackTensorSpec`` (the runtime parsed the manifest)."""
        ndim, name = spec.ndim, spec.name.decode("utf-8")
        if spec.dtype not in c_api.DTYPES:
            raise AotpackError(f"the runtime reports dtype code {spec.dtype} for '{name}', which this "
                               "aotpack does not know; use the aotpack the runtime was built with")
        return cls(name, c_api.DTYPES[spec.dtype], tuple(spec.shape[:ndim]), tuple(spec.strides[:ndim]))

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
        self._lib = c_api.library()
        self.path = Path(path)
        keys = [os.fsencode(k) for k in trusted_keys]
        options = c_api.LoadOptions(struct_size=ctypes.sizeof(c_api.LoadOptions), device_limit=device_limit,
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
            raise AotpackError(c_api.last_error(self._lib))
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

        Not from manifest.json: parsing it in Python (mostly file and tuning records) slowed
        a repeat load (docs/measurements.md, "In-process calls"); ``manifest`` parses it
        when first read (its text is kept, so it can be read after ``close``)."""
        text = ctypes.c_char_p()
        if self._lib.aotpack_model_manifest_json(handle, ctypes.byref(text)):
            raise AotpackError(c_api.last_error(self._lib))
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
        self._runner = c_api.runner(self._lib, handle, len(self.outputs), f"model '{self.name}' {self.version}")

    def _text(self, handle: ctypes.c_void_p, what: str) -> str:
        text = ctypes.c_char_p()
        if getattr(self._lib, f"aotpack_model_{what}")(handle, ctypes.byref(text)):
            raise AotpackError(c_api.last_error(self._lib))
        return text.value.decode("utf-8")

    def _specs(self, handle: ctypes.c_void_p, kind: str) -> list[TensorSpec]:
        count, spec = ctypes.c_int64(), c_api.CTensorSpec()
        if getattr(self._lib, f"aotpack_model_num_{kind}s")(handle, ctypes.byref(count)):
            raise AotpackError(c_api.last_error(self._lib))
        specs = []
        for index in range(count.value):
            if getattr(self._lib, f"aotpack_model_{kind}_spec")(handle, index, ctypes.byref(spec)):
                raise AotpackError(c_api.last_error(self._lib))
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
            capsule = c_api.fast_capsule(value) or value.__dlpack__(max_version=(1, 0))
        except (BufferError, RuntimeError, TypeError, ValueError) as exc:
            raise AotpackError(f"{self._label(index)}: cannot be passed by DLPack: {exc}") from None
        if not c_api.capsule_is_valid(capsule, c_api.VERSIONED_NAME):
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
                capsule = c_api.fast_capsule(value)  # plain CPU tensors: no further checks needed
                capsules.append(self._export(index, value) if capsule is None else capsule)
            inputs, outputs = c_api.new_slots(len(capsules), len(self.outputs))
            for i, capsule in enumerate(capsules):  # the runtime owns the inputs from here on
                inputs[i] = c_api.take(capsule)
            if self._run_dlpack(handle, inputs, ctypes.c_int64(len(capsules)), outputs, self._num_outputs):
                raise AotpackError(c_api.last_error(self._lib))
            pointers = outputs[:len(self.outputs)]
        return c_api.to_torch(pointers)

    def stats(self) -> dict[str, int]:
        """Counters since load: ``runs``, ``inputs_used`` (passed in place, no copy) and
        ``inputs_copied`` (copied into the manifest's strides first)."""
        stats = c_api.RunStats()
        with self._holding() as handle:
            if self._lib.aotpack_model_stats(handle, ctypes.byref(stats)):
                raise AotpackError(c_api.last_error(self._lib))
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
        raise AotpackError(c_api.last_error(lib))
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
    lib = c_api.library()
    managed = ctypes.c_void_p()
    if lib.aotpack_npy_load(os.fsencode(path), ctypes.byref(managed)):
        raise AotpackError(c_api.last_error(lib))
    return c_api.to_torch([managed.value])[0]



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
