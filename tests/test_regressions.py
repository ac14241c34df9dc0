"""Regressions found in review: each model once gave wrong results or failed to build."""
import ctypes

import pytest
import torch

from aotpack.runtime import CHECKOUT
from conftest import MODELS, assert_native_parity


@pytest.mark.parametrize("name", ["edge_values", "mutations", "dataclass_module"])
def test_matches_eager_through_native_runtime(build_model, tmp_path, name):
    result = build_model(MODELS / f"{name}.py")
    assert_native_parity(result.archive, MODELS / f"{name}.py", tmp_path)


def test_long_row_sums_keep_float32_accuracy(build_model, tmp_path):
    # float32 accumulation was off by 0.17 %; eager's cascade sum is within ~1e-7
    result = build_model(MODELS / "long_rows.py")
    assert_native_parity(result.archive, MODELS / "long_rows.py", tmp_path, atol=1e-3, rtol=1e-6)


def test_outputs_never_alias_weights(build_model):
    """A caller writing into an output must not change the model (C API, two runs)."""
    archive = build_model(MODELS / "mutations.py").archive
    lib = ctypes.CDLL(str(CHECKOUT / "native" / "build" / "libaotpack_runtime.so"))
    lib.aotpack_last_error.restype = ctypes.c_char_p
    model = ctypes.c_void_p()
    assert lib.aotpack_model_load(str(archive).encode(), 0, ctypes.byref(model)) == 0, lib.aotpack_last_error()
    x, y = torch.ones(4), torch.arange(4.0)
    handles = []
    for t in (x, y):
        h = ctypes.c_void_p()
        sizes = (ctypes.c_int64 * 1)(4)
        assert lib.aotpack_tensor_new(6, 1, sizes, None, ctypes.c_void_p(t.data_ptr()), ctypes.byref(h)) == 0
        handles.append(h)

    def weight_output() -> list[float]:
        outs = (ctypes.c_void_p * 4)()
        assert lib.aotpack_model_run(model, (ctypes.c_void_p * 2)(*handles), 2, outs, 4) == 0, \
            lib.aotpack_last_error()
        data = ctypes.c_void_p()
        assert lib.aotpack_tensor_info(ctypes.c_void_p(outs[3]), None, None, None, None, ctypes.byref(data)) == 0
        values = (ctypes.c_float * 4).from_address(data.value)
        first = list(values)
        for i in range(4):
            values[i] = 100.0  # the caller scribbles on its output
        for h in outs:
            lib.aotpack_tensor_free(ctypes.c_void_p(h))
        return first

    assert weight_output() == [0.0, 1.0, 2.0, 3.0]
    assert weight_output() == [0.0, 1.0, 2.0, 3.0]
    for h in handles:
        lib.aotpack_tensor_free(h)
    lib.aotpack_model_free(model)
