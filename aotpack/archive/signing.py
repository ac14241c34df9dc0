"""Ed25519 signatures of archives (docs/archive.md, "Integrity and signatures").

``manifest.sig`` holds the 64-byte Ed25519 signature of manifest.json's bytes; the manifest
holds the sha256 of every file, so the signature covers the whole archive. Keys are PEM
files: PKCS#8 private keys (``aotpack keygen``, or ``openssl genpkey -algorithm ed25519``)
and SubjectPublicKeyInfo public keys (``openssl pkey -in KEY.pem -pubout``). Signing an
archive file (reading and rewriting it) is ``writer.sign_archive``; this module knows bytes
and keys only.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from aotpack import env
from aotpack.errors import AotpackError


def trusted_keys_from_env() -> list[str]:
    """The PEM public keys named in $AOTPACK_TRUSTED_KEYS (colon-separated; empty
    components between keys are skipped), the runtime's rule (native/src/signature.cpp).

    Raises:
        AotpackError: it is set but names no key (``""``, ``":"``): an empty setting must
            not turn the signature check off.
    """
    return list(env.get(env.TRUSTED_KEYS))


def signature_required_from_env() -> bool:
    """$AOTPACK_REQUIRE_SIGNATURE: ``1`` requires trusted keys (and so a valid signature);
    unset, empty or ``0`` does not.

    Raises:
        AotpackError: any other value.
    """
    return env.get(env.REQUIRE_SIGNATURE)


#: The runtime's message (native/src/model.cpp) for a required signature without keys.
NO_KEY_FOR_REQUIRED_SIGNATURE = ("a signature is required, but no trusted key is set (AOTPACK_TRUSTED_KEYS "
                                 "or --trusted-key)")


def _crypto():
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:  # pragma: no cover - a declared dependency
        raise AotpackError("signing needs the 'cryptography' package: pip install cryptography") from None
    return serialization, ed25519, InvalidSignature


def _write_private(path: Path, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.pid{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def keygen(private_path: str | Path, public_path: str | Path | None = None) -> tuple[Path, Path]:
    """Create an Ed25519 key pair: ``private_path`` (PEM PKCS#8, mode 0600) and the public
    key (PEM, default ``<private_path stem>.pub.pem``). Refuses to overwrite a key.

    Raises:
        AotpackError: a target exists or cannot be written.
    """
    serialization, ed25519, _ = _crypto()
    private_path = Path(private_path)
    public_path = Path(public_path) if public_path else private_path.with_name(private_path.stem + ".pub.pem")
    for path in (private_path, public_path):
        if path.exists():
            raise AotpackError(f"{path} exists; refusing to overwrite a key")
        if not path.parent.is_dir():
            raise AotpackError(f"folder {path.parent} does not exist")
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    try:
        _write_private(private_path, private, 0o600)
        _write_private(public_path, public, 0o644)
    except OSError as exc:
        raise AotpackError(f"cannot write the key: {exc.strerror or exc}") from None
    return private_path, public_path


def _load_private(path: str | Path):
    serialization, ed25519, _ = _crypto()
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except OSError as exc:
        raise AotpackError(f"cannot read signing key {path}: {exc.strerror or exc}") from None
    except (ValueError, TypeError) as exc:
        raise AotpackError(f"signing key {path} is not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise AotpackError(f"signing key {path} is not an Ed25519 key")
    return key


def sign_bytes(message: bytes, key_path: str | Path) -> bytes:
    """64-byte Ed25519 signature of ``message`` with the private key at ``key_path``."""
    return _load_private(key_path).sign(message)


def signer(key_path: str | Path):
    """``sign(message) -> 64-byte Ed25519 signature`` with the private key at ``key_path``,
    read now (so an unusable key fails before any other work).

    Raises:
        AotpackError: the key cannot be read or is not an unencrypted Ed25519 PEM key.
    """
    return _load_private(key_path).sign


def verify_bytes(message: bytes, signature: bytes, key_paths: list[str]) -> tuple[str, str]:
    """Raise unless ``signature`` verifies ``message`` with one of the PEM public keys
    (the runtime's rule and messages, native/src/signature.cpp).

    Returns:
        (path, fingerprint) of the first key that verifies it: the path as given and the
        hex sha256 of the key's DER SubjectPublicKeyInfo, as the runtime reports them.
    """
    serialization, ed25519, invalid = _crypto()
    keys = []
    for path in key_paths:
        try:
            key = serialization.load_pem_public_key(Path(path).read_bytes())
        except OSError:
            raise AotpackError(f"cannot read trusted key '{path}'") from None
        except ValueError:
            key = None
        if not isinstance(key, ed25519.Ed25519PublicKey):
            raise AotpackError(f"trusted key '{path}' is not an Ed25519 public key in PEM form")
        keys.append(key)
    if len(signature) != 64:
        raise AotpackError("manifest.sig is not a 64-byte Ed25519 signature")
    for path, key in zip(key_paths, keys):
        try:
            key.verify(signature, message)
        except invalid:
            continue
        der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        return str(path), hashlib.sha256(der).hexdigest()
    raise AotpackError(f"manifest.sig does not verify with any trusted key ({len(keys)} in "
                       "AOTPACK_TRUSTED_KEYS/--trusted-key): the archive was modified or signed by someone else")
