"""The per-call path of aotpack.load: plain torch tensors passed as their own TensorImpl
(aotpack_model_run_torch), the fast DLPack export for the rest, reused call slots, and the
C API's ownership of DLPack inputs on every error (runtime.h: the consumer rule)."""
from __future__ import annotations

import ctypes
import sysconfig
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import aotpack
from aotpack.runtime import c_api
from aotpack.errors import AotpackError
from helpers import MODELS



@pytest.fixture(scope="module", params=["binding", "ctypes"])
def add_one(build_model, request):
    """The model through _aotpack_binding, then through ctypes alone (no extension)."""
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "ctypes":
            patch.setattr(c_api, "binding", lambda: None)
        with aotpack.load(build_model(MODELS / "add_one.py").archive, device_limit=1) as model:
            assert type(model._runner).__name__ == {"binding": "Runner", "ctypes": "CtypesRunner"}[request.param]
            yield model


def test_the_binding_is_built_beside_the_runtime_library_and_used():
    binding = c_api.binding()
    assert binding is not None and binding.__name__ == "_aotpack_binding"
    assert Path(binding.__file__).parent == c_api.find_runtime_library().parent


def test_fast_capsule_only_for_plain_cpu_tensors():
    plain = torch.ones(2)
    capsule = c_api.fast_capsule(plain)
    assert c_api.capsule_is_valid(capsule, c_api.VERSIONED_NAME) == 1
    assert c_api.fast_capsule(torch.ones(2, requires_grad=True)) is None
    assert c_api.fast_capsule(torch.nn.Parameter(torch.ones(2))) is None  # a subclass
    assert c_api.fast_capsule(torch.ones(2, dtype=torch.complex64).conj()) is None
    assert c_api.fast_capsule(torch.ones(2).to_sparse()) is None
    assert c_api.fast_capsule(torch.ones(2, device="meta")) is None
    assert c_api.fast_capsule(np.ones(2, dtype=np.float32)) is None


def test_impl_handles_only_when_every_input_is_a_plain_tensor():
    x, y = torch.ones(2), torch.zeros(3)
    assert c_api.impl_handles((x, y)) == [x._cdata, y._cdata]
    assert c_api.impl_handles(()) == []
    assert c_api.impl_handles((x, torch.nn.Parameter(torch.ones(2)))) is None  # a subclass
    assert c_api.impl_handles((x, np.ones(2, dtype=np.float32))) is None


def test_plain_tensors_take_the_tensor_door_and_the_rest_dlpack(add_one, monkeypatch):
    doors = []
    runner, by_dlpack = add_one._runner, add_one._run_capsules

    class Counted:  # the runner's interface, recording what each call did
        enter, leave, close = runner.enter, runner.leave, runner.close

        def run(self, *tensors):
            outputs = runner.run(*tensors)
            doors.append("tensor" if outputs is not None else "refused")
            return outputs

    def dlpack(tensors):
        doors.append("dlpack")
        return by_dlpack(tensors)

    monkeypatch.setattr(add_one, "_runner", Counted())
    monkeypatch.setattr(add_one, "_run_capsules", dlpack)
    x = torch.arange(16.0).reshape(4, 4)
    cases = [(x, ["tensor"]), (x.t().contiguous().t(), ["tensor"]),
             (x.clone().requires_grad_(), ["refused", "dlpack"]),
             (torch.nn.Parameter(x.clone()), ["refused", "dlpack"]),
             (torch.nn.Parameter(x.clone(), requires_grad=False), ["refused", "dlpack"]),
             (x.numpy(), ["refused", "dlpack"])]
    for value, expected in cases:
        doors.clear()
        (y,) = add_one(value)
        assert torch.equal(y, x + 1) and doors == expected


@pytest.mark.parametrize("kind", ["autograd", "conjugate", "negative", "sparse", "meta", "subclass"])
def test_c_api_tensor_door_refuses_what_is_not_plain_before_running(add_one, kind):
    value = {"autograd": lambda: torch.zeros(4, 4, requires_grad=True),
             "conjugate": lambda: torch.zeros(4, 4, dtype=torch.complex64).conj(),
             "negative": lambda: torch.zeros(4, 4, dtype=torch.complex64).conj().imag,
             "sparse": lambda: torch.zeros(4, 4).to_sparse(),
             "meta": lambda: torch.zeros(4, 4, device="meta"),
             "subclass": lambda: torch.nn.Parameter(torch.zeros(4, 4))}[kind]()
    lib = c_api.library()
    runs = add_one.stats()["runs"]
    outputs = (ctypes.c_void_p * 1)(12345)
    status = lib.aotpack_model_run_torch(add_one._handle, (ctypes.c_void_p * 1)(value._cdata), 1, outputs, 1)
    assert (status, c_api.last_error(lib)) == (
        c_api.NOT_PLAIN, "input 0 is not a plain dense CPU tensor; pass it by DLPack")
    assert outputs[0] is None and add_one.stats()["runs"] == runs  # nothing ran, nothing written


