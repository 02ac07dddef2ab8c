"""Ed25519 config signing keys: key files, key ids and signatures over a config's identity."""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "CryptoError",
    "SignatureError",
    "generate_keypair",
    "key_id",
    "key_pair_paths",
    "load_private_key",
    "load_public_key",
    "parse_public_key_text",
    "public_key_text",
    "sign_config",
    "sign_view",
    "signed_bytes",
    "verify_config",
    "verify_view",
    "view_signed_bytes",
    "write_key_files",
]

PUBLIC_KEY_ALGORITHM = "ed25519"
"""First field of the one-line public key format ``"ed25519 <base64 raw 32-byte key>"``."""

_RAW_PUBLIC_KEY_LEN = 32
_SIGNATURE_LEN = 64
_SIGNATURE_HEX = re.compile(r"[0-9a-f]{128}")
_MAX_KEY_FILE_BYTES = 64 * 1024  # a key file is a few hundred bytes; refuse to slurp anything big
_KEY_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SHA256_HEX_RE = re.compile(r"[0-9a-f]{64}")


class CryptoError(Exception):
    """The one error type of scale0.crypto: bad key file, bad encoding, bad argument, ..."""


class SignatureError(CryptoError):
    """A config signature did not verify (malformed, wrong, or from no trusted key)."""


# ---------------------------------------------------------------------------------------------
# base64 helpers


def _b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64decode_canonical(text: str) -> bytes | None:
    """Decode standard, padded base64; None unless ``text`` is exactly how its bytes encode.

    Requiring the canonical form means one byte string has one text form: no whitespace, no
    missing padding, no stray bits in the last character.
    """
    if not text.isascii():
        return None
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    if _b64encode(data) != text:
        return None
    return data


# ---------------------------------------------------------------------------------------------
# key files


def _write_temp(directory: Path, name: str, data: bytes, mode: int) -> Path:
    """Write ``data`` to a new temp file in ``directory``, created 0600, chmod'ed to ``mode``."""
    # mkstemp creates the file O_EXCL with mode 0600, so it is never readable by others.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return Path(tmp)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # platforms that cannot open a directory cannot fsync it either
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _install(tmp: Path, final: Path, *, overwrite: bool) -> None:
    """Move ``tmp`` to ``final`` atomically; without ``overwrite``, never clobber ``final``."""
    if overwrite:
        os.replace(tmp, final)
        return
    try:
        # A hard link fails if ``final`` exists, even if it appeared after our check.
        os.link(tmp, final)
    except FileExistsError:
        raise _exists(final) from None
    except OSError:
        # No hard links on this file system: fall back to check-then-replace.
        if final.exists() or final.is_symlink():
            raise _exists(final) from None
        os.replace(tmp, final)
        return
    os.unlink(tmp)


def _exists(path: Path) -> CryptoError:
    return CryptoError(f"{path} already exists; refusing to overwrite it (pass overwrite=True)")


def key_pair_paths(
    directory: str | os.PathLike[str],
    name: str,
    suffixes: tuple[str, str],
    *,
    overwrite: bool,
) -> tuple[Path, Path, Path]:
    """``(directory, secret file, public file)`` of a new key pair named ``name``, the files
    ending in ``suffixes``: the name checked, the directory there, and (without
    ``overwrite``) neither file present. Raises CryptoError naming what is wrong."""
    if not _KEY_NAME_RE.fullmatch(name):
        raise CryptoError(
            f"invalid key name {name!r}: use letters, digits, '.', '_' and '-', "
            "starting with a letter or digit"
        )
    dir_path = Path(directory)
    if not dir_path.is_dir():
        raise CryptoError(f"cannot create key pair: {dir_path} is not a directory")
    secret_path = dir_path / f"{name}{suffixes[0]}"
    public_path = dir_path / f"{name}{suffixes[1]}"
    if not overwrite:
        for path in (secret_path, public_path):
            if path.exists() or path.is_symlink():
                raise _exists(path)
    return dir_path, secret_path, public_path


