"""The kernel launch ABI is declared once per language and the copies agree: the documented
C header, the snippet generated kernels inline (they compile without -I), the ctypes
mirror, and the version numbers the Python side records."""
import re
from pathlib import Path

import pytest

from aotpack.backends.cpu import cpp_wrapper
from aotpack.backends.cpu import launch_abi

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
HEADER = REPO / "native" / "include" / "aotpack" / "kernel_abi.h"
MODEL_HEADER = REPO / "native" / "include" / "aotpack" / "model_abi.h"
SNIPPET = REPO / "aotpack" / "backends" / "cpu" / "templates" / "kernel_abi.h.j2"


def code(path: Path) -> list[str]:
    """The file's C tokens: comments removed, whitespace collapsed."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", path.read_text(), flags=re.S)
    return text.replace("\\\n", " ").split()


def macro(path: Path, name: str) -> int:
    return int(re.search(rf"^#define {name} (\d+)$", path.read_text(), re.M).group(1))


def struct_fields(name: str) -> list[str]:
    body = re.search(rf"typedef struct {name} \{{(.*?)\}} {name};", " ".join(code(HEADER))).group(1)
    return [decl.split()[-1].lstrip("*") for decl in body.split(";") if decl.strip()]


def test_snippet_declares_exactly_the_header():
    assert code(SNIPPET) == code(HEADER), (
        "templates/kernel_abi.h.j2 differs from native/include/aotpack/kernel_abi.h (comments aside); "
        "change both together")


def test_snippet_has_no_jinja_syntax():
    assert not re.search(r"\{[{%#]", SNIPPET.read_text())


def test_python_constants_match_the_headers():
    assert launch_abi.KERNEL_ABI_VERSION_MAJOR == macro(HEADER, "AOTPACK_KERNEL_ABI_VERSION_MAJOR")
    assert launch_abi.KERNEL_ABI_VERSION_MINOR == macro(HEADER, "AOTPACK_KERNEL_ABI_VERSION_MINOR")
    assert launch_abi.WORKSPACE_ALIGNMENT == macro(HEADER, "AOTPACK_WORKSPACE_ALIGNMENT") == 64
    assert re.search(rf"AOTPACK_DEVICE_CPU = {launch_abi.DEVICE_CPU},", HEADER.read_text())
    assert cpp_wrapper.MODEL_ABI_VERSION == macro(MODEL_HEADER, "AOTPACK_MODEL_ABI_VERSION_MAJOR")
    assert cpp_wrapper.MODEL_ABI_VERSION_MINOR == macro(MODEL_HEADER, "AOTPACK_MODEL_ABI_VERSION_MINOR")


def test_ctypes_structs_mirror_the_header_fields():
    assert [f for f, _ in launch_abi.KernelLaunch._fields_] == struct_fields("AotpackKernelLaunch") == [
        "struct_size", "device_type", "device_id", "stream", "workspace", "workspace_bytes", "max_threads"]
    assert [f for f, _ in launch_abi.TilingInfoStruct._fields_] == struct_fields("AotpackTilingInfo")


def test_version_text():
    assert launch_abi.version_text(launch_abi.KERNEL_ABI_VERSION) == "1.0"
    assert launch_abi.version_text((3 << 16) | 7) == "3.7"
