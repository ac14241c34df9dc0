"""Self-healing build cache: damaged entries are detected, quarantined and rebuilt; killed
builds leave nothing that the next build does not remove; the output folder is checked first."""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aotpack.tune import cache
from aotpack.archive import layout
from aotpack.build import build
from aotpack.config import Settings
from aotpack.errors import AotpackError
from aotpack.archive.writer import read_manifest, read_members
from helpers import REPO, SAMPLES, assert_native_parity


MODEL = SAMPLES / "mlp.py"


def _winner_paths(cache_dir: Path, manifest: dict) -> list[tuple[Path, Path]]:
    """(kernel folder, winner kernel.so) of every kernel of a build."""
    found = []
    for kernel in manifest["kernels"]:
        for folder in (cache_dir / "cpu" / kernel["name"].rsplit("_", 1)[0]).iterdir():
            so = folder / "static_kernel" / kernel["kernel_key"] / "kernel.so"
            if so.is_file():
                found.append((folder, so))
    return found


def _damage(kind: str, folder: Path, so: Path) -> None:
    if kind == "truncated kernel.so":
        so.write_bytes(so.read_bytes()[:1000])  # in place: the binary store's link too
    elif kind == "empty kernel.so":
        os.truncate(so, 0)
    elif kind == "swapped kernel.so":
        so.write_bytes((folder / "wrapper.so").read_bytes())
    elif kind == "truncated wrapper.so":
        wrapper = folder / "wrapper.so"
        wrapper.write_bytes(wrapper.read_bytes()[:2000])
    elif kind == "empty wrapper.so":
        os.truncate(folder / "wrapper.so", 0)
    elif kind == "swapped wrapper.so":
        (folder / "wrapper.so").write_bytes(so.read_bytes())
    elif kind == "garbage kernel.cpp":
        (so.parent / "kernel.cpp").write_text("this is not C++ {")
        store = so.parent.parents[3] / "binaries"
        for source in store.glob("*/source.cpp"):
            source.write_text("garbage")
    elif kind == "garbage choice records":
        for record in (so.parents[4] / "choices").glob("*.json"):
            record.write_text("{not json")


DAMAGE = ["truncated kernel.so", "empty kernel.so", "swapped kernel.so", "truncated wrapper.so",
          "empty wrapper.so", "swapped wrapper.so",
          "garbage kernel.cpp", "garbage choice records"]


def _cli_build(out: Path, cache_dir: Path, topn: int) -> subprocess.CompletedProcess:
    """``aotpack build`` in a fresh process: one that never mapped the damaged files."""
    env = dict(os.environ, AOTPACK_CACHE_DIR=str(cache_dir), PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "aotpack", "build", str(MODEL), "-o", str(out),
                           "--topn", str(topn)], env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def clean_cache(tmp_path_factory) -> Path:
    """A cache filled by one undamaged --topn 2 build (every candidate compiled)."""
    root = tmp_path_factory.mktemp("clean")
    result = build(MODEL, root / "out", settings=Settings.from_env(topn=2, cache_dir=root / "cache"))
    return root / "cache", result.manifest


@pytest.mark.parametrize("kind", DAMAGE)
def test_damaged_cache_is_rebuilt_and_ships_clean_files(tmp_path, kind, clean_cache):
    clean_cache, manifest = clean_cache
    shutil.copytree(clean_cache, tmp_path / "cache")  # a cache of an earlier build, to damage
    for folder, so in _winner_paths(tmp_path / "cache", manifest):
        _damage(kind, folder, so)
    result = _cli_build(tmp_path / "b", tmp_path / "cache", 2)  # no crash, no error
    assert result.returncode == 0, result.stderr
    if kind == "garbage choice records":  # binaries intact: only the choice is made again
        assert "Autotune completed" in result.stderr and "candidates compiled" not in result.stderr
    if kind.endswith(".so"):
        assert "is damaged" in result.stderr and "moved to" in result.stderr
        assert list((tmp_path / "cache").rglob("quarantine/*"))
    again = tmp_path / "b" / "mlp-0.1.0.aotpack"
    assert_native_parity(again, MODEL, tmp_path / "run")
    # what shipped is what a clean cache compiles for the same candidates
    shipped = read_members(again)
    for entry in read_manifest(again)["kernels"]:
        base = entry["name"].rsplit("_", 1)[0]
        (fresh,) = clean_cache.glob(f"cpu/{base}/*/static_kernel/{entry['kernel_key']}/kernel.so")
        assert shipped[entry["lib_kernel"]] == fresh.read_bytes()
        source = layout.lib_kernel_source_path(entry["name"], entry["kernel_key"])
        assert shipped[source] == (fresh.parent / "kernel.cpp").read_bytes()


