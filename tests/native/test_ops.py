"""Fused pointwise/reduction ops and extern calls match eager through the C++ runtime."""
import torch

from aotpack.archive.writer import read_manifest
from helpers import MODELS, assert_native_parity


def test_pointwise_and_reduction_zoo(build_model, tmp_path):
    result = build_model(MODELS / "pointwise_zoo.py", topn=2)
    assert result.max_abs_error <= 1e-4
    assert_native_parity(result.archive, MODELS / "pointwise_zoo.py", tmp_path)
    manifest = read_manifest(result.archive)
    assert len(manifest["kernels"]) >= 3
    assert [o["shape"] for o in manifest["outputs"]] == [[8, 3, 40], [8, 3], [8, 3, 40]]


def test_extern_ops_with_every_argument_kind(build_model, tmp_path):
    result = build_model(MODELS / "extern_zoo.py")
    assert_native_parity(result.archive, MODELS / "extern_zoo.py", tmp_path)
    inputs = read_manifest(result.archive)["inputs"]
    assert [(i["dtype"], i["shape"]) for i in inputs] == [("float32", [2, 3, 16, 16]), ("int64", [2, 5])]


def test_strided_input_and_buffer_mutation(build_model, tmp_path):
    path = MODELS / "strided_and_mutation.py"
    result = build_model(path)
    manifest = read_manifest(result.archive)
    assert manifest["inputs"][0]["strides"] == [1, 4]
    assert manifest["mutated_buffers"] == ["calls"]
    # one run: the buffer goes 0 -> 1 before it is added, as in eager
    assert_native_parity(result.archive, path, tmp_path)


def test_build_leaves_user_model_untouched(build_model):
    import importlib.util
    spec = importlib.util.spec_from_file_location("m", MODELS / "strided_and_mutation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    net = module.model()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    from aotpack.frontend.export import ModelFile, export_model
    export_model(ModelFile(MODELS / "strided_and_mutation.py", net, module.example_inputs(), None))
    for key, value in net.state_dict().items():
        assert torch.equal(value, before[key])


def test_scalar_inputs_and_outputs(build_model, tmp_path):
    result = build_model(MODELS / "scalar_reduce.py")
    manifest = read_manifest(result.archive)
    assert manifest["inputs"][1]["shape"] == []
    assert [o["shape"] for o in manifest["outputs"]] == [[], [], []]
    assert_native_parity(result.archive, MODELS / "scalar_reduce.py", tmp_path)


def test_cond_runs_either_branch_natively(build_model, tmp_path):
    from aotpack.frontend.export import load_model_file
    from aotpack.runtime.native import run_tensors
    result = build_model(MODELS / "branchy.py", topn=2)
    manifest = read_manifest(result.archive)
    visited = {k["name"].rsplit("_", 1)[0]: k["visited"] for k in manifest["kernels"]}
    assert visited["fused_cos_mul_sub"] and not visited["fused_sin"]   # example inputs: negative
    assert [k["timings_us"] for k in manifest["kernels"] if not k["visited"]] == [[], []]
    model_file = load_model_file(MODELS / "branchy.py")
    module = model_file.module.eval()
    x, y = model_file.example_inputs
    for inputs in [(x, y), (-x, y)]:  # the untaken branch runs on the deployed side too
        (ours,), _ = run_tensors(result.archive, inputs, tmp_path)
        with torch.no_grad():
            torch.testing.assert_close(ours, module(*inputs), atol=1e-5, rtol=1e-5)


def test_other_control_flow_is_a_clear_error(tmp_path, cache_dir):
    from aotpack.build import build
    from aotpack.config import Settings
    from aotpack.errors import AotpackError

    path = tmp_path / "looping.py"
    path.write_text(
        "import torch\n"
        "from torch._higher_order_ops.while_loop import while_loop\n"
        "class Loop(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return while_loop(lambda i, t: i < 3, lambda i, t: (i + 1, t * 2), (torch.tensor(0), x))[1]\n"
        "def model():\n    return Loop()\n"
        "def example_inputs():\n    return (torch.ones(3),)\n")
    with __import__("pytest").raises(AotpackError) as err:
        build(path, tmp_path / "out", settings=Settings.from_env(cache_dir=cache_dir))
    assert str(err.value).startswith(f"{path}: unsupported construct: while_loop (control flow) in node ")
    assert str(err.value).endswith("aotpack lowers torch.cond but not this yet: move the loop out of "
                                   "the model or unroll it")
    assert not (tmp_path / "out").exists()


def test_views_of_computed_values(build_model, tmp_path):
    result = build_model(MODELS / "lazy_views.py")
    assert_native_parity(result.archive, MODELS / "lazy_views.py", tmp_path)


def test_narrow_inner_dimension_merges_into_one_loop(build_model, tmp_path):
    from aotpack.archive.writer import read_members
    result = build_model(MODELS / "narrow_rows.py")
    assert_native_parity(result.archive, MODELS / "narrow_rows.py", tmp_path)
    sources = {p: d.decode() for p, d in read_members(result.archive).items() if p.endswith("kernel.cpp")}
    merged = [s for p, s in sources.items() if "/fused_sigmoid" in p]
    assert len(merged) == 1 and "j < 4096" not in merged[0] and "item < 15" in merged[0]


def test_calibration_sets_are_timed_too(build_model, tmp_path, caplog):
    import logging
    with caplog.at_level(logging.INFO, logger="aotpack"):
        result = build_model(MODELS / "calibrated.py", topn=2)
    manifest = read_manifest(result.archive)
    (kernel,) = manifest["kernels"]
    assert kernel["candidates"] == 2 and len(kernel["timings_us"]) == 2
    assert caplog.text.count("Autotune completed") == 1  # one choice over all three sets
    assert_native_parity(result.archive, MODELS / "calibrated.py", tmp_path)


def test_calibration_set_with_another_shape_is_rejected(tmp_path, cache_dir):
    import pytest
    from aotpack.build import build
    from aotpack.config import Settings
    from aotpack.errors import AotpackError
    path = tmp_path / "bad_calibration.py"
    path.write_text((MODELS / "calibrated.py").read_text().replace(
        "torch.randn(64, 128, generator=g)", "torch.randn(32, 128, generator=g)"))
    with pytest.raises(AotpackError) as err:
        build(path, tmp_path / "out", settings=Settings.from_env(cache_dir=cache_dir))
    assert str(err.value) == (f"{path}: calibration_inputs() set 0 is (float32[32, 128]), but "
                              "example_inputs() is (float32[64, 128]); shapes are static, so every set must match")


def test_cond_with_float_predicate_expanded_result_and_half_scalar(build_model, tmp_path):
    from aotpack.frontend.export import load_model_file
    from aotpack.runtime.native import run_tensors
    result = build_model(MODELS / "cond_edge.py")
    model_file = load_model_file(MODELS / "cond_edge.py")
    x, p = model_file.example_inputs
    for pred in (p, p * 0):  # 0.5 (true: its first byte is 0) and 0.0 (false)
        (ours,), _ = run_tensors(result.archive, (x, pred), tmp_path)
        with torch.no_grad():
            torch.testing.assert_close(ours, model_file.module(x, pred))
