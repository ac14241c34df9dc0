"""Trust, caching, signals and limits of the native runtime (issue 7), on the hand-built
fixture archive of tests/native_fixture: signatures refused before anything is written,
the extraction cache reused and healed, nothing left behind after any signal, device
limits capped by the available cores, endless inputs refused."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from aotpack.archive import signing
from aotpack.config import available_cores

from helpers import cache_entries as entries, cache_root, leftovers, run_native, signed_copy
from test_native_runtime import fx, require, RUN



@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    return fx.build_fixture(tmp_path_factory.mktemp("fixture"))


@pytest.fixture()
def env(tmp_path):
    """A private TMPDIR and extraction cache per test."""
    (tmp_path / "tmp").mkdir()
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("AOTPACK_TRUSTED_KEYS", None)  # no keys (set but empty is an error)
    return env


def run(env, *args, timeout=60):
    return run_native(env, *args, timeout=timeout)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    good = signing.keygen(folder / "good.pem")
    other = signing.keygen(folder / "other.pem")
    return {"private": good[0], "public": good[1], "other_public": other[1]}


@pytest.fixture(scope="module")
def signed(fixture, keys, tmp_path_factory):
    return signed_copy(fixture["archive"], keys["private"], tmp_path_factory.mktemp("signed"))


# ---- signatures ----

def test_signed_archive_loads_with_the_right_key(signed, keys, env):
    result = run(env, signed, "--check", "--trusted-key", keys["public"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok: fixture_mlp 0.1.0")


def test_signed_archive_loads_with_the_environment_key(signed, keys, env):
    result = run(dict(env, AOTPACK_TRUSTED_KEYS=f"{keys['other_public']}:{keys['public']}"), signed, "--check")
    assert result.returncode == 0, result.stderr


def _refused_before_writing(env, result, needle):
    assert result.returncode == 1, result
    assert needle in result.stderr, result.stderr
    assert entries(env) == [] and leftovers(env) == []


def test_wrong_key_is_refused_before_anything_is_written(signed, keys, env):
    result = run(env, signed, "--check", "--trusted-key", keys["other_public"])
    _refused_before_writing(env, result, "manifest.sig does not verify with any trusted key (1 in "
                                         "AOTPACK_TRUSTED_KEYS/--trusted-key)")


def test_unsigned_archive_is_refused_when_keys_are_set(fixture, keys, env):
    result = run(env, fixture["archive"], "--check", "--trusted-key", keys["public"])
    _refused_before_writing(env, result, "the archive is not signed, but trusted keys are set")


def test_tampered_manifest_is_refused(fixture, keys, env, tmp_path):
    files = dict(fixture["files"])
    manifest = fx.make_manifest(files, device_limit=1)  # a consistent, re-digested edit
    forged = fx.write_archive(tmp_path / "forged.aotpack", manifest, files)
    import zstandard, tarfile, io
    signed_sig = signing.sign_bytes(b"something else", keys["private"])
    raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(forged.read_bytes()), read_across_frames=True).read()
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(raw)) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for i, member in enumerate(src):
            dst.addfile(member, src.extractfile(member))
            if member.name == "manifest.sha256":
                info = tarfile.TarInfo("manifest.sig")
                info.size = 64
                dst.addfile(info, io.BytesIO(signed_sig))
    forged.write_bytes(zstandard.ZstdCompressor().compress(out.getvalue()))
    result = run(env, forged, "--check", "--trusted-key", keys["public"])
    _refused_before_writing(env, result, "manifest.sig does not verify with any trusted key")


def test_tampered_file_is_refused_before_dlopen(signed, keys, env, tmp_path):
    import io, tarfile, zstandard
    raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(signed.read_bytes()), read_across_frames=True).read()
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(raw)) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for member in src:
            data = src.extractfile(member).read()
            if member.name == "model/model.cpp":
                data = data.replace(b"namespace", b"NAMESPACE", 1)
            dst.addfile(member, io.BytesIO(data))
    tampered = tmp_path / "tampered.aotpack"
    tampered.write_bytes(zstandard.ZstdCompressor().compress(out.getvalue()))
    result = run(env, tampered, "--check", "--trusted-key", keys["public"])
    assert result.returncode == 1
    assert "sha256 mismatch for 'model/model.cpp'" in result.stderr
    assert entries(env) == [] and leftovers(env) == []


def test_python_verify_checks_signatures(signed, keys, fixture):
    from aotpack.commands.verify import verify
    lines = verify(signed, trusted_keys=[str(keys["other_public"]), str(keys["public"])])
    assert lines[1].startswith(f"signature: valid, key {keys['public']} (sha256 ")
    with pytest.raises(Exception, match="the archive is not signed"):
        verify(fixture["archive"], trusted_keys=[str(keys["public"])])
    with pytest.raises(Exception, match="does not verify with any trusted key"):
        verify(signed, trusted_keys=[str(keys["other_public"])])


# ---- the extraction cache ----

def test_cache_is_reused_and_stale_entries_are_redone(fixture, env):
    assert run(env, fixture["archive"], "--check").returncode == 0
    [entry] = entries(env)
    model_so = cache_root(env) / entry / "model" / "model.so"
    first = model_so.stat().st_ino
    assert run(env, fixture["archive"], "--check").returncode == 0
    assert model_so.stat().st_ino == first  # reused, not re-extracted
    os.truncate(model_so, 100)  # damaged: detected, redone
    result = run(env, fixture["archive"], fixture["x"])
    assert result.returncode == 0, result.stderr
    assert model_so.stat().st_size == len(fixture["files"]["model/model.so"])
    (cache_root(env) / entry / ".aotpack-complete").unlink()  # partial: redone
    assert run(env, fixture["archive"], "--check").returncode == 0
    assert (cache_root(env) / entry / ".aotpack-complete").exists()
    assert leftovers(env) == []


def test_no_cache_extracts_privately(fixture, env):
    result = run(dict(env, AOTPACK_RUNTIME_CACHE="0"), fixture["archive"], "--check")
    assert result.returncode == 0, result.stderr
    assert entries(env) == [] and leftovers(env) == []


# ---- signals ----

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_nothing_left_after_a_signal_during_bench(fixture, env, sig):
    proc = subprocess.Popen([str(require(RUN)), str(fixture["archive"]), str(fixture["x"]), "--bench",
                             "100000000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    assert line.startswith("load_ms="), proc.stderr.read()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    if sig == signal.SIGKILL:
        assert proc.returncode == -sig
        assert run(env, fixture["archive"], "--check").returncode == 0  # the next load cleans up
    else:
        assert proc.returncode == 128 + sig, err
        assert err == f"aotpack-run: stopped by signal {int(sig)}\n"
    assert leftovers(env) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_nothing_left_after_a_signal_during_load(fixture, env, sig):
    proc = subprocess.Popen([str(require(RUN)), str(fixture["archive"]), "--check"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(env, AOTPACK_RUNTIME_CACHE="1"))
    time.sleep(0.05)
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    assert run(env, fixture["archive"], "--check").returncode == 0
    assert os.listdir(env["TMPDIR"]) == [] and leftovers(env) == []


# ---- limits ----

def test_device_limit_above_the_cores_is_an_error(fixture, env):
    cores = available_cores()
    result = run(env, fixture["archive"], fixture["x"], "--device-limit", 512)
    assert result.returncode == 1
    assert (f"device limit 512 exceeds the {cores} cores available to this process (CPU affinity and "
            f"cgroup quota); use at most {cores}") in result.stderr


def test_endless_input_is_refused(fixture, env):
    result = run(env, fixture["archive"], "/dev/zero", timeout=20)
    assert result.returncode == 1
    assert result.stderr == "aotpack-run: error: cannot read '/dev/zero': not a regular file\n"


def test_declared_sizes_over_the_limits_are_refused_before_reading(fixture, env):
    result = run(dict(env, AOTPACK_MAX_TOTAL_BYTES="1000"), fixture["archive"], "--check")
    assert result.returncode == 1
    assert "add up to more than the limit of 1000 bytes (AOTPACK_MAX_TOTAL_BYTES)" in result.stderr
    assert entries(env) == [] and leftovers(env) == []
