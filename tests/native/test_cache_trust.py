"""The runtime's extraction cache as a trust boundary (issue 49), attacked as a hostile user
would: swapped same-size libraries whose constructor writes a file, flipped weight bits,
cache trees of another uid or behind a symlink, damaged archives whose good copy is
cached, refused loads, threaded load/close cycles, the size cap and `aotpack cache`,
leftovers of a SIGKILLed runtime."""
from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import zstandard

import aotpack
from aotpack.archive import signing
from aotpack.commands.cli import main as cli_main
from aotpack.errors import AotpackError

from helpers import SAMPLES, eager_outputs
from helpers import cache_entries, cache_root, leftovers, run_native, signed_copy
from test_native_runtime import RUN, fx, require


POISON_SOURCE = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void poison(void) {
  int fd = open(POISON_PATH, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) { write(fd, "pwned\n", 6); close(fd); }
}
"""


# ---- fixtures and helpers ----

@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    return fx.build_fixture(tmp_path_factory.mktemp("fixture"))


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    private, public = signing.keygen(folder / "good.pem")
    return {"private": private, "public": public}


@pytest.fixture(scope="module")
def signed(fixture, keys, tmp_path_factory):
    return signed_copy(fixture["archive"], keys["private"], tmp_path_factory.mktemp("signed"))


@pytest.fixture()
def env(tmp_path, monkeypatch):
    """A private TMPDIR and extraction cache per test, for aotpack-run and aotpack.load alike."""
    (tmp_path / "tmp").mkdir()
    values = {"TMPDIR": str(tmp_path / "tmp"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    for key in ("AOTPACK_TRUSTED_KEYS", "AOTPACK_RUNTIME_CACHE", "AOTPACK_RUNTIME_CACHE_MB"):
        monkeypatch.delenv(key, raising=False)
    return dict(os.environ, **values)


run = run_native
root = cache_root
entries = cache_entries


def poison_library(tmp_path: Path, size: int) -> tuple[bytes, Path]:
    """A shared object of exactly `size` bytes whose constructor writes a file; (bytes, that file)."""
    source, library, witness = tmp_path / "poison.c", tmp_path / "poison.so", tmp_path / "pwned"
    source.write_text(POISON_SOURCE)
    subprocess.run(["gcc", "-shared", "-fPIC", "-Os", "-s", "-nostartfiles", "-Wl,-z,noseparate-code",
                    "-Wl,--build-id=none", f'-DPOISON_PATH="{witness}"', str(source), "-o", str(library)],
                   check=True)
    data = library.read_bytes()
    if len(data) > size:
        pytest.fail(f"the poison library ({len(data)} bytes) is bigger than the {size} it replaces")
    return data + b"\0" * (size - len(data)), witness


def warning_for(entry: Path, relative: str) -> str:
    return (f"aotpack: warning: extraction-cache entry failed its check (sha256 mismatch for "
            f"'{entry}/{relative}'): moved aside and extracted again\n")


def rewrite_archive(archive: Path, out: Path, change) -> Path:
    """A copy of `archive` with change(name, data) -> data applied to each member."""
    raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(archive.read_bytes()),
                                                     read_across_frames=True).read()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(raw)) as src, tarfile.open(fileobj=buffer, mode="w") as dst:
        for member in src:
            data = change(member.name, src.extractfile(member).read())
            member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    out.write_bytes(zstandard.ZstdCompressor().compress(buffer.getvalue()))
    return out


def run_fixture(archive, x, **options):
    with aotpack.load(archive, **options) as model:
        return [t.clone() for t in model.run(torch.from_numpy(x))]


# ---- 1. a poisoned entry never runs ----

@pytest.mark.parametrize("planted", [False, True], ids=["warm", "cold"])
@pytest.mark.parametrize("with_key", [False, True], ids=["unsigned", "signed"])
def test_a_swapped_model_so_in_the_cache_never_runs(fixture, signed, keys, env, tmp_path, planted, with_key):
    archive = signed if with_key else fixture["archive"]
    key_args = ["--trusted-key", keys["public"]] if with_key else []
    if planted:  # cold: the attacker planted a complete entry before this user's first load
        other = dict(env, XDG_CACHE_HOME=str(tmp_path / "elsewhere"))
        assert run(other, archive, "--check", *key_args).returncode == 0
        shutil.copytree(root(other), root(env), symlinks=True)
    else:  # warm: an entry of an earlier load of this user
        assert run(env, archive, "--check", *key_args).returncode == 0
    [name] = entries(env)
    entry = root(env) / name
    good = (entry / "model" / "model.so").read_bytes()
    poison, witness = poison_library(tmp_path, len(good))
    (entry / "model" / "model.so").write_bytes(poison)

    result = run(env, archive, fixture["x"], *key_args)
    assert result.returncode == 0, result.stderr
    assert result.stderr == warning_for(entry, "model/model.so")
    assert not witness.exists()
    assert (entry / "model" / "model.so").read_bytes() == good  # healed
    assert leftovers(env) == []
    # the healed entry is used from then on, quietly; in-process with keys as arguments too
    options = {"trusted_keys": [keys["public"]]} if with_key else {}
    y, calls = run_fixture(archive, fixture["x_array"], **options)
    np.testing.assert_array_equal(y.numpy(), fixture["expected"]["y"])
    assert run(env, archive, "--check", *key_args).stderr == ""


def test_a_flipped_weight_bit_is_detected_and_healed(fixture, env):
    run_fixture(fixture["archive"], fixture["x_array"])
    [name] = entries(env)
    weights = root(env) / name / "weights" / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x10  # inside the last tensor's bytes
    weights.write_bytes(bytes(data))
    y, calls = run_fixture(fixture["archive"], fixture["x_array"])
    np.testing.assert_array_equal(y.numpy(), fixture["expected"]["y"])
    assert calls.tolist() == [1]
    assert weights.read_bytes() == fixture["files"]["weights/weights.safetensors"]


# ---- cache trees that are not ours ----

def _plant_poisoned_tree(fixture, env, tmp_path, tree: Path) -> Path:
    """A complete, poisoned entry of the fixture under `tree` (an aotpack/runtime folder)."""
    other = dict(env, XDG_CACHE_HOME=str(tmp_path / "planted"))
    assert run(other, fixture["archive"], "--check").returncode == 0
    shutil.copytree(root(other), tree, symlinks=True)
    [name] = [p.name for p in tree.iterdir() if p.name != "tmp"]
    model_so = tree / name / "model" / "model.so"
    poison, witness = poison_library(tmp_path, model_so.stat().st_size)
    model_so.write_bytes(poison)
    return witness


def test_a_cache_tree_of_another_uid_is_not_used(fixture, env, tmp_path):
    aotpack_dir = root(env).parent
    witness = _plant_poisoned_tree(fixture, env, tmp_path, root(env))
    for path in [aotpack_dir, *aotpack_dir.rglob("*")]:
        os.lchown(path, 65534, 65534)
        if path.is_dir():
            path.chmod(0o777)
    result = run(env, fixture["archive"], fixture["x"])
    assert result.returncode == 0, result.stderr
    assert result.stderr == (f"aotpack: warning: not using the extraction cache: '{aotpack_dir}' belongs to "
                             "uid 65534, not to this user; extracting to a private folder\n")
    assert not witness.exists()
    assert os.listdir(env["TMPDIR"]) == []  # the private folder went with the model


def test_runtime_as_a_symlink_is_not_used(fixture, env, tmp_path):
    elsewhere = tmp_path / "elsewhere-runtime"
    witness = _plant_poisoned_tree(fixture, env, tmp_path, elsewhere)
    root(env).parent.mkdir(parents=True)
    root(env).symlink_to(elsewhere)
    result = run(env, fixture["archive"], fixture["x"])
    assert result.returncode == 0, result.stderr
    assert result.stderr == (f"aotpack: warning: not using the extraction cache: '{root(env)}' is a symbolic "
                             "link; extracting to a private folder\n")
    assert not witness.exists()


def test_open_cache_folders_of_ours_are_tightened(fixture, env):
    for folder in (root(env).parent, root(env), root(env) / "tmp"):
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o777)
    result = run(env, fixture["archive"], "--check")
    assert result.returncode == 0 and result.stderr == ""
    assert [oct((f).stat().st_mode & 0o777) for f in (root(env).parent, root(env), root(env) / "tmp")] == \
        ["0o700"] * 3
    assert len(entries(env)) == 1


def test_entry_paths_over_path_max_fall_back_to_a_private_folder(fixture, env, tmp_path, monkeypatch):
    deep = tmp_path
    while len(str(deep)) < 4096 - 100:
        deep = deep / ("d" * min(200, 4096 - 100 - len(str(deep))))
    deep.mkdir(parents=True)
    env = dict(env, XDG_CACHE_HOME=str(deep))
    result = run(env, fixture["archive"], "--check")
    assert result.returncode == 0, result.stderr
    assert result.stderr == (f"aotpack: warning: the archive's paths are too long for an extraction-cache entry "
                             f"under '{deep}/aotpack/runtime'; extracting to a private folder\n")
    assert entries(env) == [] and leftovers(env) == []


# ---- 2. --check and verify_archive read the archive itself ----

def test_check_refuses_a_damaged_copy_of_a_cached_archive(fixture, signed, keys, env, tmp_path):
    for archive, key_args in ((fixture["archive"], []), (signed, ["--trusted-key", keys["public"]])):
        assert run(env, archive, "--check", *key_args).returncode == 0
        damaged = rewrite_archive(archive, tmp_path / f"damaged-{archive.name}",
                                  lambda name, data: data[:-1] + bytes([data[-1] ^ 1])
                                  if name == "model/model.cpp" else data)
        result = run(env, damaged, "--check", *key_args)
        assert (result.returncode, result.stderr) == (
            1, f"aotpack-run: error: cannot load '{damaged}': sha256 mismatch for 'model/model.cpp' "
               "(the archive is corrupt or was modified)\n")
        with pytest.raises(AotpackError) as error:
            aotpack.load(damaged, verify_archive=True, trusted_keys=key_args[1:])
        assert str(error.value) == (f"cannot load '{damaged}': sha256 mismatch for 'model/model.cpp' (the "
                                    "archive is corrupt or was modified)")
        assert run(env, damaged, fixture["x"], *key_args).returncode == 0  # a plain load runs the proven entry
    assert len(entries(env)) == 1 and leftovers(env) == []


# ---- 3. a refused load publishes nothing ----

def test_a_refused_load_publishes_no_entry(fixture, env, tmp_path):
    library = tmp_path / "empty.so"
    (tmp_path / "empty.c").write_text("int aotpack_nothing_here;\n")
    subprocess.run(["gcc", "-shared", "-fPIC", str(tmp_path / "empty.c"), "-o", str(library)], check=True)
    files = fx.archive_files(library.read_bytes(), fx.make_weights())
    archive = fx.write_archive(tmp_path / "refused.aotpack", fx.make_manifest(files), files)
    result = run(env, archive, "--check")
    assert (result.returncode, result.stderr) == (
        1, f"aotpack-run: error: cannot load '{archive}': model/model.so does not export "
           "aotpack_model_abi_version\n")
    assert entries(env) == [] and leftovers(env) == []


# ---- 4. threads, sharing ----

@pytest.fixture(scope="module")
def mlp(build_model):
    return build_model(SAMPLES / "mlp.py")


def _rss_kib() -> int:
    return int(re.search(r"VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))


def _kernel_mappings() -> int:
    return sum("kernel.so" in line for line in Path("/proc/self/maps").read_text().splitlines())


def _cycles(archive, inputs, threads: int, per_thread: int) -> None:
    errors = []

    def work():
        try:
            for _ in range(per_thread):
                with aotpack.load(archive) as model:
                    model.run(*inputs)
        except Exception as exc:  # reported below
            errors.append(exc)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert errors == []


@pytest.mark.parametrize("cache", ["1", "0"])
def test_threaded_load_close_cycles_leave_rss_and_mappings_flat(mlp, env, monkeypatch, cache):
    monkeypatch.setenv("AOTPACK_RUNTIME_CACHE", cache)
    _, inputs = eager_outputs(SAMPLES / "mlp.py")
    # Warm first (allocator arenas of 8 threads, thread pools), then two equal batches: a
    # leak grows both (before the fix, +~9 MB and ~440 stale kernel.so mappings per 200
    # cycles); allocator noise settles in the first.
    _cycles(mlp.archive, inputs, threads=8, per_thread=10)
    maps = _kernel_mappings()
    _cycles(mlp.archive, inputs, threads=8, per_thread=25)
    rss = _rss_kib()
    _cycles(mlp.archive, inputs, threads=8, per_thread=25)
    assert _kernel_mappings() == maps
    assert _rss_kib() - rss < 4096, (rss, _rss_kib())
    assert leftovers(env) == []


def test_a_second_load_in_one_process_shares_the_first_ones_extraction(mlp, env):
    _, inputs = eager_outputs(SAMPLES / "mlp.py")
    with aotpack.load(mlp.archive) as first, aotpack.load(mlp.archive) as second:
        [name] = entries(env)
        assert leftovers(env) == []  # no private copy
        folders = {line.split()[-1].rsplit("/model/", 1)[0]
                   for line in Path("/proc/self/maps").read_text().splitlines() if line.endswith("/model.so")}
        assert folders == {str(root(env) / name)}
        torch.testing.assert_close(first.run(*inputs), second.run(*inputs))
    assert leftovers(env) == []


def test_a_swapped_kernel_so_never_runs(mlp, env, tmp_path):
    reference, inputs = eager_outputs(SAMPLES / "mlp.py")
    with aotpack.load(mlp.archive):
        pass
    [name] = entries(env)
    kernels = sorted((root(env) / name).rglob("kernel.so"), key=lambda p: -p.stat().st_size)
    good = kernels[0].read_bytes()
    poison, witness = poison_library(tmp_path, len(good))
    kernels[0].write_bytes(poison)
    with aotpack.load(mlp.archive) as model:
        torch.testing.assert_close(model.run(*inputs), reference)
    assert not witness.exists()
    assert kernels[0].read_bytes() == good


def test_a_build_leaves_no_cache_entry(env, cache_dir, tmp_path):
    from aotpack.build import build
    from aotpack.config import Settings

    build(SAMPLES / "mlp.py", tmp_path / "dist", settings=Settings.from_env(cache_dir=cache_dir))
    assert entries(env) == [] and leftovers(env) == []


# ---- 5. cap, eviction, aotpack cache ----

def _variant(fixture, tmp_path, seed: int) -> Path:
    files = fx.archive_files(fixture["model_so"], fx.make_weights(seed))
    return fx.write_archive(tmp_path / f"v{seed}.aotpack", fx.make_manifest(files), files)


def _entry_of(archive: Path) -> str:
    manifest = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(archive.read_bytes())).read()
    with tarfile.open(fileobj=io.BytesIO(manifest)) as tar:
        return tar.extractfile("manifest.sha256").read().decode().strip()


def test_the_cap_evicts_least_recently_used_entries_never_one_in_use(fixture, env, tmp_path, monkeypatch):
    a, b, c = (_variant(fixture, tmp_path, seed) for seed in (1, 2, 3))
    monkeypatch.setenv("AOTPACK_RUNTIME_CACHE_MB", "0")  # keep only what is in use
    with aotpack.load(a):
        with aotpack.load(b):
            pass
        assert entries(env) == sorted([_entry_of(a), _entry_of(b)])  # b was published while a was used
        with aotpack.load(c):
            assert entries(env) == sorted([_entry_of(a), _entry_of(c)])  # b evicted, a in use kept
    assert leftovers(env) == []
    monkeypatch.setenv("AOTPACK_RUNTIME_CACHE_MB", "lots")
    with pytest.raises(AotpackError) as error:
        aotpack.load(a)
    assert str(error.value) == (f"cannot load '{a}': AOTPACK_RUNTIME_CACHE_MB must be a whole number of "
                                "MiB, got 'lots'")


def test_cache_list_and_prune(fixture, env, tmp_path, capsys):
    from aotpack.runtime import extraction_cache as runtime_cache

    a, b, c = (_variant(fixture, tmp_path, seed) for seed in (1, 2, 3))
    for archive in (a, b, c):
        assert run(env, archive, "--check").returncode == 0
    digests = [_entry_of(x) for x in (a, b, c)]
    for i, digest in enumerate(digests):  # last use: a oldest
        os.utime(root(env) / digest / ".aotpack-lock", (1_700_000_000 + i * 60,) * 2)
    size = int(re.search(r"bytes (\d+)", (root(env) / digests[0] / ".aotpack-complete").read_text()).group(1))
    files = fx.archive_files(fixture["model_so"], fx.make_weights(1))
    assert size == sum(map(len, files.values())) + (root(env) / digests[0] / "manifest.json").stat().st_size
    shown = runtime_cache.format_size(size)

    def when(i):
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1_700_000_000 + i * 60))

    with aotpack.load(c):  # in use (and its last use is now)
        assert cli_main(["cache", "list"]) == 0
        now = (root(env) / digests[2] / ".aotpack-lock").stat().st_mtime
        rows = [f"{digests[0][:12]}  {'fixture_mlp 0.1.0':<24}  {shown:>10}  {when(0):<19}  no",
                f"{digests[1][:12]}  {'fixture_mlp 0.1.0':<24}  {shown:>10}  {when(1):<19}  no",
                f"{digests[2][:12]}  {'fixture_mlp 0.1.0':<24}  {shown:>10}  "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now)):<19}  yes"]
        assert capsys.readouterr().out.splitlines() == [
            f"{'ENTRY':<12}  {'MODEL':<24}  {'SIZE':>10}  {'LAST USE':<19}  IN USE", *rows,
            f"3 entries, {runtime_cache.format_size(3 * size)} in {root(env)} (cap 4096 MiB, "
            "AOTPACK_RUNTIME_CACHE_MB)"]
        # a cap of one entry's worth in bytes: the oldest goes first
        removed, kept = runtime_cache.prune(root(env), 2 * size)
        assert [e.path.name for e in removed] == digests[:1]
        assert cli_main(["cache", "prune", "--all"]) == 0
        assert capsys.readouterr().out == (f"removed 1 entry ({shown}); 1 entry left ({shown}), 1 in use\n")
        assert entries(env) == [digests[2]]
    assert cli_main(["cache", "prune", "--max-mb", "0"]) == 0
    assert capsys.readouterr().out == f"removed 1 entry ({shown}); 0 entries left (0 B), 0 in use\n"
    assert entries(env) == [] and leftovers(env) == []


# ---- 6. leftovers of a killed runtime without the cache ----

def test_sigkill_leftovers_without_the_cache_are_removed_by_the_next_load(fixture, env):
    no_cache = dict(env, AOTPACK_RUNTIME_CACHE="0")
    proc = subprocess.Popen([str(require(RUN)), str(fixture["archive"]), str(fixture["x"]), "--bench",
                             "100000000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=no_cache)
    assert proc.stdout.readline().startswith("load_ms="), proc.stderr.read()
    held = sorted(os.listdir(env["TMPDIR"]))
    assert len(held) == 2 and held[0].startswith("aotpack-") and held[1] == held[0] + ".lock"
    busy = subprocess.Popen([str(require(RUN)), str(fixture["archive"]), str(fixture["x"]), "--bench",
                             "100000000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=no_cache)
    assert busy.stdout.readline().startswith("load_ms=")
    proc.kill()
    proc.communicate(timeout=30)
    busy_folders = set(os.listdir(env["TMPDIR"])) - set(held)
    assert run(no_cache, fixture["archive"], "--check").returncode == 0
    assert set(os.listdir(env["TMPDIR"])) == busy_folders  # the killed one's gone, the running one's kept
    busy.send_signal(signal.SIGTERM)
    busy.communicate(timeout=30)
    assert os.listdir(env["TMPDIR"]) == [] and entries(env) == []