def test_c_api_tensor_door_errors_name_the_model(add_one):
    lib = c_api.library()
    x = torch.zeros(4, 4)
    inputs, outputs = (ctypes.c_void_p * 1)(x._cdata), (ctypes.c_void_p * 2)()
    assert lib.aotpack_model_run_torch(None, inputs, 1, outputs, 1) == 1
    assert c_api.last_error(lib) == "NULL model handle"
    assert lib.aotpack_model_run_torch(add_one._handle, inputs, 1, outputs, 2) == 1
    assert c_api.last_error(lib) == "model 'add_one' 0.1.0: the model has 1 output(s), the caller passed 2 slot(s)"
    assert lib.aotpack_model_run_torch(add_one._handle, (ctypes.c_void_p * 1)(), 1, outputs, 1) == 1
    assert c_api.last_error(lib) == "model 'add_one' 0.1.0: input 0 ('x'): NULL tensor"
    assert list(outputs) == [None, None]


def test_every_input_kind_gives_exact_values(add_one):
    x = torch.arange(16.0).reshape(4, 4)
    expected = x + 1
    column_major = x.t().contiguous().t()          # same values, other strides: copied
    cases = [x, x.clone().requires_grad_(), torch.nn.Parameter(x.clone()), x.numpy(), column_major,
             torch.arange(32.0).reshape(4, 8)[:, ::2] - torch.arange(32.0).reshape(4, 8)[:, ::2] + x]
    before = add_one.stats()
    for value in cases:
        (y,) = add_one(value)
        assert type(y) is torch.Tensor and not y.requires_grad
        assert torch.equal(y, expected)
    after = add_one.stats()
    assert after["runs"] - before["runs"] == 6
    assert after["inputs_used"] - before["inputs_used"] == 5
    assert after["inputs_copied"] - before["inputs_copied"] == 1


def test_refused_inputs_are_named_and_the_model_stays_usable(add_one):
    x = torch.zeros(4, 4)
    cases = [
        ((), "model 'add_one' 0.1.0: expected 1 input(s), got 0"),
        ((x, x, x), "model 'add_one' 0.1.0: expected 1 input(s), got 3"),
        ((torch.zeros(4, 4, dtype=torch.complex64).conj(),),
         "model 'add_one' 0.1.0: input 0 ('x'): cannot be passed by DLPack: Can't export tensors "
         "with the conjugate bit set"),
        ((torch.zeros(4, 4, device="meta"),),
         "model 'add_one' 0.1.0: input 0 ('x'): cannot be passed by DLPack: Cannot pack tensors on meta"),
        ((torch.zeros(4, 5),),
         "model 'add_one' 0.1.0: input 0 ('x'): expected float32[4, 4], got float32[4, 5]"),
    ]
    live = c_api.live_runtime_tensors()
    for args, message in cases:
        with pytest.raises(AotpackError) as error:
            add_one(*args)
        assert str(error.value) == message
        assert torch.equal(add_one(x)[0], torch.ones(4, 4))  # the slots still work
    assert c_api.live_runtime_tensors() == live


# ---- the C API with hand-made DLPack tensors: every input's deleter runs exactly once ----

_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _Deleter), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


class Handed:
    """A DLManagedTensorVersioned over a float32 tensor's memory that counts its deleter's calls."""

    def __init__(self, tensor: torch.Tensor, major: int = 1, device_type: int = 1, strides=True):
        self.tensor, self.calls = tensor, 0
        self.shape = (ctypes.c_int64 * tensor.dim())(*tensor.shape)
        self.strides = (ctypes.c_int64 * tensor.dim())(*tensor.stride())
        self.deleter = _Deleter(self._deleted)
        self.managed = _Managed(major, 0, None, self.deleter, 0, _DLTensor(
            tensor.data_ptr(), device_type, 0, tensor.dim(), 2, 32, 1,
            self.shape, self.strides if strides else None, 0))

    def _deleted(self, _address):
        self.calls += 1

    @property
    def address(self) -> int:
        return ctypes.addressof(self.managed)


