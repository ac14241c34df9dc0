"""GEMM/conv steps end to end: built archives whose winners are ATen, MKL and oneDNN
(weights packed at load in model.so) match eager through the native runtime
(float32: |ours - eager| <= 1e-5 + 1e-4 * |eager|), and the manifest records every
step's candidates, timings and the fastest as the winner."""
import collections
import itertools
from pathlib import Path

import pytest
import safetensors.torch
import torch

from aotpack import backends
from aotpack.tune import autotune
from aotpack.tune import choice_cache
from aotpack.archive import reader
from aotpack.build import build
from aotpack.config import Settings
from helpers import assert_native_parity, fixed_timing


ZOO = Path(__file__).resolve().parents[1] / "models" / "gemm_zoo.py"



@pytest.fixture(scope="module", params=[0, 1])
def rotated(request, tmp_path_factory, cache_dir):
    """gemm_zoo built with timings that make step i's winner variant (i + offset) mod (its
    count), so every implementation and epilogue kind is shipped and run natively (the
    calls still run once)."""
    counter = itertools.count(request.param)

    def fake_timings(functions, device=None):
        for fn in functions:
            fn()
        favourite = next(counter) % len(functions)
        return fixed_timing([1.0 if i == favourite else 2.0 + i for i in range(len(functions))])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(autotune, "time_functions", fake_timings)
        patch.setattr(choice_cache, "read_all", lambda *args: {})  # the fake timings stay out of the cache
        patch.setattr(choice_cache, "write_all", lambda *args: None)
        result = build(ZOO, tmp_path_factory.mktemp("gemm"), settings=Settings.from_env(topn=1, cache_dir=cache_dir))
    return result


def test_every_implementation_matches_eager_natively(rotated, tmp_path):
    winners = [g["winner"] for g in [c for c in rotated.manifest["choices"] if c["kind"] != "kernel"]]
    expected = {"aten", "onednn", "template"} | ({"mkl"} if torch._C.has_mkl else set())
    assert set(winners) == expected
    assert_native_parity(rotated.archive, ZOO, tmp_path, atol=1e-5, rtol=1e-4)


def test_manifest_lists_candidates_timings_and_the_fastest_wins(rotated):
    gemms = [c for c in rotated.manifest["choices"] if c["kind"] != "kernel"]
    assert [g["epilogue"] for g in gemms] == ["relu", "gelu", "tanh", "swish", "add", "none", "none", "relu"]
    for g in gemms:
        assert len(g["timings_us"]) == len(g["candidates"]) and g["visited"]
        fastest = min(range(len(g["candidates"])), key=g["timings_us"].__getitem__)
        assert g["winner"] == g["candidates"][fastest]


def test_model_calls_the_winners_and_packs_weights_at_load(rotated):
    files = reader.read_all(rotated.archive)
    source = files["model/model.cpp"].decode()
    # winners are called typed (unboxed), their handles resolved once at load (host ABI 1.1)
    for g in [c for c in rotated.manifest["choices"] if c["kind"] != "kernel"]:
        if g["kind"] == "conv2d":
            op = {"aten": "aten::convolution", "onednn": "mkldnn::_convolution_pointwise", "template": None}[g["winner"]]
        else:
            binary = "binary" if g["epilogue"] == "add" else ""
            op = {"aten": "aten::addmm", "mkl": "mkl::_mkl_linear", "template": None,
                  "onednn": f'mkldnn::_linear_pointwise", "{binary}'}[g["winner"]]
        if g["name"] == "linear_mm_none" and g["winner"] == "aten":
            op = "aten::mm"
        if g["winner"] == "template":  # aotpack's own GEMM/convolution: a kernel launch, no ATen op
            assert f"// {'conv' if g['kind'] == 'conv2d' else 'gemm'}_{g['epilogue']}_" in source, g
            continue
        assert f'find_typed("{op}"' in source, (g, op)
    assert "call_typed(m.typed[" in source and "call_op(" not in source.split("void run(")[1]
    # weights are packed at load exactly for the oneDNN/MKL winners
    winners = {(g["kind"], g["winner"]) for g in [c for c in rotated.manifest["choices"] if c["kind"] != "kernel"]}
    assert ("mkldnn::_reorder_linear_weight" in source) == (("linear", "onednn") in winners)
    assert ("mkl::_mkl_reorder_linear_weight" in source) == (("linear", "mkl") in winners)
    assert ("mkldnn::_reorder_convolution_weight" in source) == (("conv2d", "onednn") in winners)
    assert "#include <ATen" not in source
    # the epilogue kernels of ATen/MKL winners and the template winners' GEMM kernels
    kernels = [k["name"] for k in rotated.manifest["kernels"]]
    gemms = [c for c in rotated.manifest["choices"] if c["kind"] != "kernel"]
    assert len(kernels) == sum(1 for g in gemms if g["winner"] in ("aten", "mkl") and g["epilogue"] != "none") + \
        sum(1 for g in gemms if g["winner"] == "template")
    assert sorted(k for k in kernels if k.startswith("gemm_")) == \
        sorted(k for k in kernels if any(k.startswith(f"gemm_{g['epilogue']}_") for g in gemms
                                         if g["winner"] == "template"))
    # the weights: dense for ATen/MKL/oneDNN winners, only the build-time panels for the template's
    stored = set(safetensors.torch.load(files["weights/weights.safetensors"]))
    for g, module in zip(gemms, ["fc_relu", "fc_gelu", "fc_tanh", "fc_silu", "fc_res", "fc_t", "fc_row", "conv"]):
        own = g["winner"] == "template"
        panels = f"{module}.weight.{'conv' if g['kind'] == 'conv2d' else 'gemm'}_panels"
        assert (f"{module}.weight" in stored, panels in stored) == (not own, own), g


