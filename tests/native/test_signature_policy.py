"""Signature policy (issue 49, item 10): a trusted-key setting that names no key is an
error, never "no signature required"; a setting requires signatures; a load reports
whether the archive was signed and by which key; keys travel as arguments."""
from __future__ import annotations

import hashlib
import os

import pytest
from cryptography.hazmat.primitives import serialization

import aotpack
from aotpack.commands import cli
from aotpack.runtime import loader
from aotpack.archive import reader
from aotpack.archive import signing
from aotpack.errors import AotpackError
from aotpack.commands.verify import verify
from helpers import run_native, signed_copy
from test_native_runtime import fx


NO_KEY = ("AOTPACK_TRUSTED_KEYS is set but names no key: '{}'; set it to colon-separated PEM public "
          "key files, or unset it to load unsigned archives")
REQUIRED = "a signature is required, but no trusted key is set (AOTPACK_TRUSTED_KEYS or --trusted-key)"


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    return fx.build_fixture(tmp_path_factory.mktemp("fixture"))


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    private, public = signing.keygen(folder / "good.pem")
    der = serialization.load_pem_public_key(public.read_bytes()).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return {"private": private, "public": public, "sha256": hashlib.sha256(der).hexdigest()}


@pytest.fixture(scope="module")
def signed(fixture, keys, tmp_path_factory):
    return signed_copy(fixture["archive"], keys["private"], tmp_path_factory.mktemp("signed"))


@pytest.fixture()
def env(tmp_path, monkeypatch):
    """No signature setting in this process or the tools it starts; a private cache."""
    for name in ("AOTPACK_TRUSTED_KEYS", "AOTPACK_REQUIRE_SIGNATURE"):
        monkeypatch.delenv(name, raising=False)
    return dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))


native = run_native


@pytest.fixture()
def aotpack_main(capsys, monkeypatch):
    """The aotpack command in this process (its signal handlers left out): returns
    (exit status, stdout, stderr)."""
    monkeypatch.setattr(cli, "_stop_on_terminate", lambda: None)

    def main(*args) -> tuple[int, str, str]:
        capsys.readouterr()
        status = cli.main(list(map(str, args)))
        out = capsys.readouterr()
        return status, out.out, out.err

    return main


# ---- a setting that names no key ----

@pytest.mark.parametrize("value", ["", ":", "::"])
def test_trusted_keys_naming_no_key_are_refused_by_the_runtime(fixture, env, monkeypatch, value):
    result = native(dict(env, AOTPACK_TRUSTED_KEYS=value), fixture["archive"], "--check")
    assert (result.returncode, result.stderr) == (
        1, f"aotpack-run: error: cannot load '{fixture['archive']}': {NO_KEY.format(value)}\n")
    monkeypatch.setenv("AOTPACK_TRUSTED_KEYS", value)
    with pytest.raises(AotpackError) as error:
        aotpack.load(fixture["archive"])
    assert str(error.value) == f"cannot load '{fixture['archive']}': {NO_KEY.format(value)}"


@pytest.mark.parametrize("value", ["", ":", "::"])
def test_trusted_keys_naming_no_key_are_refused_by_verify(fixture, env, monkeypatch, aotpack_main, value):
    monkeypatch.setenv("AOTPACK_TRUSTED_KEYS", value)
    with pytest.raises(AotpackError) as error:
        reader.trusted_keys_from_env()
    assert str(error.value) == NO_KEY.format(value)
    assert aotpack_main("verify", fixture["archive"]) == (1, "", f"aotpack: error: {NO_KEY.format(value)}\n")


def test_empty_components_between_keys_are_skipped(signed, keys, env):
    result = native(dict(env, AOTPACK_TRUSTED_KEYS=f":{keys['public']}::"), signed, "--check", "-v")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"signature: valid, key {keys['public']} (sha256 {keys['sha256']})"


# ---- requiring a signature ----

