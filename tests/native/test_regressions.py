"""Regressions found in review: each model once gave wrong results or failed to build."""
import ctypes

import numpy as np
import pytest
import torch

from aotpack.archive import layout
from aotpack.runtime.native import CHECKOUT
from helpers import MODELS, assert_native_parity


@pytest.mark.parametrize("name", ["edge_values", "mutations", "dataclass_module", "nested_reductions",
                                  "promotion_and_specials", "view_mutations"])
def test_matches_eager_through_native_runtime(build_model, tmp_path, name):
    result = build_model(MODELS / f"{name}.py")
    assert_native_parity(result.archive, MODELS / f"{name}.py", tmp_path)


def test_long_row_sums_keep_float32_accuracy(build_model, tmp_path):
    # float32 accumulation was off by 0.17 %; eager's cascade sum is within ~1e-7
    result = build_model(MODELS / "long_rows.py")
    assert_native_parity(result.archive, MODELS / "long_rows.py", tmp_path, atol=1e-3, rtol=1e-6)


NUMPY_DTYPES = {layout.DTYPE_CODES[name]: np.dtype(name).type
                for name in ("float32", "float64", "float16", "int64", "int32", "bool")}


class NativeModel:
    """The runtime's C API through ctypes: one loaded model, run repeatedly."""

    def __init__(self, archive):
        self.lib = ctypes.CDLL(str(CHECKOUT / "native" / "build" / "libaotpack_runtime.so"))
        self.lib.aotpack_last_error.restype = ctypes.c_char_p
        self.model = ctypes.c_void_p()
        assert self.lib.aotpack_model_load(str(archive).encode(), 0, ctypes.byref(self.model)) == 0, \
            self.lib.aotpack_last_error()

    def run(self, inputs: list[torch.Tensor], num_outputs: int, scribble: bool) -> list[np.ndarray]:
        """Outputs as numpy copies; with ``scribble`` the caller then overwrites them."""
        code = {v: k for k, v in NUMPY_DTYPES.items()}
        handles = []
        for t in inputs:
            h = ctypes.c_void_p()
            sizes = (ctypes.c_int64 * t.dim())(*t.shape)
            dtype = code[t.numpy().dtype.type]
            assert self.lib.aotpack_tensor_new(dtype, t.dim(), sizes, None, ctypes.c_void_p(t.data_ptr()),
                                               ctypes.byref(h)) == 0
            handles.append(h)
        outs = (ctypes.c_void_p * num_outputs)()
        assert self.lib.aotpack_model_run(self.model, (ctypes.c_void_p * len(handles))(*handles), len(handles),
                                          outs, num_outputs) == 0, self.lib.aotpack_last_error()
        results = []
        for h in outs:
            dtype, ndim = ctypes.c_int32(), ctypes.c_int64()
            sizes, strides = ctypes.POINTER(ctypes.c_int64)(), ctypes.POINTER(ctypes.c_int64)()
            data = ctypes.c_void_p()
            assert self.lib.aotpack_tensor_info(ctypes.c_void_p(h), ctypes.byref(dtype), ctypes.byref(ndim),
                                                ctypes.byref(sizes), ctypes.byref(strides), ctypes.byref(data)) == 0
            shape = [sizes[i] for i in range(ndim.value)]
            np_dtype = np.dtype(NUMPY_DTYPES[dtype.value])
            count = int(np.prod(shape)) if shape else 1
            array = np.frombuffer((ctypes.c_char * (count * np_dtype.itemsize)).from_address(data.value),
                                  dtype=np_dtype).reshape(shape)  # outputs are contiguous here
            results.append(array.copy())
            if scribble:
                array.setflags(write=True) if array.flags.owndata else None
                ctypes.memset(data.value, 0x41, count * np_dtype.itemsize)
            self.lib.aotpack_tensor_free(ctypes.c_void_p(h))
        for h in handles:
            self.lib.aotpack_tensor_free(h)
        return results

    def close(self):
        self.lib.aotpack_model_free(self.model)


@pytest.mark.parametrize("name", ["mutations", "view_mutations"])
def test_state_across_runs_matches_eager_and_outputs_never_alias_the_model(build_model, name):
    """Three runs of one loaded model match three eager calls, although the caller
    overwrites every output it gets (outputs must not share memory with weights or state)."""
    from aotpack.frontend.export import load_model_file
    path = MODELS / f"{name}.py"
    archive = build_model(path).archive
    model_file = load_model_file(path)
    eager = model_file.module.eval()
    native = NativeModel(archive)
    try:
        for _ in range(3):
            inputs = [t.clone() for t in model_file.example_inputs]
            with torch.no_grad():
                expected = eager(*[t.clone() for t in inputs])
            expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
            got = native.run(inputs, len(expected), scribble=True)
            for ours, ref in zip(got, expected):
                np.testing.assert_allclose(ours.astype(np.float64), ref.detach().double().numpy(), atol=1e-6)
    finally:
        native.close()


def test_max_pool_is_fused_unless_its_indices_are_read(build_model, tmp_path):
    from aotpack import backends
    from aotpack.frontend.export import export_model, load_model_file
    from aotpack.lower.lowering import lower

    path = MODELS / "max_pool.py"
    result = build_model(path)
    assert_native_parity(result.archive, path, tmp_path)  # NaN and -inf compared as eager gives them
    graph = lower(export_model(load_model_file(path)), backends.get("cpu"))
    assert [str(call.op) for call in graph.extern_calls()] == ["aten.max_pool2d_with_indices.default"]  # indices read
    names = [kernel.name for kernel in graph.kernels]
    # a pool that pads or strides along the width is two kernels: the rows' maximum over the
    # padded width (the ReLU fused into the first), then the columns'; the row-strided one is one
    assert names == ["fused_relu_max_pool2d_rows_3", "fused_max_pool2d_rows_4", "fused_max_pool2d_rows_5",
                     "fused_max_pool2d_rows_6", "fused_max_pool2d_7", "fused_max_pool2d_8", "fused_max_pool2d_9",
                     "fused_max_pool2d_10", "fused_max_pool2d_rows_max_pool2d_11", "fused_add_12"]
