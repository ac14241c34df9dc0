"""Each backend renders from its own template folder: the CPU backend's templates live in
``aotpack/backends/cpu/templates/`` and nowhere else."""
import re
from pathlib import Path

import jinja2
import pytest

from aotpack import backends
from aotpack.backends.cpu import templating
from aotpack.codegen import render


REPO = Path(__file__).resolve().parents[2]


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


#: Lines of the shared pieces (``cpu_common.j2``): the launch prologue, the vector width, the
#: thread clamp and the bias/residual unpacking.
SHARED = ("AOTPACK_KERNEL_LAUNCH_V1_SIZE) return", "#define AP_VECTOR_BYTES 16",
          "const int nthreads =", "static_cast<const float*>(args[{{ next.arg }}])",
          "int32_t aotpack_kernel_launch(const AotpackKernelLaunch* launch")


def test_shared_pieces_are_written_once():
    for template in templating.TEMPLATE_DIR.glob("*.j2"):
        text = template.read_text()
        found = [line for line in SHARED if line in text]
        assert template.name == "cpu_common.j2" or not found, f"{template.name} repeats {found}: use cpu_common.j2"


def test_every_kernel_template_uses_the_shared_prologue():
    kernels = [p for p in templating.TEMPLATE_DIR.glob("cpu_*.cpp.j2") if p.name != "cpu_wrapper.cpp.j2"]
    assert len(kernels) >= 9
    for template in kernels:
        text = template.read_text()
        # a layout's template that extends another (cpu_lanes_conv_*) has its prologue there
        base = re.search(r'^\{% extends "(cpu_\w+\.cpp\.j2)" %\}$', text, re.M)
        if base:
            text = (templating.TEMPLATE_DIR / base.group(1)).read_text()
        assert text.startswith('{% import "cpu_common.j2" as common %}\n'), template.name
        assert "{{ common.launch_entry() }}" in text and "common.launch_checks(" in text, template.name
