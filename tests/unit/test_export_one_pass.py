"""The one-pass export (``export._export_one_pass``) lowers to the same kernel IR as the
public ``torch.export.export`` + ``run_decompositions``, or is not taken."""
from pathlib import Path
from unittest import mock

import pytest

from aotpack import backends
from aotpack.frontend import export
from aotpack.frontend.export import load_model_file
from aotpack.lower.lowering import lower


REPO = Path(__file__).resolve().parents[2]
MODELS = ["tests/models/upsample_attention.py", "tests/models/vit_block.py", "tests/models/attention_bmm.py",
          "tests/models/mobilenet_block.py", "tests/models/conv_bn_block.py", "tests/models/extern_zoo.py",
          "tests/models/activation_zoo.py", "tests/models/gemm_zoo.py", "tests/models/reduction_stats.py",
          "tests/models/division_zoo.py", "tests/models/cat_flip_zoo.py", "tests/models/max_pool.py",
          "tests/models/dict_outputs.py", "tests/models/input_views.py", "samples/transformer_block.py"]


def _ir(path: str, one_pass: bool) -> str:
    model_file = load_model_file(REPO / path)
    if one_pass:
        return lower(export.export_model(model_file), backends.get("cpu")).dump()
    with mock.patch.object(export, "_export_one_pass", lambda _: None):
        return lower(export.export_model(model_file), backends.get("cpu")).dump()


@pytest.mark.parametrize("path", MODELS)
def test_one_pass_export_lowers_like_the_public_path(path):
    assert export._export_one_pass(load_model_file(REPO / path)) is not None  # taken, not fallen back
    assert _ir(path, True) == _ir(path, False)


@pytest.mark.parametrize("path", ["tests/models/tied_weights.py", "tests/models/mutations.py",
                                  "tests/models/masked_select.py"])
def test_tied_mutating_and_data_dependent_programs_take_the_public_path(path):
    assert export._export_one_pass(load_model_file(REPO / path)) is None
