"""Each backend renders from its own template folder: the CPU backend's templates live in
``aotpack/backends/cpu/templates/`` and nowhere else."""
from pathlib import Path

import jinja2
import pytest

from aotpack import backends
from aotpack.backends.cpu import templating
from aotpack.codegen import render

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]


def test_the_cpu_backend_names_its_own_folder():
    folder = backends.get("cpu").template_dir()
    assert folder == templating.TEMPLATE_DIR == REPO / "aotpack" / "backends" / "cpu" / "templates"
    assert {"model.cpp.j2", "cpu_wrapper.cpp.j2", "cpu_kernel.cpp.j2", "cpu_math.h.j2"} <= {
        p.name for p in folder.glob("*.j2")}
    assert not (REPO / "templates").exists()  # no repository-level folder to shadow it


def test_one_environment_per_folder(tmp_path):
    (tmp_path / "cpu_math.h.j2").write_text("other backend's {{ x }}\n")
    assert render.render_from(tmp_path, "cpu_math.h.j2", x=1) == "other backend's 1\n"
    assert "other backend" not in templating.render("cpu_math.h.j2", optional_helpers=())
    assert render.environment(tmp_path) is not render.environment(templating.TEMPLATE_DIR)


def test_undefined_names_are_errors(tmp_path):
    (tmp_path / "t.j2").write_text("{{ missing }}")
    with pytest.raises(jinja2.UndefinedError):
        render.render_from(tmp_path, "t.j2")


def test_a_missing_folder_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="reinstall"):
        render.render_from(tmp_path / "absent", "t.j2")
