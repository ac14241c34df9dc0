"""What a build killed at any moment leaves in the cache, and how the next build removes it
(no compiler: a stand-in toolchain writes the binaries)."""
import os
from pathlib import Path
from types import SimpleNamespace


from aotpack.tune import cache
from aotpack.tune import choice_cache
from aotpack.tune.candidates import CandidateSet
from aotpack.tune.compile import compile_all


DEAD = 2 ** 22 + 12345  # above any pid this machine hands out (pid_max)


class FakeToolchain:
    """Writes ``binary of <source>`` as the 'compiled' library and counts the compiles."""

    def __init__(self):
        self.compiles = 0

    def _compile(self, source_file: Path, output: Path) -> None:
        self.compiles += 1
        output.write_bytes(b"binary of " + source_file.read_bytes())

    compile_kernel = compile_wrapper = _compile


def _setup(root: Path):
    candidate = SimpleNamespace(kernel_key="key0", optimize_tiling="t0|0|1")
    sets = {"k1": CandidateSet(SimpleNamespace(kernel_id="k1"), (candidate,), ("// kernel 0\n",), "// wrapper\n")}
    folders = {"k1": cache.KernelFolder(root / "cpu" / "fused_add" / "hash1")}
    store = cache.BinaryStore(root / "cpu" / "binaries", "fingerprint", ".so", ".cpp")
    settings = SimpleNamespace(retune=False, compile_threads=1)
    return sets, folders, store, settings


def _temp_names(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*"))


def test_build_killed_after_linking_a_candidate_leaves_no_temp_link_after_the_next_build(tmp_path):
    sets, folders, store, settings = _setup(tmp_path)
    toolchain = FakeToolchain()
    compile_all(sets, folders, toolchain, store, settings)
    assert toolchain.compiles == 2  # the candidate and the PGO wrapper
    static = folders["k1"].static_kernel("key0")
    # killed between linking kernel.so to the store and writing kernel.cpp beside it
    (static / "kernel.cpp").unlink()
    _, count = compile_all(sets, folders, toolchain, store, settings)
    assert count == 0 and toolchain.compiles == 2  # the store's binary is reused
    assert os.path.samefile(static / "kernel.so", store.path("// kernel 0\n"))
    assert (static / "kernel.cpp").read_text() == "// kernel 0\n"
    assert cache.damage(static / "kernel.so") is None
    assert _temp_names(tmp_path) == []


def test_temp_files_of_a_killed_build_are_removed_and_a_running_builds_kept(tmp_path):
    sets, folders, store, settings = _setup(tmp_path)
    static = folders["k1"].static_kernel("key0")
    stored = store.path("// kernel 0\n").parent
    records = tmp_path / "cpu" / "choices"
    live = os.getppid()  # another process that is running
    dead_files = [static / f".kernel.so.pid{DEAD}.link", static / f".kernel.so.pid{DEAD}.tmp",
                  static / f".kernel.cpp.pid{DEAD}.x1.tmp", folders["k1"].path / f".wrapper.so.pid{DEAD}.tmp",
                  stored / f".lib.so.pid{DEAD}.tmp", records / f".mm-1.json.pid{DEAD}.x2.tmp"]
    live_files = [static / f".kernel.so.pid{live}.link", records / f".mm-1.json.pid{live}.x3.tmp"]
    for path in dead_files + live_files:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half")
    compile_all(sets, folders, FakeToolchain(), store, settings)
    choice_cache.write_all(records, [], {}, ("0",))
    assert [p for p in dead_files if p.exists()] == []
    assert [p for p in live_files if p.exists()] == live_files


FAKE_CXX = """#!/bin/sh
# a stand-in compiler: records its TMPDIR, leaves a temp file there as gcc does, writes -o
echo "$TMPDIR" >> "$(dirname "$0")/tmpdirs.txt"
touch "$TMPDIR/ccFake.o"
while [ $# -gt 0 ]; do [ "$1" = -o ] && echo binary > "$2"; shift; done
"""


def test_the_compiler_runs_with_a_temp_folder_of_its_own_under_the_build_cache(tmp_path, monkeypatch):
    from aotpack import backends
    from aotpack.backends.cpu import toolchain as cpu_toolchain

    fake = tmp_path / "bin" / "g++"
    fake.parent.mkdir()
    fake.write_text(FAKE_CXX)
    fake.chmod(0o755)
    monkeypatch.setattr(cpu_toolchain, "CXX", str(fake))  # what $CXX sets at import
    settings = SimpleNamespace(target_isa="native", cache_dir=tmp_path / "cache")
    chain = backends.get("cpu").toolchain(settings)
    (tmp_path / "k.cpp").write_text("// kernel\n")
    chain.compile_kernel(tmp_path / "k.cpp", tmp_path / "k.so")
    chain.compile_kernel(tmp_path / "k.cpp", tmp_path / "k2.so")
    assert (tmp_path / "k.so").read_text() == "binary\n"
    first, second = (Path(p) for p in (tmp_path / "bin" / "tmpdirs.txt").read_text().split())
    root = tmp_path / "cache" / "tmp"
    assert first.parent == second.parent == root and first != second  # one folder per compiler run
    assert first.name.startswith(f"aotpack-cc-pid{os.getpid()}-")
    assert list(root.iterdir()) == []  # removed with the compiler's temp files when it exits


def test_compiler_temp_folders_of_a_killed_build_are_removed_by_the_next(tmp_path):
    sets, folders, store, settings = _setup(tmp_path)
    root = tmp_path / "tmp"
    dead, live = root / f"aotpack-cc-pid{DEAD}-x1", root / f"aotpack-cc-pid{os.getppid()}-x2"
    for folder in (dead, live):
        folder.mkdir(parents=True)
        (folder / "ccAbc123.o").write_bytes(b"half")
    toolchain = FakeToolchain()
    toolchain.temp_root = root
    compile_all(sets, folders, toolchain, store, settings)
    assert sorted(root.iterdir()) == [live]