def test_require_signature_refuses_an_unsigned_archive(fixture, keys, env, aotpack_main, tmp_path):
    archive = fixture["archive"]
    for args, extra_env in [(["--require-signature"], {}), ([], {"AOTPACK_REQUIRE_SIGNATURE": "1"})]:
        result = native(dict(env, **extra_env), archive, "--check", *args)
        assert (result.returncode, result.stderr) == (1, f"aotpack-run: error: cannot load '{archive}': {REQUIRED}\n")
    result = native(env, archive, "--check", "--require-signature", "--trusted-key", keys["public"])
    assert (result.returncode, result.stderr) == (
        1, f"aotpack-run: error: cannot load '{archive}': the archive is not signed, but trusted keys are set "
           "(AOTPACK_TRUSTED_KEYS/--trusted-key)\n")
    assert aotpack_main("verify", archive, "--require-signature") == (1, "", f"aotpack: error: {REQUIRED}\n")
    assert aotpack_main("run", archive, "--inputs", fixture["x"], "--require-signature") == (
        1, "", f"aotpack: error: cannot load '{archive}': {REQUIRED}\n")
    result = native(dict(env, AOTPACK_REQUIRE_SIGNATURE="yes"), archive, "--check")
    assert result.stderr == (f"aotpack-run: error: cannot load '{archive}': AOTPACK_REQUIRE_SIGNATURE must be "
                             "0 or 1, got 'yes'\n")


def test_require_signature_env_applies_to_verify_and_load(fixture, signed, keys, env, monkeypatch):
    monkeypatch.setenv("AOTPACK_REQUIRE_SIGNATURE", "1")
    with pytest.raises(AotpackError) as error:
        verify(fixture["archive"])
    assert str(error.value) == REQUIRED
    with pytest.raises(AotpackError) as error:
        aotpack.load(fixture["archive"])
    assert str(error.value) == f"cannot load '{fixture['archive']}': {REQUIRED}"
    with aotpack.load(signed, trusted_keys=[keys["public"]]) as model:
        assert model.signature.verified


# ---- reporting the signature ----

def test_model_signature(fixture, signed, keys, env):
    with aotpack.load(fixture["archive"]) as model:
        assert model.signature is None
    with aotpack.load(signed) as model:
        assert model.signature == loader.Signature(verified=False, key_path=None, key_sha256=None)
    with aotpack.load(signed, trusted_keys=[keys["public"]]) as model:
        assert model.signature == loader.Signature(True, str(keys["public"]), keys["sha256"])


def test_verbose_prints_the_signature_line(fixture, signed, keys, env, aotpack_main):
    valid = f"signature: valid, key {keys['public']} (sha256 {keys['sha256']})"
    for archive, args, line in [
            (fixture["archive"], [], "signature: none (unsigned archive)"),
            (signed, [], "signature: present, not checked (no trusted keys given)"),
            (signed, ["--trusted-key", keys["public"]], valid)]:
        result = native(env, archive, "--check", "-v", *args)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[0] == line
        status, out, err = aotpack_main("run", archive, "--inputs", fixture["x"], "-v", *args)
        assert status == 0, err
        assert out.splitlines()[0] == line
    result = native(env, signed, "--check")
    assert result.stdout.startswith("ok: fixture_mlp 0.1.0")  # no line without -v
    status, out, err = aotpack_main("verify", signed, "--trusted-key", keys["public"])
    assert status == 0, err
    assert out.splitlines()[1] == valid  # aotpack verify names the key the same way


# ---- keys travel as arguments ----

def test_keys_are_passed_to_the_load_not_written_to_the_environment(fixture, signed, keys, env, monkeypatch,
                                                                    aotpack_main):
    loads = []
    real_load = loader.load

    def spy(path, *args, **kwargs):
        loads.append((kwargs.get("trusted_keys"), os.environ.get("AOTPACK_TRUSTED_KEYS")))
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(loader, "load", spy)
    monkeypatch.setattr("aotpack.commands.run.load", spy)
    status, _, err = aotpack_main("run", signed, "--inputs", fixture["x"], "--trusted-key", keys["public"])
    assert status == 0, err
    status, out, err = aotpack_main("verify", signed, "--run", "--trusted-key", keys["public"])
    assert status == 1 and "load: ok: fixture_mlp 0.1.0" in err  # loaded; the fixture has no self-test
    assert loads == [([str(keys["public"])], None)] * 2
