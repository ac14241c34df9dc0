"""aotpack/env.py is the one registry of environment variables: the checked-in C header and
docs/env_vars.md are generated from it, no other Python module reads the environment, the
native sources name variables only through the header's macros, and the registry's rules
hold (defaults, validation, overrides through ``os.environ``)."""
import re
from pathlib import Path

import pytest

from aotpack import env
from aotpack.errors import AotpackError


REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "native" / "include" / "aotpack" / "env_vars.h"
DOCS = REPO / "docs" / "env_vars.md"
#: Native sources: the runtime, server, binding, tools and their tests (not the build folder).
NATIVE_FOLDERS = ("src", "server", "python", "tools", "tests", "include")
#: The registry's variables by the name of their constant in aotpack.env (``TOPN``, ``CXX``...).
CONSTANTS = {name: value for name, value in vars(env).items() if isinstance(value, env.Variable)}


def _native_sources():
    for folder in NATIVE_FOLDERS:
        for path in sorted((REPO / "native" / folder).rglob("*")):
            if path.suffix in (".cpp", ".h", ".c", ".cc", ".hpp") and path != HEADER:
                yield path


def test_checked_in_header_is_generated():
    assert HEADER.read_text() == env.header(), (
        "native/include/aotpack/env_vars.h is stale: run\n"
        "  python -m aotpack.env --header > native/include/aotpack/env_vars.h")


def test_checked_in_docs_are_generated():
    assert DOCS.read_text() == env.docs(), (
        "docs/env_vars.md is stale: run\n  python -m aotpack.env --docs > docs/env_vars.md")


def test_docs_list_every_variable_once_with_its_default():
    rows = [line for line in DOCS.read_text().splitlines() if line.startswith("| `")]
    names = [re.match(r"\| `([A-Z_]+)`", row).group(1) for row in rows]
    assert names == [var.name for var in env.VARIABLES]
    assert len(set(names)) == len(names)
    for row, var in zip(rows, env.VARIABLES):
        assert row.split(" | ")[2] == var.shown_default, var.name


def test_each_variable_has_a_constant_and_a_doc_line():
    assert sorted(CONSTANTS.values(), key=lambda v: v.name) == sorted(env.VARIABLES, key=lambda v: v.name)
    for var in env.VARIABLES:
        assert var.doc and "\n" not in var.doc and var.readers, var.name
        assert set(var.readers) <= {env.BUILD, env.PYTHON, env.NATIVE, env.MODEL, env.SETUP}, var.name
    for name in ("AOTPACK_HOST_CACHE_MB", "AOTPACK_RUNTIME_LIB", "AOTPACK_SKIP_NATIVE", "TMPDIR",
                 "XDG_CACHE_HOME", "HOME", "CXX", "SOURCE_DATE_EPOCH"):
        assert name in env.BY_NAME, name


def test_no_module_but_the_registry_reads_the_environment():
    pattern = re.compile(r"\bos\.environ\b|\bgetenv\b|\bfrom os import [^\n]*\benviron\b|\bos\.putenv\b")
    hits = []
    for path in sorted((REPO / "aotpack").rglob("*.py")):
        if path == REPO / "aotpack" / "env.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not hits, "read variables through aotpack.env (get / raw / child_environment):\n" + "\n".join(hits)


def test_python_readers_use_the_registry():
    """A variable the registry says Python reads is used through ``env.<CONSTANT>`` somewhere."""
    code = "\n".join(p.read_text() for p in (REPO / "aotpack").rglob("*.py") if p.name != "env.py")
    for constant, var in CONSTANTS.items():
        if {env.BUILD, env.PYTHON} & set(var.readers):
            assert re.search(rf"\benv\.{constant}\b", code), f"{var.name}: no reader of env.{constant}"


def test_native_names_variables_only_through_the_header():
    literal = re.compile(r'getenv\(\s*"')
    defined = set(re.findall(r"#define (AOTPACK_ENV_\w+)", HEADER.read_text()))
    used, hits = set(), []
    for path in _native_sources():
        text = path.read_text()
        hits += [f"{path.relative_to(REPO)}: {m.group(0)}" for m in literal.finditer(text)]
        used |= set(re.findall(r"\bAOTPACK_ENV_\w+", text))
    assert not hits, "use the AOTPACK_ENV_* macros of aotpack/env_vars.h:\n" + "\n".join(hits)
    assert used <= defined, used - defined
    native = {var.macro for var in env.VARIABLES if env.NATIVE in var.readers}
    assert native <= used, f"declared as read by the native runtime but not read there: {native - used}"