def test_extern_implementations_are_timed_with_the_device_limit_threads(tmp_path, cache_dir):
    """PGO times ATen/MKL/oneDNN with as many ATen threads as the kernels may use: a
    ``--device-limit 1`` build whose process runs 3 ATen threads times them at 1, and the
    process gets its 3 back."""
    model = tmp_path / "linear.py"
    model.write_text("import torch\n"
                     "def model():\n    torch.manual_seed(0)\n    return torch.nn.Linear(64, 48).eval()\n"
                     "def example_inputs():\n    return (torch.randn(8, 64),)\n")
    seen = []

    def recording_timings(functions, device=None):
        for fn in functions:
            seen.append(torch.get_num_threads())
            fn()
        return fixed_timing([1.0] * len(functions))

    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(autotune, "time_functions", recording_timings)
            patch.setattr(choice_cache, "read_all", lambda *args: {})
            patch.setattr(choice_cache, "write_all", lambda *args: None)
            build(model, tmp_path / "out", settings=Settings.from_env(topn=1, cache_dir=cache_dir, device_limit=1))
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


@pytest.mark.unit
def test_extern_threads_restores_the_count_after_an_error():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="inside"):
        with autotune.extern_threads(backends.get("cpu"), 1):
            assert torch.get_num_threads() == 1
            raise RuntimeError("inside")
    assert torch.get_num_threads() == before


REPEATED = Path(__file__).resolve().parents[1] / "models" / "repeated_layers.py"


def test_twin_steps_and_a_repeated_kernel_are_timed_once_per_input_set(tmp_path, cache_dir, monkeypatch):
    """Three identical layers: their GEMM step is timed once per input set (example and
    calibration: 2), as is the head's, and every layer ships the first one's winner and
    timings; the layers' shared template kernel is timed once per set, not per launch."""
    steps_timed, kernels_timed = [], []

    def fake_time_functions(functions, device=None):
        for fn in functions:
            fn()
        steps_timed.append(len(functions))
        return fixed_timing([2.0] * (len(functions) - 1) + [1.0])  # the template

    real_time_candidates = autotune.time_candidates

    def counting_time_candidates(launcher, keys, args, block_dims=None, device=None):
        kernels_timed.append(id(launcher))  # one launcher per kernel
        return real_time_candidates(launcher, keys, args, block_dims, device)

    monkeypatch.setattr(autotune, "time_functions", fake_time_functions)
    monkeypatch.setattr(autotune, "time_candidates", counting_time_candidates)
    monkeypatch.setattr(choice_cache, "read_all", lambda *args: {})
    monkeypatch.setattr(choice_cache, "write_all", lambda *args: None)
    result = build(REPEATED, tmp_path / "out", settings=Settings.from_env(topn=2, cache_dir=cache_dir))
    assert len(steps_timed) == 4  # (layer, head) x (example, calibration)
    gemms = [c for c in result.manifest["choices"] if c["kind"] != "kernel"]
    assert [g["winner"] for g in gemms] == ["template"] * 4
    assert gemms[0]["timings_us"] == gemms[1]["timings_us"] == gemms[2]["timings_us"] != []
    assert all(g["visited"] for g in gemms)
    # ATen's tanh kernel, the layers' template kernel (3 launches per set), the head's
    assert sorted(collections.Counter(kernels_timed).values()) == [2, 2, 2]
    assert_native_parity(result.archive, REPEATED, tmp_path, atol=1e-5, rtol=1e-4)


SHARED_CONSTANTS = Path(__file__).resolve().parents[1] / "models" / "shared_constants.py"


def test_packed_constants_from_one_source_keep_their_own_values(tmp_path, cache_dir, monkeypatch):
    """Linears on two slices of one bias, and a batch norm shared by two convolutions with
    their own biases: with the templates pinned, each step packs its own bias (they once
    shared the first one's: max abs error 46 and 13)."""
    def template_wins(functions, device=None):
        for fn in functions:
            fn()
        return fixed_timing([2.0] * (len(functions) - 1) + [1.0])

    monkeypatch.setattr(autotune, "time_functions", template_wins)
    monkeypatch.setattr(choice_cache, "read_all", lambda *args: {})
    monkeypatch.setattr(choice_cache, "write_all", lambda *args: None)
    result = build(SHARED_CONSTANTS, tmp_path / "out", settings=Settings.from_env(topn=1, cache_dir=cache_dir))
    assert [g["winner"] for g in [c for c in result.manifest["choices"] if c["kind"] != "kernel"]] == ["template"] * 4
    assert_native_parity(result.archive, SHARED_CONSTANTS, tmp_path, atol=1e-5, rtol=1e-4)
