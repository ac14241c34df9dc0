"""AotpackLoadOptions: the one way a load is configured (C API, C++ and aotpack.load)."""
from __future__ import annotations

import ctypes
import os

import pytest

import aotpack
from aotpack.runtime import c_api
from aotpack.errors import AotpackError
from helpers import SAMPLES



@pytest.fixture(scope="module")
def archive(build_model):
    return build_model(SAMPLES / "mlp.py").archive


class _Newer(ctypes.Structure):
    """AotpackLoadOptions as a newer header might declare it: one option appended."""
    _fields_ = [("options", c_api.LoadOptions), ("later_option", ctypes.c_int64)]


def _load_with(archive, options) -> tuple[int, str]:
    lib = c_api.library()
    handle = ctypes.c_void_p()
    status = lib.aotpack_model_load_with(os.fsencode(archive),
                                         ctypes.cast(ctypes.byref(options), ctypes.POINTER(c_api.LoadOptions)),
                                         ctypes.byref(handle))
    if status == 0:
        lib.aotpack_model_free(handle)
    return status, lib.aotpack_last_error().decode()


def test_null_options_and_a_zeroed_struct_are_the_defaults(archive):
    lib = c_api.library()
    handle = ctypes.c_void_p()
    assert lib.aotpack_model_load_with(os.fsencode(archive), None, ctypes.byref(handle)) == 0
    lib.aotpack_model_free(handle)
    assert _load_with(archive, c_api.LoadOptions(struct_size=ctypes.sizeof(c_api.LoadOptions)))[0] == 0


def test_struct_size_must_be_set(archive):
    status, message = _load_with(archive, c_api.LoadOptions())
    assert (status, message) == (1, "AotpackLoadOptions.struct_size is 0: set it to sizeof(AotpackLoadOptions)")


def test_a_newer_struct_loads_unless_it_sets_an_unknown_option(archive):
    newer = _Newer()
    newer.options.struct_size = ctypes.sizeof(_Newer)
    assert _load_with(archive, newer)[0] == 0  # unknown trailing fields left at zero
    newer.later_option = 1
    assert _load_with(archive, newer) == (
        1, f"AotpackLoadOptions sets options this runtime does not know (struct_size "
           f"{ctypes.sizeof(_Newer)} > {ctypes.sizeof(c_api.LoadOptions)}): use a newer runtime")


def test_require_signature_without_keys_is_refused(archive, monkeypatch):
    monkeypatch.delenv("AOTPACK_TRUSTED_KEYS", raising=False)
    with pytest.raises(AotpackError) as error:
        aotpack.load(archive, require_signature=True)
    assert str(error.value) == (f"cannot load '{archive}': a signature is required, but no trusted key "
                                "is set (AOTPACK_TRUSTED_KEYS or --trusted-key)")


def test_trusted_keys_passed_as_arguments_require_a_signature(archive, monkeypatch, tmp_path):
    monkeypatch.delenv("AOTPACK_TRUSTED_KEYS", raising=False)
    with pytest.raises(AotpackError) as error:
        aotpack.load(archive, trusted_keys=[tmp_path / "key.pub.pem"])
    assert str(error.value) == (f"cannot load '{archive}': the archive is not signed, but trusted keys "
                                "are set (AOTPACK_TRUSTED_KEYS/--trusted-key)")
    assert "AOTPACK_TRUSTED_KEYS" not in os.environ  # passed along, not through the environment
