"""aotpack/archive/layout.py is the one definition of archive paths: the checked-in C header and
the documented layout (docs/archive.md) must agree with it."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from aotpack.archive import layout
from aotpack.archive import manifest_rules


REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "native" / "include" / "aotpack" / "archive_layout.h"


def test_checked_in_header_is_generated():
    assert HEADER.read_text() == layout.header(), (
        "native/include/aotpack/archive_layout.h is stale: run\n"
        "  python -m aotpack.archive.layout --header > native/include/aotpack/archive_layout.h")


def test_header_defines_every_constant():
    text = layout.header()
    assert f"#define AOTPACK_FORMAT_VERSION {layout.FORMAT_VERSION}\n" in text
    for name in dir(layout):
        if name.endswith(("_PATH", "_DIR", "_NAME")) and name.isupper():
            assert re.search(rf'^#define AOTPACK_{name} +"{re.escape(getattr(layout, name))}"$', text, re.M), name
    assert "do not edit" in text and "python -m aotpack.archive.layout --header" in text


def test_command_line_prints_the_header():
    result = subprocess.run([sys.executable, "-m", "aotpack.archive.layout", "--header"],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0 and result.stdout == layout.header()
    result = subprocess.run([sys.executable, "-m", "aotpack.archive.layout"], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == \
        "python -m aotpack.archive.layout: error: the following arguments are required: --header"


def _documented_paths() -> list[str]:
    text = (REPO / "docs" / "archive.md").read_text()
    block = re.search(r"^```\n(.*?)^```$", text, re.S | re.M).group(1)
    return [line.split()[0] for line in block.splitlines() if line.strip()]


def test_paths_match_the_documented_layout():
    name, key = "<kernel>", "<kernel_key>"
    assert _documented_paths() == [
        layout.MANIFEST_PATH, layout.MANIFEST_DIGEST_PATH, layout.MANIFEST_SIGNATURE_PATH,
        layout.MODEL_LIBRARY_PATH, layout.MODEL_SOURCE_PATH, layout.KERNEL_IR_PATH,
        layout.wrapper_path(name), layout.wrapper_source_path(name), layout.optimize_tiling_path(name),
        layout.lib_kernel_path(name, key), layout.lib_kernel_source_path(name, key),
        layout.WEIGHTS_PATH, layout.SELFTEST_INPUTS_PATH, layout.SELFTEST_OUTPUTS_PATH,
    ]
    assert layout.kernel_dir("k0") == layout.KERNELS_DIR + "/k0"
    assert layout.FORMAT_VERSION == 3  # bumping it is a deliberate format change (docs/archive.md)


@pytest.mark.parametrize("name, key, message", [
    ("a/b", "0" * 32, "kernel name 'a/b' is not a single archive path component"),
    ("..", "0" * 32, "kernel name '..' is not a single archive path component"),
    ("k0", "", "kernel_key '' is not a single archive path component"),
])
def test_bad_path_components_are_refused(name, key, message):
    with pytest.raises(ValueError) as info:
        layout.lib_kernel_path(name, key)
    assert str(info.value) == message


def test_dtype_codes_match_the_model_abi_enum():
    enum = (REPO / "native" / "include" / "aotpack" / "model_abi.h").read_text()
    body = re.search(r"enum AotpackDType \{(.*?)\};", enum, re.S).group(1)
    declared = {name.lower(): int(code) for name, code in re.findall(r"AOTPACK_DTYPE_(\w+) = (\d+)", body)}
    assert declared == layout.DTYPE_CODES


def test_the_manifest_rules_accept_exactly_the_abi_dtypes():
    assert set(manifest_rules.DTYPES) == set(layout.DTYPE_CODES)
