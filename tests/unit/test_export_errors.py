"""Export failures: one line naming the frame, the cause and what to do; torch's dumps
go to the debug dir, never to the terminal."""
import subprocess
import sys
from pathlib import Path

import pytest

from aotpack.frontend import export_errors
from aotpack.errors import AotpackError
from aotpack.frontend.export import export_model, load_model_file
from helpers import MODELS


SHAPE_ADVICE = ("export the backbone and heads, run the data-dependent post-processing (NMS) in "
                "the application")


def _cli_build(path, tmp_path, *extra, env=None):
    return subprocess.run([sys.executable, "-m", "aotpack", "build", str(path), "-o", str(tmp_path / "dist"),
                           *extra], capture_output=True, text=True, cwd=tmp_path, env=env)


def _export_error(path, debug_dir=None) -> str:
    with pytest.raises(AotpackError) as err:
        export_model(load_model_file(path), debug_dir=debug_dir)
    return str(err.value)


def test_data_dependent_output_shape_points_at_the_mask_and_advises_nms_in_the_app():
    path = MODELS / "masked_select.py"
    message = _export_error(path)
    assert message == (f"{path}: data-dependent shape from torch.export (line 7 in forward): "
                       f"aten.index.Tensor returns shape [u0]; {SHAPE_ADVICE}")
    assert len(message) <= export_errors.MAX_MESSAGE


def test_branch_on_a_tensor_value_is_named_data_dependent_control_flow(tmp_path):
    path = MODELS / "value_branch.py"
    result = _cli_build(path, tmp_path)
    assert result.returncode == 1
    message = (f"{path}: torch.export failed (line 7 in forward): data-dependent control flow, a branch "
               "on a tensor value (guard Eq(u0, 1)); select with torch.where, or decide in the "
               "application; torch's log: --debug-dir DIR")
    # the phase line, then the error: no FX graph dump, no torch log lines
    assert result.stderr == f"aotpack: exporting value_branch.py (torch.export) ...\naotpack: error: {message}\n"
    assert len(message) <= export_errors.MAX_MESSAGE
    assert not (tmp_path / "aotpack_debug").exists() and not (tmp_path / "dist").exists()


def test_branch_on_a_data_dependent_box_count_advises_nms_in_the_app():
    path = MODELS / "box_count_branch.py"
    message = _export_error(path)
    assert message == (f"{path}: torch.export failed (line 8 in forward): data-dependent shape "
                       f"(guard Eq(u0, 0)); {SHAPE_ADVICE}; torch's log: --debug-dir DIR")
    assert len(message) <= export_errors.MAX_MESSAGE


def test_torch_output_goes_to_the_debug_dir(tmp_path):
    path = MODELS / "value_branch.py"
    message = _export_error(path, debug_dir=tmp_path / "debug")
    log_file = tmp_path / "debug" / "value_branch" / "export.log"
    assert message.endswith(f"; torch's log: {log_file}")
    text = log_file.read_text()
    assert text.startswith(f"torch.export of {path} failed (torch ")
    assert "GuardOnDataDependentSymNode: Could not guard on data-dependent expression Eq(u0, 1)" in text
    assert 'def forward(self, arg0_1: "f32[4, 8]")' in text  # the partial FX graph torch prints
    assert [p.name for p in log_file.parent.iterdir()] == ["export.log"]  # no temp file left


def test_aotpack_debug_env_keeps_the_log_in_aotpack_debug(tmp_path):
    import os
    path = MODELS / "value_branch.py"
    result = _cli_build(path, tmp_path, env={**os.environ, "AOTPACK_DEBUG": "1"})
    assert result.returncode == 1
    assert result.stderr.endswith("; torch's log: aotpack_debug/value_branch/export.log\n")
    assert "def forward" not in result.stderr
    assert "def forward" in (tmp_path / "aotpack_debug" / "value_branch" / "export.log").read_text()


def test_debug_dir_flag_keeps_the_log(tmp_path):
    result = _cli_build(MODELS / "value_branch.py", tmp_path, "--debug-dir", tmp_path / "dbg")
    assert result.stderr.endswith(f"; torch's log: {tmp_path / 'dbg' / 'value_branch' / 'export.log'}\n")


def test_a_long_guard_expression_is_shortened_to_one_bounded_line(tmp_path):
    expression = " + ".join(f"Max(u{i}, {i})" for i in range(200))

    def library_code():
        raise RuntimeError(f"Could not guard on data-dependent expression Eq({expression}, 0) "
                           f"(unhinted: Eq({expression}, 0)).  (Size-like symbols: u0, u1)\n\nmore text")

    with pytest.raises(RuntimeError) as err:
        library_code()
    model_path = Path("/srv/app/detector.py")
    message = export_errors.export_failure(model_path, err.value, None)
    assert len(message) == export_errors.MAX_MESSAGE
    line = Path(__file__).name
    assert message.startswith(f"{model_path}: torch.export failed at {line}:")
    assert "in library_code: data-dependent shape (guard Eq(Max(u0, 0) + Max(u1, 1)" in message
    assert f"...; {SHAPE_ADVICE}; torch's log: --debug-dir DIR" in message
    assert "\n" not in message


def test_failing_frame_skips_torch_and_stdlib_and_names_the_library(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    monkeypatch.syspath_prepend(str(site))
    torch_file = str(site / "torch" / "fx" / "proxy.py")
    library = str(site / "torchvision" / "ops" / "boxes.py")
    frames = [export_errors.Frame(str(tmp_path / "app" / "model.py"), 12, "forward"),
              export_errors.Frame(library, 41, "batched_nms"),
              export_errors.Frame(torch_file, 900, "__bool__"),
              export_errors.Frame("<string>", 1, "<lambda>"),
              export_errors.Frame(export_errors.__file__, 1, "helper")]
    frame = export_errors.failing_frame(frames)
    assert frame == frames[1]
    assert export_errors.describe_frame(frame, tmp_path / "app" / "model.py") == (
        " at torchvision/ops/boxes.py:41 in batched_nms")
    assert export_errors.describe_frame(frames[0], tmp_path / "app" / "model.py") == " (line 12 in forward)"


def test_shorten_keeps_short_text_and_marks_cuts():
    assert export_errors.shorten("a  b\nc", 10) == "a b c"
    assert export_errors.shorten("abcdefghijkl", 8) == "abcde..."
