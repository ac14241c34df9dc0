"""The backend seam holds: generic code (``aotpack/`` outside ``aotpack/backends/``) names
no device: no CPU library, threading runtime, binary format, file suffix or instruction set.
Whatever it needs of them it asks the backend (``backends.base.Backend``/``Device``)."""
from __future__ import annotations

import re
from pathlib import Path



PACKAGE = Path(__file__).resolve().parents[2] / "aotpack"

#: term -> pattern, matched line by line (comments and docstrings included).
TERMS = {
    "MKL": re.compile(r"mkl(?!dnn)", re.I),
    "oneDNN": re.compile(r"onednn|mkldnn", re.I),
    "OpenMP": re.compile(r"openmp|\bomp\b", re.I),
    "num_threads": re.compile(r"num_threads"),
    "schedstat": re.compile(r"schedstat"),
    "ELF": re.compile(r"\bELF\b"),
    ".so": re.compile(r"\.so\b"),
    ".cpp": re.compile(r"\.cpp\b"),
    "AVX": re.compile(r"avx", re.I),
    "vector width": re.compile(r"vector[ _]width|vector_bytes", re.I),
    "cache size": re.compile(r"cache[ _]size", re.I),
    "march": re.compile(r"\bmarch\b", re.I),
    "ISA": re.compile(r"\bisa\b", re.I),
}
#: References to the native runtime's sources (``native/src/manifest.cpp``): the Python
#: reader mirrors them rule by rule and says where, which names a file, not a device.
NATIVE_PATH = re.compile(r"native/[\w./-]+")

#: (file under aotpack/, term) -> why it is still there. Each entry must still match
#: (a cleared one is removed from here), so this list is the seam's remaining debt.
ALLOWED = {
    ("archive/layout.py", ".so"): "archive format 3's file names, mirrored into the CPU runtime's "
                                  "native/include/aotpack/archive_layout.h; per-backend names are a format change",
    ("archive/layout.py", ".cpp"): "as .so: the format's source file names",
    ("runtime/native.py", ".so"): "the native runtime's own shared library (libaotpack_runtime.so), which "
                                  "every host backend's archives load through; not a device binary",
}


def _hits() -> dict[tuple[str, str], list[str]]:
    """(file, term) -> ["file:line: text"] over the generic tree."""
    found: dict = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("backends/"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            text = NATIVE_PATH.sub("", line)
            for term, pattern in TERMS.items():
                if pattern.search(text):
                    found.setdefault((rel, term), []).append(f"aotpack/{rel}:{number}: {line.strip()}")
    return found


def test_generic_code_names_no_device():
    hits = _hits()
    unexpected = [line for key, lines in hits.items() if key not in ALLOWED for line in lines]
    assert not unexpected, ("device terms in generic code (ask the backend, or move the code under "
                            "aotpack/backends/<name>/):\n" + "\n".join(unexpected))


def test_every_allowed_term_is_still_there():
    cleared = sorted(f"{file}: {term}" for file, term in ALLOWED if (file, term) not in _hits())
    assert not cleared, "cleared: remove from ALLOWED:\n" + "\n".join(cleared)


def test_the_patterns_catch_what_they_name():
    samples = {"MKL": "torch.ops.mkl._mkl_linear", "oneDNN": "mkldnn._linear_pointwise", "OpenMP": "#pragma omp",
               "num_threads": "torch.set_num_threads(2)", "schedstat": "/proc/self/task/1/schedstat",
               "ELF": "an ELF header", ".so": '"kernel.so"', ".cpp": '"model.cpp"', "AVX": "__m256 (AVX2)",
               "vector width": "vector_bytes=64", "cache size": "L2 cache size", "march": "-march=native",
               "ISA": "the target ISA"}
    for term, text in samples.items():
        assert TERMS[term].search(NATIVE_PATH.sub("", text)), term
    assert not TERMS[".cpp"].search(NATIVE_PATH.sub("", "native/src/manifest.cpp's rule"))
    assert not TERMS["ISA"].search("target_isa")  # the manifest key and setting are names, not prose


def test_backends_register_their_own_build_flags():
    """``--target-isa`` is the CPU backend's flag (``Backend.build_options``): the build
    command has it, its value reaches the settings, and other commands skip importing backends."""
    from aotpack import backends
    from aotpack.commands import cli

    args = cli._parser().parse_args(["build", "m.py", "--target-isa", "x86-64-v3"])
    assert backends.settings_from(args) == {"target_isa": "x86-64-v3"}
    assert backends.settings_from(cli._parser().parse_args(["build", "m.py"])) == {"target_isa": None}
    assert cli._builds(["-q", "build", "m.py"]) and not cli._builds(["inspect", "build"])
    assert not hasattr(cli._parser(backend_flags=False).parse_args(["build", "m.py"]), "target_isa")