def write_key_files(
    dir_path: Path,
    name: str,
    files: Sequence[tuple[Path, bytes, int]],
    *,
    overwrite: bool,
) -> None:
    """Write a key pair's files, all or none: each to a temp file of its final ``mode`` in
    ``dir_path`` (fsync'ed: a secret is never readable by others, not even for a moment), then
    moved in place, then the directory fsync'ed. Without ``overwrite`` a file that appeared
    after the caller's check refuses (CryptoError) and undoes the files installed so far (they
    cannot be anyone else's: the link is O_EXCL). Errors name the pair ``name``."""
    temps: list[Path] = []
    installed: list[Path] = []
    try:
        staged: list[tuple[Path, Path]] = []
        for final, data, mode in files:
            tmp = _write_temp(dir_path, final.name, data, mode)
            temps.append(tmp)
            staged.append((tmp, final))
        for tmp, final in staged:
            _install(tmp, final, overwrite=overwrite)
            installed.append(final)
    except CryptoError:
        for path in installed:
            with contextlib.suppress(OSError):
                os.unlink(path)
        raise
    except OSError as exc:
        raise CryptoError(f"cannot write key pair {name!r} in {dir_path}: {exc}") from exc
    finally:
        for tmp in temps:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    _fsync_dir(dir_path)


def generate_keypair(
    directory: str | os.PathLike[str], name: str = "signing", *, overwrite: bool = False
) -> tuple[Path, Path]:
    """Create a new Ed25519 key pair as ``<directory>/<name>.key`` and ``<directory>/<name>.pub``.

    ``<name>.key`` is the private key, PEM PKCS8 unencrypted, mode 0600 from the moment it
    exists (written to a 0600 temp file in the same directory, fsync'ed, then moved in place).
    ``<name>.pub`` is one line, ``"ed25519 <base64 raw 32-byte key>\\n"``, mode 0644.

    Refuses (CryptoError) if either file exists, unless ``overwrite``; returns
    ``(private_path, public_path)``.
    """
    dir_path, private_path, public_path = key_pair_paths(
        directory, name, (".key", ".pub"), overwrite=overwrite
    )

    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.PKCS8,
        encryption_algorithm=serialization.NoEncryption(),
    )
    public_line = (public_key_text(key.public_key()) + "\n").encode("ascii")

    write_key_files(
        dir_path,
        name,
        ((private_path, private_pem, 0o600), (public_path, public_line, 0o644)),
        overwrite=overwrite,
    )
    return private_path, public_path


