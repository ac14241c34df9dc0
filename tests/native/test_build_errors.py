"""Bad model files give one clear error naming the file, and leave no partial archive."""
import subprocess
import sys

import pytest

from aotpack.build import build
from aotpack.config import Settings
from aotpack.errors import AotpackError
from helpers import MODELS


def _build_fails(tmp_path, model_file, cache_dir):
    out = tmp_path / "dist"
    with pytest.raises(AotpackError) as err:
        build(model_file, out, settings=Settings.from_env(cache_dir=cache_dir))
    assert not out.exists() or list(out.iterdir()) == []
    return str(err.value)


def test_missing_example_inputs_is_named(tmp_path, cache_dir):
    path = MODELS / "no_example_inputs.py"
    message = _build_fails(tmp_path, path, cache_dir)
    assert message == (f"{path}: missing function 'example_inputs'; add "
                       "`def example_inputs() -> tuple[torch.Tensor, ...]` to the model file")


def test_forward_that_raises_is_reported_with_its_line(tmp_path, cache_dir):
    path = MODELS / "forward_raises.py"
    message = _build_fails(tmp_path, path, cache_dir)
    assert message == (f"{path}: torch.export failed (line 7 in forward): ValueError: forward is broken on "
                       "purpose; make forward() exportable with static shapes (see "
                       "https://pytorch.org/docs/stable/export.html); torch's log: --debug-dir DIR")


def test_missing_model_file(tmp_path, cache_dir):
    path = tmp_path / "nope.py"
    assert _build_fails(tmp_path, path, cache_dir) == f"{path}: model file not found"


def test_bad_version_is_rejected(tmp_path, cache_dir):
    with pytest.raises(AotpackError, match="is not a semantic version; use X.Y.Z"):
        build(MODELS / "forward_raises.py", tmp_path, version="1.0",
              settings=Settings.from_env(cache_dir=cache_dir))


def test_cli_prints_error_without_traceback(tmp_path):
    path = MODELS / "no_example_inputs.py"
    result = subprocess.run([sys.executable, "-m", "aotpack", "build", str(path), "-o", str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(f"aotpack: error: {path}: missing function")
    assert "Traceback" not in result.stderr


def test_cli_rejects_bad_topn(tmp_path):
    path = MODELS / "pointwise_zoo.py"
    result = subprocess.run([sys.executable, "-m", "aotpack", "build", str(path), "--topn", "0"],
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip() == "aotpack: error: --topn must be >= 1, got 0"
