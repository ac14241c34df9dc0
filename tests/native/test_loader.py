"""aotpack.load: archives run in-process through the C API's DLPack door (issue 8, item 1)."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

import aotpack
from aotpack.backends.host import binaries as file_checks
from aotpack.archive import layout
from aotpack.runtime import c_api, loader
from aotpack.errors import AotpackError
from aotpack.archive.reader import read_all
from aotpack.runtime.native import find_runtime_library
from helpers import MODELS, SAMPLES, eager_outputs



@pytest.fixture(scope="module")
def mlp(build_model):
    archive = build_model(SAMPLES / "mlp.py").archive
    with aotpack.load(archive) as model:
        yield model


@pytest.mark.parametrize("sample", ["mlp.py", "transformer_block.py"])
def test_samples_match_eager_in_process(build_model, sample):
    reference, inputs = eager_outputs(SAMPLES / sample)
    with aotpack.load(build_model(SAMPLES / sample).archive) as model:
        assert [s.name for s in model.inputs] == [e["name"] for e in model.manifest["inputs"]]
        outputs = model(*inputs)
    assert len(outputs) == len(reference) == len(model.outputs)
    for ours, eager, spec in zip(outputs, reference, model.outputs):
        assert isinstance(ours, torch.Tensor) and ours.dtype == spec.dtype == eager.dtype
        assert tuple(ours.shape) == spec.shape
        torch.testing.assert_close(ours, eager, atol=1e-4, rtol=1e-4)


def test_signature_and_manifest(mlp):
    assert mlp.inputs == [loader.TensorSpec("x", torch.float32, (32, 512), (512, 1))]
    assert mlp.outputs == [loader.TensorSpec("output_0", torch.float32, (32, 512), (512, 1))]
    assert mlp.manifest["name"] == mlp.name == "mlp" and mlp.version == "0.1.0"
    assert repr(mlp) == "<aotpack.Model mlp 0.1.0 (x: float32[32, 512])>"
    # the signature comes from the runtime's accessors: the same as the manifest's
    assert mlp.inputs == [loader.TensorSpec.from_manifest(e) for e in mlp.manifest["inputs"]]
    assert mlp.outputs == [loader.TensorSpec.from_manifest(e) for e in mlp.manifest["outputs"]]


def test_a_load_parses_the_manifest_only_when_it_is_read(build_model):
    with aotpack.load(build_model(SAMPLES / "mlp.py").archive) as model:
        assert model.name == "mlp" and "manifest" not in vars(model) and "_mutated" not in vars(model)
        assert model.manifest is model.manifest and model.manifest["name"] == "mlp"


def test_outputs_are_the_runtime_memory_not_copies(mlp):
    x = torch.randn(32, 512)
    before = c_api.live_runtime_tensors()
    (y,) = mlp(x)
    assert c_api.live_runtime_tensors() == before + 1   # the runtime's tensor, lent to torch
    alias = y[0]
    del y
    assert c_api.live_runtime_tensors() == before + 1   # still viewed through `alias`
    del alias
    assert c_api.live_runtime_tensors() == before       # freed with the last torch view
    # the raw C API: torch.from_dlpack wraps the very pointer the runtime handed out
    lib = c_api.library()
    capsule = x.__dlpack__(max_version=(1, 0))
    inputs = (ctypes.c_void_p * 1)(c_api.take(capsule))
    outputs = (ctypes.c_void_p * 1)()
    assert lib.aotpack_model_run_dlpack(mlp._handle, inputs, 1, outputs, 1) == 0
    managed = c_api.DLManagedTensorVersioned.from_address(outputs[0])
    assert (managed.major, managed.flags) == (1, 0)
    data = managed.data
    (y,) = c_api.to_torch([outputs[0]])
    assert y.data_ptr() == data


def test_inputs_are_used_in_place_when_the_layout_matches(build_model):
    archive = build_model(MODELS / "input_views.py").archive
    with aotpack.load(archive) as model:
        x = torch.randn(4, 6)
        view, doubled = model(x)
        # the first output views the caller's own memory: row 1 of x, transposed
        assert view.data_ptr() == x.data_ptr() + 6 * 4 and view.stride() == (1, 6)
        torch.testing.assert_close(view, x[1:].t(), rtol=0, atol=0)
        torch.testing.assert_close(doubled, x * 2)
        assert model.stats() == {"runs": 1, "inputs_used": 1, "inputs_copied": 0}
        # numpy arrays cross the same way
        a = np.arange(24, dtype=np.float32).reshape(4, 6)
        view, _ = model(a)
        assert view.data_ptr() == a.ctypes.data + 6 * 4
        # other strides are copied into the manifest layout: no alias then
        x_t = torch.randn(6, 4).t()
        view, _ = model(x_t)
        assert not (x_t.data_ptr() <= view.data_ptr() < x_t.data_ptr() + x_t.numel() * 4)
        torch.testing.assert_close(view, x_t[1:].t(), rtol=0, atol=0)
        assert model.stats() == {"runs": 3, "inputs_used": 2, "inputs_copied": 1}
        # an output that views an input keeps that memory alive after the caller drops it
        del view, doubled, _
        before = c_api.live_runtime_tensors()
        x = torch.arange(24.0).reshape(4, 6)
        view, _ = model(x)
        del x
        torch.testing.assert_close(view, torch.arange(6.0, 24.0).reshape(3, 6).t(), rtol=0, atol=0)
        del view, _
        assert c_api.live_runtime_tensors() == before


def test_inputs_the_model_writes_are_the_callers(build_model):
    with aotpack.load(build_model(MODELS / "mutations.py").archive) as model:
        x, y = torch.ones(4), torch.arange(4.0)
        model(x, y)
        torch.testing.assert_close(y, torch.arange(4.0) + 1)   # written in place, not in a copy
        frozen = np.arange(4, dtype=np.float32)
        frozen.flags.writeable = False
        with pytest.raises(AotpackError) as error:
            model(np.ones(4, dtype=np.float32), frozen)
        assert str(error.value) == ("model 'mutations' 0.1.0: input 1 ('y'): the model writes this "
                                    "input in place, but the array is read-only; pass a writeable copy")


def test_four_threads_equal_single_threaded(mlp):
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(32, 512, generator=generator) for _ in range(8)]
    expected = [mlp(x)[0] for x in inputs]
    failures, results = [], {}

    def worker(number):
        try:
            for call in range(100):
                k = (number * 100 + call) % len(inputs)
                (y,) = mlp(inputs[k])
                if not torch.equal(y, expected[k]):
                    failures.append((number, call))
            results[number] = True
        except Exception as exc:  # reported below, not lost in the thread
            failures.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == [] and sorted(results) == [0, 1, 2, 3]


@pytest.mark.parametrize("args, message", [
    ((), "model 'mlp' 0.1.0: expected 1 input(s), got 0"),
    ((torch.zeros(32, 512), torch.zeros(32, 512)), "model 'mlp' 0.1.0: expected 1 input(s), got 2"),
    ((torch.zeros(32, 511),), "model 'mlp' 0.1.0: input 0 ('x'): expected float32[32, 512], got float32[32, 511]"),
    ((torch.zeros(32, 512, dtype=torch.float64),),
     "model 'mlp' 0.1.0: input 0 ('x'): expected float32[32, 512], got float64[32, 512]"),
    ((np.zeros((32, 512), dtype=np.int64),),
     "model 'mlp' 0.1.0: input 0 ('x'): expected float32[32, 512], got int64[32, 512]"),
    (([[1.0]],), "model 'mlp' 0.1.0: input 0 ('x'): expected a torch.Tensor or numpy.ndarray, got list"),
])
def test_wrong_inputs_are_named(mlp, args, message):
    before = mlp.stats()["runs"]
    with pytest.raises(AotpackError) as error:
        mlp(*args)
    assert str(error.value) == message
    assert mlp.stats()["runs"] == before


def test_outputs_outlive_the_model_and_a_closed_model_says_so(build_model):
    model = aotpack.load(build_model(SAMPLES / "mlp.py").archive)
    x = torch.randn(32, 512)
    (y,) = model.run(x)
    expected = y.clone()
    model.close()
    torch.testing.assert_close(y, expected, rtol=0, atol=0)
    with pytest.raises(AotpackError) as error:
        model(x)
    assert str(error.value) == "model 'mlp' 0.1.0 is closed"
    model.close()  # twice is fine
    assert model.manifest["name"] == "mlp"  # parsed after close: the loader kept its text


def test_load_errors(tmp_path, build_model):
    missing = tmp_path / "missing.aotpack"
    with pytest.raises(AotpackError) as error:
        aotpack.load(missing)
    assert str(error.value).startswith(f"cannot load '{missing}': ")
    with pytest.raises(AotpackError) as error:
        aotpack.load(build_model(SAMPLES / "mlp.py").archive, device_limit=0)
    assert str(error.value) == ("device_limit must be a positive number of cores or None (the limit "
                                "recorded at build time), got 0")


def test_runtime_library_is_located_or_explained(monkeypatch, tmp_path):
    monkeypatch.setenv("AOTPACK_RUNTIME_LIB", str(tmp_path / "nope.so"))
    with pytest.raises(AotpackError) as error:
        find_runtime_library()
    assert str(error.value) == (f"AOTPACK_RUNTIME_LIB={tmp_path / 'nope.so'} is not a file; point it "
                                "at libaotpack_runtime.so or unset it")
    monkeypatch.delenv("AOTPACK_RUNTIME_LIB")
    assert find_runtime_library().name == "libaotpack_runtime.so"


def test_an_unclosed_model_leaves_no_folder_behind(build_model, tmp_path):
    archive = build_model(SAMPLES / "mlp.py").archive
    script = ("import aotpack, torch\n"
              f"model = aotpack.load({str(archive)!r})\n"
              "model.cycle = model  # not freed by reference counting\n"
              "print(len(model(torch.zeros(32, 512))))\n")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=dict(os.environ, TMPDIR=str(tmp)), timeout=120)
    assert (result.returncode, result.stdout) == (0, "1\n"), result.stderr
    assert list(tmp.iterdir()) == []


def _program_header_types(elf: bytes) -> list[int]:
    """p_type of each program header of a 64-bit little-endian ELF."""
    header = file_checks._EHDR.unpack_from(elf)
    phoff, phentsize, phnum = header[5], header[9], header[10]
    return [file_checks._PHDR.unpack_from(elf, phoff + i * phentsize)[0] for i in range(phnum)]


def test_kernels_and_wrappers_are_linked_for_a_fast_dlopen(build_model):
    """Two loadable segments (toolchain.LOAD_FAST_LINK: a model dlopens two libraries per
    kernel, and each extra segment costs a mapping), RELRO kept."""
    files = read_all(build_model(SAMPLES / "mlp.py").archive)
    libraries = [path for path in files if path.endswith((layout.LIB_KERNEL_NAME, layout.WRAPPER_NAME))]
    assert libraries
    pt_load, pt_gnu_relro = 1, 0x6474E552
    for path in libraries:
        types = _program_header_types(files[path])
        assert (types.count(pt_load), pt_gnu_relro in types) == (2, True), path