def test_templates_and_setup_name_only_registered_variables():
    names = set()
    for path in [REPO / "setup.py", *sorted((REPO / "aotpack" / "backends").glob("*/templates/*.j2"))]:
        names |= set(re.findall(r'(?:getenv|environ\.get)\(\s*"(\w+)"', path.read_text()))
    assert names <= set(env.BY_NAME), names - set(env.BY_NAME)
    model = (REPO / "aotpack" / "backends" / "cpu" / "templates" / "model.cpp.j2").read_text()
    assert 'getenv("{{ profile_variable }}")' in model  # the name comes from env.PROFILE


def test_get_reads_the_environment_at_each_call(monkeypatch):
    monkeypatch.delenv("AOTPACK_RUNTIME_CACHE_MB", raising=False)
    assert env.get(env.RUNTIME_CACHE_MB) == 4096
    monkeypatch.setenv("AOTPACK_RUNTIME_CACHE_MB", "12")
    assert env.get(env.RUNTIME_CACHE_MB) == 12
    monkeypatch.setenv("AOTPACK_RUNTIME_CACHE_MB", "")  # empty = unset
    assert env.get(env.RUNTIME_CACHE_MB) == 4096
    monkeypatch.setenv("AOTPACK_RUNTIME_CACHE_MB", "1G")
    with pytest.raises(AotpackError, match=r"^AOTPACK_RUNTIME_CACHE_MB must be a whole number of MiB, got '1G'$"):
        env.get(env.RUNTIME_CACHE_MB)


@pytest.mark.parametrize("text, value", [("a.pem", ("a.pem",)), ("a.pem::b.pem:", ("a.pem", "b.pem"))])
def test_trusted_keys_split_on_colons(monkeypatch, text, value):
    monkeypatch.setenv("AOTPACK_TRUSTED_KEYS", text)
    assert env.get(env.TRUSTED_KEYS) == value


@pytest.mark.parametrize("text", ["", ":", "::"])
def test_trusted_keys_set_to_nothing_is_an_error(monkeypatch, text):
    monkeypatch.setenv("AOTPACK_TRUSTED_KEYS", text)
    with pytest.raises(AotpackError, match="AOTPACK_TRUSTED_KEYS is set but names no key"):
        env.get(env.TRUSTED_KEYS)


@pytest.mark.parametrize("var, text, message", [
    (env.REQUIRE_SIGNATURE, "yes", "AOTPACK_REQUIRE_SIGNATURE must be 0 or 1, got 'yes'"),
    (env.MAX_ENTRIES, "+5", "AOTPACK_MAX_ENTRIES must be an integer from 1 to 9223372036854775807, got '+5'"),
    (env.SOURCE_DATE_EPOCH, "-1", "SOURCE_DATE_EPOCH must be a whole number of seconds since 1970, got '-1'"),
    (env.COMPILE_THREADS, "two", "AOTPACK_COMPILE_THREADS must be a positive integer, got 'two'"),
    (env.COSTMODEL_RATIO, "", "AOTPACK_COSTMODEL_RATIO must be a number in (0, 1], got ''"),
])
def test_invalid_values_name_the_variable(monkeypatch, var, text, message):
    monkeypatch.setenv(var.name, text)
    with pytest.raises(AotpackError) as err:
        env.get(var)
    assert str(err.value) == message


def test_flags_and_defaults(monkeypatch):
    for name in ("AOTPACK_PROFILE", "AOTPACK_RUNTIME_CACHE", "CXX", "SOURCE_DATE_EPOCH"):
        monkeypatch.delenv(name, raising=False)
    assert env.get(env.PROFILE) is False and env.get(env.RUNTIME_CACHE) is True
    assert env.get(env.CXX) == "g++" and env.get(env.SOURCE_DATE_EPOCH) == 0
    monkeypatch.setenv("AOTPACK_PROFILE", "yes")  # the model's rule: set, not empty, not 0...
    assert env.get(env.PROFILE) is True
    monkeypatch.setenv("AOTPACK_RUNTIME_CACHE", "0")
    assert env.get(env.RUNTIME_CACHE) is False
    assert env.raw(env.RUNTIME_CACHE) == "0"


def test_child_environment_adds_overrides_and_keeps_the_rest(monkeypatch):
    monkeypatch.setenv("AOTPACK_DEBUG", "1")
    monkeypatch.setenv("TMPDIR", "/parent/tmp")
    child = env.child_environment(TMPDIR="/x/tmp")
    assert child["TMPDIR"] == "/x/tmp" and child["AOTPACK_DEBUG"] == "1"
    assert env.raw(env.TMPDIR) == "/parent/tmp"  # this process's environment is untouched


def test_main_prints_the_generated_files(capsys):
    assert env.main(["--header"]) == 0
    assert capsys.readouterr().out == env.header()
    assert env.main(["--docs"]) == 0
    assert capsys.readouterr().out == env.docs()