def _read_key_file(path: Path, what: str, *, private: bool) -> bytes:
    """Read a small regular file; for a private key, refuse any group/other permission bits."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise CryptoError(f"{what} file {path} does not exist") from None
    except OSError as exc:
        raise CryptoError(f"cannot open {what} file {path}: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)  # the file we opened, not whatever the path names a moment later
        if not stat.S_ISREG(st.st_mode):
            raise CryptoError(f"{what} file {path} is not a regular file")
        if private and os.name == "posix" and st.st_mode & 0o077:
            raise CryptoError(
                f"{what} file {path} has mode {stat.S_IMODE(st.st_mode):04o} and is accessible "
                f"by group or others; refusing to use it. Fix with: chmod 600 {path}"
            )
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(_MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise CryptoError(f"cannot read {what} file {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if len(data) > _MAX_KEY_FILE_BYTES:
        raise CryptoError(f"{what} file {path} is too big to be a key file")
    return data


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """Load an unencrypted PEM PKCS8 Ed25519 private key, as written by generate_keypair.

    CryptoError (naming the file) if it is missing, unreadable, accessible by group or others
    (``mode & 0o077``), not PEM, encrypted, or not an Ed25519 key.
    """
    p = Path(path)
    data = _read_key_file(p, "private key", private=True)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise CryptoError(
            f"private key file {p} is encrypted; Scale0 needs an unencrypted PKCS8 key"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise CryptoError(
            f"private key file {p} does not hold a PEM private key (expected "
            "'-----BEGIN PRIVATE KEY-----', as written by generate_keypair)"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise CryptoError(
            f"private key file {p} holds a {type(key).__name__}, not an Ed25519 private key"
        )
    return key


def load_public_key(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    """Load an Ed25519 public key: the one-line ``"ed25519 <base64>"`` format, or PEM SPKI.

    CryptoError naming the file and the problem otherwise.
    """
    p = Path(path)
    data = _read_key_file(p, "public key", private=False)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CryptoError(f"public key file {p} is not text") from None
    stripped = text.strip()
    if stripped.startswith("-----BEGIN"):
        if "PRIVATE KEY-----" in stripped.splitlines()[0]:
            raise CryptoError(
                f"public key file {p} holds a private key; use the .pub file instead "
                "(and keep this one secret)"
            )
        try:
            key = serialization.load_pem_public_key(data)
        except (ValueError, UnsupportedAlgorithm):
            raise CryptoError(f"public key file {p} does not hold a valid PEM public key") from None
        if not isinstance(key, Ed25519PublicKey):
            raise CryptoError(
                f"public key file {p} holds a {type(key).__name__}, not an Ed25519 public key"
            )
        return key
    try:
        return parse_public_key_text(text)
    except CryptoError as exc:
        raise CryptoError(f"public key file {p}: {exc}") from None


# ---------------------------------------------------------------------------------------------
# public key text and ids


def public_key_text(key: Ed25519PublicKey) -> str:
    """The one-line text form of a public key: ``"ed25519 <base64 raw 32-byte key>"``."""
    raw = key.public_bytes(
        encoding=serialization.Encoding.Raw, format=serialization.PublicFormat.Raw
    )
    return f"{PUBLIC_KEY_ALGORITHM} {_b64encode(raw)}"


def parse_public_key_text(text: str) -> Ed25519PublicKey:
    """Parse ``"ed25519 <base64 raw 32-byte key>"`` (surrounding whitespace allowed).

    The base64 must be standard, padded and canonical. CryptoError says what is wrong.
    """
    line = text.strip()
    if "\n" in line or "\r" in line:
        raise CryptoError("a public key is one line: 'ed25519 <base64 key>'")
    fields = line.split()
    if len(fields) != 2:
        raise CryptoError(
            f"expected 'ed25519 <base64 key>' (two fields), got {len(fields)} field(s)"
        )
    algorithm, b64 = fields
    if algorithm != PUBLIC_KEY_ALGORITHM:
        raise CryptoError(f"unsupported key type {algorithm[:32]!r}; expected 'ed25519'")
    raw = _b64decode_canonical(b64)
    if raw is None:
        raise CryptoError("the key is not valid (standard, padded) base64")
    if len(raw) != _RAW_PUBLIC_KEY_LEN:
        raise CryptoError(f"an ed25519 public key is 32 bytes, this one is {len(raw)}")
    try:
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        raise CryptoError("the 32 bytes are not a valid ed25519 public key") from None


def key_id(key: Ed25519PublicKey) -> str:
    """How logs and errors name a key: first 16 hex chars of sha256 of the raw public key."""
    raw = key.public_bytes(
        encoding=serialization.Encoding.Raw, format=serialization.PublicFormat.Raw
    )
    return hashlib.sha256(raw).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# config signatures


def signed_bytes(family: str, config_version: int, sha256: str) -> bytes:
    """The exact message a config signature covers: ``f"{family}|{config_version}|{sha256}"``.

    Refuses (CryptoError) an empty family or one containing ``"|"``, a config_version that is
    not a non-negative int, and a sha256 that is not 64 lowercase hex characters, so that one
    message never stands for two different (family, version, sha256) triples.
    """
    if not isinstance(family, str) or not family:
        raise CryptoError("family must be a non-empty string")
    if "|" in family:
        raise CryptoError(f"family {family!r} must not contain '|'")
    if type(config_version) is not int or config_version < 0:
        raise CryptoError(f"config_version must be a non-negative int, got {config_version!r}")
    if not isinstance(sha256, str) or not _SHA256_HEX_RE.fullmatch(sha256):
        raise CryptoError(f"sha256 must be 64 lowercase hex characters, got {sha256!r}")
    try:
        return f"{family}|{config_version}|{sha256}".encode()
    except UnicodeEncodeError:
        raise CryptoError(f"family {family!r} is not encodable as UTF-8") from None


def sign_config(
    private_key: Ed25519PrivateKey, family: str, config_version: int, sha256: str
) -> str:
    """Sign ``signed_bytes(family, config_version, sha256)``; returns the signature as 128
    lowercase hex digits, the one spelling used on the wire and in signature files."""
    return private_key.sign(signed_bytes(family, config_version, sha256)).hex()


#: First field of what a client-view signature covers (docs/protocol.md §6.2): it has five
#: fields where a config signature has three, so neither can ever stand for the other.
VIEW_SIGNING_PREFIX = "client_view"


def view_signed_bytes(
    family: str, config_version: int, config_sha256: str, view_sha256: str
) -> bytes:
    """What a client-view signature covers:
    ``client_view|{family}|{config_version}|{config_sha256}|{view_sha256}``.

    ``config_sha256`` is the whole config's digest (the view belongs to that one config),
    ``view_sha256`` the view's (canonical JSON of the keys ``client_view`` names). The same
    checks as :func:`signed_bytes`; CryptoError when a field is not of its form.
    """
    if not isinstance(view_sha256, str) or not _SHA256_HEX_RE.fullmatch(view_sha256):
        raise CryptoError(f"view sha256 must be 64 lowercase hex characters, got {view_sha256!r}")
    whole = signed_bytes(family, config_version, config_sha256)
    return VIEW_SIGNING_PREFIX.encode() + b"|" + whole + b"|" + view_sha256.encode()


def sign_view(
    private_key: Ed25519PrivateKey,
    family: str,
    config_version: int,
    config_sha256: str,
    view_sha256: str,
) -> str:
    """Sign :func:`view_signed_bytes`; 128 lowercase hex digits, as :func:`sign_config`."""
    message = view_signed_bytes(family, config_version, config_sha256, view_sha256)
    return private_key.sign(message).hex()


def verify_config(
    signature_hex: str,
    family: str,
    config_version: int,
    sha256: str,
    trusted: Iterable[Ed25519PublicKey],
) -> str:
    """Verify a config signature against the trusted keys; return the key_id that verified.

    Raises SignatureError, saying why, whenever it does not return: not 128 lowercase hex
    digits, invalid signed fields, or no trusted key verifies (an empty trusted set never does).
    """
    try:
        message = signed_bytes(family, config_version, sha256)
    except CryptoError as exc:
        raise SignatureError(f"cannot verify: {exc}") from None
    return _verify(signature_hex, message, trusted)


def verify_view(
    signature_hex: str,
    family: str,
    config_version: int,
    config_sha256: str,
    view_sha256: str,
    trusted: Iterable[Ed25519PublicKey],
) -> str:
    """Verify a client-view signature (:func:`view_signed_bytes`); the key_id that verified.

    SignatureError as :func:`verify_config`.
    """
    try:
        message = view_signed_bytes(family, config_version, config_sha256, view_sha256)
    except CryptoError as exc:
        raise SignatureError(f"cannot verify: {exc}") from None
    return _verify(signature_hex, message, trusted)


def _verify(signature_hex: str, message: bytes, trusted: Iterable[Ed25519PublicKey]) -> str:
    if not isinstance(signature_hex, str):
        raise SignatureError("signature must be a hex string")
    if _SIGNATURE_HEX.fullmatch(signature_hex) is None:
        raise SignatureError(
            f"signature is not {2 * _SIGNATURE_LEN} lowercase hex digits "
            f"(got {len(signature_hex)} characters)"
        )
    signature = bytes.fromhex(signature_hex)
    keys = list(trusted)
    for key in keys:
        try:
            key.verify(signature, message)
        except InvalidSignature:
            continue
        return key_id(key)
    if not keys:
        raise SignatureError("no trusted key verifies the signature (tried 0 keys: none trusted)")
    plural = "key" if len(keys) == 1 else "keys"
    raise SignatureError(f"no trusted key verifies the signature (tried {len(keys)} {plural})")