def test_integrity_record_catches_a_changed_binary(tmp_path):
    binary = tmp_path / "lib.so"
    binary.write_bytes(b"\x7fELF" + b"\0" * 60)
    cache.record(binary)
    assert cache.damage(binary) is None
    binary.write_bytes(b"\x7fELF")
    assert cache.damage(binary) == "4 bytes, 64 when it was written"
    with pytest.raises(AotpackError, match="changed during the build"):
        cache.verified_bytes(binary)


def test_leftovers_of_killed_builds_are_removed(tmp_path):
    out = tmp_path / "out"
    # another process builds: this one must never map a file it then truncates
    assert _cli_build(out, tmp_path / "cache", 1).returncode == 0
    archive = out / "mlp-0.1.0.aotpack"
    dead = 2 ** 22 + 12345  # above any pid this machine hands out (pid_max)
    partial = out / f".{archive.name}.pid{dead}.abc.partial"
    partial.write_bytes(b"half")
    folder, so = _winner_paths(tmp_path / "cache", read_manifest(archive))[0]
    stale = folder / f".wrapper.so.pid{dead}.tmp"
    stale.write_bytes(b"half")
    (so.parent / f".kernel.so.pid{dead}.link").write_bytes(b"half")
    live = folder / f".wrapper.so.pid{os.getpid()}.tmp"  # a running build's: kept
    live.write_bytes(b"busy")
    os.truncate(so, 0)  # forces a recompile into that folder
    assert _cli_build(out, tmp_path / "cache", 1).returncode == 0
    assert not partial.exists() and not stale.exists()
    assert not (so.parent / f".kernel.so.pid{dead}.link").exists()
    assert live.exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_signal_during_build_leaves_nothing_behind(tmp_path, sig):
    tmpdir, out, cache_dir = tmp_path / "tmp", tmp_path / "out", tmp_path / "cache"
    tmpdir.mkdir()
    env = dict(os.environ, TMPDIR=str(tmpdir), AOTPACK_CACHE_DIR=str(cache_dir), PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "aotpack", "build", str(SAMPLES / "transformer_block.py"), "-o", str(out),
           "--topn", "3"]
    # a new process group, signalled as a terminal signals a job (compilers included)
    # SIGINT at its default in the child: a shell that runs this suite in the background
    # ignores SIGINT for its jobs, and Python then keeps it ignored
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not list(cache_dir.rglob("*.so")) and time.monotonic() < deadline:  # compiling by now
        time.sleep(0.05)
    os.killpg(proc.pid, sig)
    proc.wait(timeout=60)
    if sig != signal.SIGKILL:
        assert proc.returncode == 130, proc.stderr.read().decode()
    else:  # nothing can clean up after SIGKILL: the next build does
        subprocess.run(cmd, env=env, check=True, capture_output=True)
    assert not list(out.glob(".*.partial"))
    assert not [p for p in tmpdir.iterdir() if p.name.startswith("aotpack-")]
    assert not [p for p in cache_dir.rglob(".*") if p.name.endswith((".tmp", ".link"))]


def test_unwritable_output_folder_fails_before_any_compile(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    settings = Settings.from_env(topn=1, cache_dir=tmp_path / "cache")
    with pytest.raises(AotpackError) as info:
        build(MODEL, blocker, settings=settings)
    assert str(info.value) == f"output folder {blocker} is a file, not a folder; choose another with -o"
    with pytest.raises(AotpackError) as info:
        build(MODEL, blocker / "sub", settings=settings)
    assert str(info.value) == (f"cannot create output folder {blocker / 'sub'}: {blocker} is a file; "
                               "choose another with -o")
    assert not (tmp_path / "cache").exists()  # nothing compiled
