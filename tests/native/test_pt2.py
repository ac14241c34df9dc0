"""`aotpack build model.pt2 --inputs inputs.pt` (issue 8, item 5): an exported program in,
the same archive behaviour as the model.py path."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import aotpack
from aotpack.build import build
from aotpack.config import Settings
from aotpack.errors import AotpackError
from aotpack.frontend.export import load_model, load_model_file
from aotpack.archive.writer import read_manifest
from helpers import MODELS, SAMPLES



def _export(sample, folder, sets=None):
    """model.pt2 + inputs.pt of a model file, exported as the model.py path does."""
    model_file = load_model_file(sample)
    with torch.no_grad():
        exported = torch.export.export(model_file.module.eval(), model_file.example_inputs)
    pt2, inputs = folder / f"{sample.stem}.pt2", folder / "inputs.pt"
    torch.export.save(exported, pt2)
    torch.save(model_file.example_inputs if sets is None else sets, inputs)
    return pt2, inputs, model_file


@pytest.mark.parametrize("sample", [SAMPLES / "mlp.py", MODELS / "mutations.py"])
def test_pt2_build_equals_the_model_file_build(build_model, cache_dir, tmp_path, sample):
    pt2, inputs, model_file = _export(sample, tmp_path)
    from_py = build_model(sample)
    from_pt2 = build(pt2, tmp_path / "dist", settings=Settings.from_env(topn=1, cache_dir=cache_dir),
                     inputs_path=inputs)
    assert from_pt2.archive.name == from_py.archive.name
    py, ep = read_manifest(from_py.archive), read_manifest(from_pt2.archive)
    for key in ("inputs", "outputs", "constants", "mutated_buffers", "mutated_inputs"):
        assert ep[key] == py[key], key
    assert [k["kernel_key"] for k in ep["kernels"]] == [k["kernel_key"] for k in py["kernels"]]
    generator = torch.Generator().manual_seed(1)
    xs = [torch.randn(t.shape, generator=generator).to(t.dtype) for t in model_file.example_inputs]
    with aotpack.load(from_py.archive) as a, aotpack.load(from_pt2.archive) as b:
        for _ in range(2):  # twice: mutated buffers evolve alike
            for ours, theirs in zip(a(*[x.clone() for x in xs]), b(*[x.clone() for x in xs])):
                assert torch.equal(ours, theirs)


def test_pt2_inputs_may_carry_calibration_sets(tmp_path):
    model_file = load_model_file(SAMPLES / "mlp.py")
    (x,) = model_file.example_inputs
    pt2, inputs, _ = _export(SAMPLES / "mlp.py", tmp_path, sets=[(x,), (x * 2,), (x - 1,)])
    loaded = load_model(pt2, inputs)
    assert torch.equal(loaded.example_inputs[0], x) and len(loaded.calibration_inputs) == 2
    assert torch.equal(loaded.calibration_inputs[1][0], x - 1)
    assert loaded.exported is not None and loaded.version is None


def test_pt2_input_problems_are_named(tmp_path):
    (x,) = load_model_file(SAMPLES / "mlp.py").example_inputs
    pt2, inputs, _ = _export(SAMPLES / "mlp.py", tmp_path, sets=[(x,), (x[:4],)])
    with pytest.raises(AotpackError) as error:
        load_model(pt2, inputs)
    assert str(error.value) == (f"{inputs}: input set 1 is (float32[4, 512]), but the example inputs are "
                                "(float32[32, 512]); shapes are static, so every set must match")
    torch.save((x[:4],), inputs)
    with pytest.raises(AotpackError) as error:
        load_model(pt2, inputs)
    assert str(error.value).startswith(f"{inputs}: the example inputs do not fit mlp.pt2: ")
    torch.save({"x": x}, inputs)
    with pytest.raises(AotpackError) as error:
        load_model(pt2, inputs)
    assert str(error.value) == (f"{inputs}: expected a tuple of tensors (the example inputs) or a list of "
                                "such tuples (example set first, then calibration sets), got dict")
    with pytest.raises(AotpackError) as error:
        load_model(inputs, None)
    assert str(error.value) == f"{inputs}: expected a model file (.py) or an exported program (.pt2)"
    with pytest.raises(AotpackError) as error:
        load_model(SAMPLES / "mlp.py", inputs)
    assert str(error.value) == (f"{SAMPLES / 'mlp.py'}: --inputs is for .pt2 exported programs; a model "
                                "file provides example_inputs()")
    (tmp_path / "junk.pt2").write_bytes(b"junk")
    with pytest.raises(AotpackError) as error:
        load_model(tmp_path / "junk.pt2", inputs)
    assert str(error.value).startswith(f"{tmp_path / 'junk.pt2'}: not a torch.export.save file: ")


def test_cli_pt2_without_inputs_says_what_to_pass(tmp_path):
    pt2, _, _ = _export(SAMPLES / "mlp.py", tmp_path)
    result = subprocess.run([sys.executable, "-m", "aotpack", "build", str(pt2), "-o", str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr == (f"aotpack: error: {pt2}: an exported program needs its inputs: pass --inputs "
                             "INPUTS.pt (a torch.save'd tuple of example tensors)\n")