def _run(model, handed: list[Handed], num_outputs: int = 1, handle="model"):
    lib = c_api.library()
    inputs = (ctypes.c_void_p * max(len(handed), 1))(*[h.address for h in handed])
    outputs = (ctypes.c_void_p * max(num_outputs, 1))()
    rc = lib.aotpack_model_run_dlpack(model._handle if handle == "model" else None, inputs, len(handed),
                                      outputs, num_outputs)
    message = c_api.last_error(lib) if rc else None
    return rc, message, [outputs[i] for i in range(num_outputs)]


@pytest.mark.parametrize("case, message", [
    ("two output slots", "model 'add_one' 0.1.0: the model has 1 output(s), the caller passed 2 slot(s)"),
    ("no model", "NULL model handle"),
    ("DLPack 2.x", "model 'add_one' 0.1.0: input 0 ('x'): DLPack version 2.0 is not supported "
                   "(this runtime reads 1.x)"),
    ("on a GPU", "model 'add_one' 0.1.0: input 0 ('x'): expected a CPU tensor (kDLCPU), got DLPack "
                 "device type 2"),
    ("negative strides", "model 'add_one' 0.1.0: input 0 ('x'): negative strides are not supported; "
                         "pass a copy"),
    ("wrong shape", "model 'add_one' 0.1.0: input 0 ('x'): expected float32[4, 4], got float32[2, 8]"),
])
def test_c_api_frees_each_input_once_on_every_error(add_one, case, message):
    x = torch.zeros(4, 4)
    handed = {"DLPack 2.x": Handed(x, major=2), "on a GPU": Handed(x, device_type=2),
              "wrong shape": Handed(torch.zeros(2, 8))}.get(case, Handed(x))
    if case == "negative strides":
        handed.strides[0] = -4
    rc, got, outputs = _run(add_one, [handed], num_outputs=2 if case == "two output slots" else 1,
                            handle=None if case == "no model" else "model")
    assert (rc, got, handed.calls) == (1, message, 1)
    assert all(o is None for o in outputs)  # no output is written on error


def test_c_api_adopts_row_major_inputs_without_strides(add_one):
    x = torch.arange(16.0).reshape(4, 4)
    handed = Handed(x, strides=False)  # DLPack < 1.2: NULL strides mean row-major
    rc, message, (output,) = _run(add_one, [handed])
    assert (rc, message, handed.calls) == (0, None, 1)  # freed at the end of the call
    (y,) = c_api.to_torch([output])
    assert torch.equal(y, x + 1)


@pytest.mark.parametrize("kind", ["binding", "ctypes"])
def test_close_waits_for_running_calls_and_later_calls_are_refused(build_model, monkeypatch, kind):
    if kind == "ctypes":
        monkeypatch.setattr(c_api, "binding", lambda: None)
    model = aotpack.load(build_model(MODELS / "add_one.py").archive, device_limit=1)
    x = torch.arange(16.0).reshape(4, 4)
    started, results = threading.Barrier(5), []

    def caller():
        started.wait()
        try:
            while True:  # until the close refuses a call
                results.append(torch.equal(model(x)[0], x + 1))
        except AotpackError as error:
            results.append(str(error))

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for thread in threads:
        thread.start()
    started.wait()
    model.close()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)  # a hang fails here, not forever
    # every call ran correctly until the close refused one; each thread stops there
    assert set(results) <= {True, "model 'add_one' 0.1.0 is closed"}
    assert results.count("model 'add_one' 0.1.0 is closed") == 4
    with pytest.raises(AotpackError, match="^model 'add_one' 0.1.0 is closed$"):
        model.stats()


def test_binding_can_be_turned_off_and_a_broken_one_falls_back_to_ctypes(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("AOTPACK_BINDING", "ctypes")
    assert c_api.binding() is None
    assert c_api.import_binding(tmp_path) is None  # not built there
    broken = tmp_path / f"_aotpack_binding{sysconfig.get_config_var('EXT_SUFFIX')}"
    broken.write_bytes(b"not an ELF file")
    assert c_api.import_binding(tmp_path) is None
    assert caplog.messages[-1].startswith(f"cannot import {broken} (")
    assert caplog.messages[-1].endswith("); aotpack.load calls the runtime through ctypes (~2.5 us more "
                                        "per call); rebuild it with `make runtime`")
