"""The kernel launch ABI is defined once (``aotpack.backends.host.kernel_abi``) and every copy is
generated from it: the documented C header (checked in), the declarations generated kernels
inline (they compile without -I), the ctypes mirror, and the version numbers the Python side
records."""
import ctypes
import re
import subprocess
import sys
from pathlib import Path

import pytest


from aotpack.backends.cpu import cpp_wrapper, templating
from aotpack.backends.host import kernel_abi, launch_abi


REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "native" / "include" / "aotpack" / "kernel_abi.h"
MODEL_HEADER = REPO / "native" / "include" / "aotpack" / "model_abi.h"


def code(text: str) -> list[str]:
    """The text's C tokens: comments removed, whitespace collapsed."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)
    return text.replace("\\\n", " ").split()


def macro(path: Path, name: str) -> int:
    return int(re.search(rf"^#define {name} (\d+)$", path.read_text(), re.M).group(1))


def struct_fields(name: str) -> list[str]:
    body = re.search(rf"typedef struct {name} \{{(.*?)\}} {name};", " ".join(code(HEADER.read_text()))).group(1)
    return [decl.split()[-1].lstrip("*") for decl in body.split(";") if decl.strip()]


def test_checked_in_header_is_the_generated_one():
    assert HEADER.read_text() == kernel_abi.header(), (
        "native/include/aotpack/kernel_abi.h is stale: run "
        "python -m aotpack.backends.host.kernel_abi --header > native/include/aotpack/kernel_abi.h")


def test_the_command_prints_the_header():
    done = subprocess.run([sys.executable, "-m", "aotpack.backends.host.kernel_abi", "--header"], cwd=REPO,
                          capture_output=True, text=True, check=True)
    assert done.stdout == kernel_abi.header()


def test_inlined_declarations_are_the_header_without_comments():
    assert code(kernel_abi.declarations()) == code(kernel_abi.header())
    assert not re.search(r"/\*\*|\\brief", kernel_abi.declarations())


def test_every_template_inlines_the_generated_declarations():
    rendered = templating.render("cpu_wrapper.cpp.j2", map_text="", map_bytes=64, max_candidates=1)
    assert kernel_abi.declarations() + "\n" in rendered
    assert not (templating.TEMPLATE_DIR / "kernel_abi.h.j2").exists()


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
    assert ctypes.sizeof(launch_abi.KernelLaunch) == 48  # the header's "sizeof 48 on LP64"
    assert launch_abi.KernelLaunch.max_threads.offset + 4 == 44  # AOTPACK_KERNEL_LAUNCH_V1_SIZE


def test_an_unmapped_c_type_is_an_error():
    odd = kernel_abi.Declaration("struct", "Odd", ("x",), (kernel_abi.Member("f", "float", ("x",)),))
    with pytest.raises(KeyError):
        kernel_abi.ctypes_fields(odd)


def test_version_text():
    assert launch_abi.version_text(launch_abi.KERNEL_ABI_VERSION) == "1.0"
    assert launch_abi.version_text((3 << 16) | 7) == "3.7"
