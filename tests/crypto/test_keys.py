"""Tests for scale0.crypto.keys: key files, public key text, key ids, config signatures."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from hypothesis import given
from hypothesis import strategies as st

from scale0.crypto.keys import (
    CryptoError,
    SignatureError,
    generate_keypair,
    key_id,
    load_private_key,
    load_public_key,
    parse_public_key_text,
    public_key_text,
    sign_config,
    sign_view,
    signed_bytes,
    verify_config,
    verify_view,
    view_signed_bytes,
)

FAMILY = "prod-eu"
VERSION = 7
SHA = hashlib.sha256(b'{"family":"prod-eu"}').hexdigest()

posix_only = pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _flip_char(text: str, i: int, alphabet: str) -> str:
    replacement = next(c for c in alphabet if c != text[i])
    return text[:i] + replacement + text[i + 1 :]


@pytest.fixture
def signer() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def signature(signer: Ed25519PrivateKey) -> str:
    return sign_config(signer, FAMILY, VERSION, SHA)


# ---------------------------------------------------------------------------------------------
# signed_bytes


def test_signed_bytes_is_the_exact_message() -> None:
    assert signed_bytes(FAMILY, VERSION, SHA) == f"prod-eu|7|{SHA}".encode()
    assert signed_bytes("fäm", 0, SHA) == f"fäm|0|{SHA}".encode()


@pytest.mark.parametrize(
    ("family", "version", "sha"),
    [
        ("a|b", VERSION, SHA),
        ("", VERSION, SHA),
        ("bad\udc80", VERSION, SHA),
        (FAMILY, -1, SHA),
        (FAMILY, True, SHA),
        (FAMILY, VERSION, SHA.upper()),
        (FAMILY, VERSION, SHA[:-1]),
        (FAMILY, VERSION, SHA + "0"),
        (FAMILY, VERSION, SHA[:-1] + "g"),
        (FAMILY, VERSION, SHA + "\n"),
        (FAMILY, VERSION, ""),
    ],
)
def test_signed_bytes_refuses_ambiguous_or_malformed_fields(
    family: str, version: int, sha: str
) -> None:
    with pytest.raises(CryptoError):
        signed_bytes(family, version, sha)


def test_sign_refuses_a_family_with_a_pipe(signer: Ed25519PrivateKey) -> None:
    with pytest.raises(CryptoError, match=r"\|"):
        sign_config(signer, "a|b", VERSION, SHA)


# ---------------------------------------------------------------------------------------------
# the client view's signature (docs/protocol.md §6.2)

VIEW_SHA = hashlib.sha256(b'{"family":"prod-eu","config_version":7}').hexdigest()


def test_view_signed_bytes_is_the_exact_message() -> None:
    expected = f"client_view|prod-eu|7|{SHA}|{VIEW_SHA}".encode()
    assert view_signed_bytes(FAMILY, VERSION, SHA, VIEW_SHA) == expected


@pytest.mark.parametrize("view", [VIEW_SHA.upper(), VIEW_SHA[:-1], "", VIEW_SHA + "|x"])
def test_view_signed_bytes_refuses_a_malformed_view_sha256(view: str) -> None:
    with pytest.raises(CryptoError, match="view sha256"):
        view_signed_bytes(FAMILY, VERSION, SHA, view)


def test_a_view_signature_verifies_and_binds_every_field(signer: Ed25519PrivateKey) -> None:
    public = signer.public_key()
    view = sign_view(signer, FAMILY, VERSION, SHA, VIEW_SHA)
    assert verify_view(view, FAMILY, VERSION, SHA, VIEW_SHA, [public]) == key_id(public)
    other = hashlib.sha256(b"other").hexdigest()
    for args in (
        ("other", VERSION, SHA, VIEW_SHA),
        (FAMILY, VERSION + 1, SHA, VIEW_SHA),
        (FAMILY, VERSION, other, VIEW_SHA),
        (FAMILY, VERSION, SHA, other),
    ):
        with pytest.raises(SignatureError, match="no trusted key verifies"):
            verify_view(view, *args, [public])


def test_a_config_signature_and_a_view_signature_never_stand_for_each_other(
    signer: Ed25519PrivateKey,
) -> None:
    """Three fields against five: a config signature over any digest is no view signature,
    and a view signature is no config signature (a view can never pass for a whole config)."""
    public = signer.public_key()
    view = sign_view(signer, FAMILY, VERSION, SHA, VIEW_SHA)
    for sha in (SHA, VIEW_SHA):
        with pytest.raises(SignatureError):
            verify_config(view, FAMILY, VERSION, sha, [public])
        whole = sign_config(signer, FAMILY, VERSION, sha)
        with pytest.raises(SignatureError):
            verify_view(whole, FAMILY, VERSION, SHA, VIEW_SHA, [public])


# ---------------------------------------------------------------------------------------------
# sign / verify


def test_signed_config_verifies_and_returns_the_key_id(
    signer: Ed25519PrivateKey, signature: str
) -> None:
    public = signer.public_key()
    assert verify_config(signature, FAMILY, VERSION, SHA, [public]) == key_id(public)
    assert len(bytes.fromhex(signature)) == 64 and signature == signature.lower()


def test_flipping_any_byte_of_the_signature_fails(
    signer: Ed25519PrivateKey, signature: str
) -> None:
    raw = bytes.fromhex(signature)
    trusted = [signer.public_key()]
    for i in range(len(raw)):
        for mask in (0x01, 0x80, 0xFF):
            bad = bytearray(raw)
            bad[i] ^= mask
            with pytest.raises(SignatureError, match="no trusted key verifies"):
                verify_config(bad.hex(), FAMILY, VERSION, SHA, trusted)


def test_changing_any_char_of_the_signature_text_fails(
    signer: Ed25519PrivateKey, signature: str
) -> None:
    # Upper-case hex decodes to the same bytes but must fail too: one signature, one text form.
    alphabet = "0123456789abcdefABCDEF"
    trusted = [signer.public_key()]
    for i in range(len(signature)):
        with pytest.raises(SignatureError):
            verify_config(_flip_char(signature, i, alphabet), FAMILY, VERSION, SHA, trusted)


def test_changing_the_family_fails(signer: Ed25519PrivateKey, signature: str) -> None:
    trusted = [signer.public_key()]
    for family in ("prod-eu2", "prod-e", "Prod-eu", "prod-us", "prod-eu "):
        with pytest.raises(SignatureError):
            verify_config(signature, family, VERSION, SHA, trusted)


def test_changing_the_version_fails(signer: Ed25519PrivateKey, signature: str) -> None:
    trusted = [signer.public_key()]
    for version in (0, VERSION - 1, VERSION + 1, 70, 17, 2**63):
        with pytest.raises(SignatureError):
            verify_config(signature, FAMILY, version, SHA, trusted)


def test_changing_any_char_of_the_sha256_fails(signer: Ed25519PrivateKey, signature: str) -> None:
    trusted = [signer.public_key()]
    for i in range(len(SHA)):
        with pytest.raises(SignatureError):
            verify_config(
                signature, FAMILY, VERSION, _flip_char(SHA, i, "0123456789abcdef"), trusted
            )


def test_malformed_sha256_in_verify_is_a_signature_error(
    signer: Ed25519PrivateKey, signature: str
) -> None:
    with pytest.raises(SignatureError, match="sha256"):
        verify_config(signature, FAMILY, VERSION, SHA.upper(), [signer.public_key()])


def test_untrusted_key_fails(signature: str) -> None:
    other = Ed25519PrivateKey.generate().public_key()
    with pytest.raises(
        SignatureError, match=r"no trusted key verifies the signature \(tried 1 key\)"
    ):
        verify_config(signature, FAMILY, VERSION, SHA, [other])


def test_empty_trusted_set_fails(signature: str) -> None:
    with pytest.raises(SignatureError, match=r"tried 0 keys"):
        verify_config(signature, FAMILY, VERSION, SHA, [])


def test_the_right_key_among_several_verifies_and_is_named(
    signer: Ed25519PrivateKey, signature: str
) -> None:
    others = [Ed25519PrivateKey.generate().public_key() for _ in range(4)]
    public = signer.public_key()
    trusted = [*others[:2], public, *others[2:]]
    assert verify_config(signature, FAMILY, VERSION, SHA, trusted) == key_id(public)
    # Any iterable will do, including a one-shot generator.
    assert verify_config(signature, FAMILY, VERSION, SHA, iter(trusted)) == key_id(public)
    with pytest.raises(SignatureError, match=r"tried 4 keys"):
        verify_config(signature, FAMILY, VERSION, SHA, others)


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("", "got 0 characters"),
        ("not hex!", "lowercase hex"),
        ("ab" * 3, "got 6 characters"),
        (bytes(65).hex(), "got 130 characters"),
        (bytes(64).hex()[:-1], "got 127 characters"),
        (" " + bytes(64).hex()[1:], "lowercase hex"),
        (bytes(64).hex()[:-1] + "\n", "lowercase hex"),
        ((b"\xff" * 64).hex().upper(), "lowercase hex"),
        ("é" * 128, "lowercase hex"),
    ],
)
def test_malformed_signature_says_why(bad: str, why: str) -> None:
    public = Ed25519PrivateKey.generate().public_key()
    with pytest.raises(SignatureError, match=why):
        verify_config(bad, FAMILY, VERSION, SHA, [public])


# ---------------------------------------------------------------------------------------------
# public key text and key ids


def test_public_key_text_round_trip() -> None:
    public = Ed25519PrivateKey.generate().public_key()
    text = public_key_text(public)
    algorithm, b64 = text.split(" ")
    assert algorithm == "ed25519"
    assert base64.b64decode(b64, validate=True) == _raw(public)
    assert _raw(parse_public_key_text(text)) == _raw(public)
    assert _raw(parse_public_key_text(f"  {text}\n")) == _raw(public)


def test_key_id_is_the_sha256_prefix_of_the_raw_key() -> None:
    public = Ed25519PrivateKey.generate().public_key()
    assert key_id(public) == hashlib.sha256(_raw(public)).hexdigest()[:16]
    assert len(key_id(public)) == 16


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "two fields"),
        ("ed25519", "two fields"),
        ("ssh-ed25519 " + base64.b64encode(bytes(32)).decode(), "unsupported key type"),
        ("ED25519 " + base64.b64encode(bytes(32)).decode(), "unsupported key type"),
        ("ed25519 " + base64.b64encode(bytes(31)).decode(), "32 bytes"),
        ("ed25519 " + base64.b64encode(bytes(33)).decode(), "32 bytes"),
        ("ed25519 not-base64", "base64"),
        ("ed25519 " + base64.b64encode(bytes(32)).decode().rstrip("="), "base64"),
        ("ed25519 " + base64.b64encode(bytes(32)).decode() + " comment", "two fields"),
        ("ed25519\n" + base64.b64encode(bytes(32)).decode(), "one line"),
    ],
)
def test_parse_public_key_text_refuses_malformed_text(text: str, why: str) -> None:
    with pytest.raises(CryptoError, match=why):
        parse_public_key_text(text)


@given(st.text())
def test_parse_public_key_text_only_ever_raises_crypto_error(text: str) -> None:
    with contextlib.suppress(CryptoError):
        parse_public_key_text(text)


# ---------------------------------------------------------------------------------------------
# key files


def _no_temp_files_left(directory: Path) -> bool:
    return not [p for p in directory.iterdir() if p.name.startswith(".")]


@posix_only
def test_generate_keypair_writes_a_0600_private_key_and_a_one_line_public_key(
    tmp_path: Path,
) -> None:
    private_path, public_path = generate_keypair(tmp_path)
    assert (private_path, public_path) == (tmp_path / "signing.key", tmp_path / "signing.pub")
    assert stat.S_IMODE(private_path.stat().st_mode) == 0o600
    assert private_path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----\n")
    private = load_private_key(private_path)
    public_line = public_path.read_text()
    assert public_line.endswith("\n")
    assert public_line.count("\n") == 1
    assert public_line == public_key_text(private.public_key()) + "\n"
    assert _raw(load_public_key(public_path)) == _raw(private.public_key())
    assert _no_temp_files_left(tmp_path)


@posix_only
def test_private_key_is_0600_even_with_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        private_path, _ = generate_keypair(tmp_path, "lax")
    finally:
        os.umask(old)
    assert stat.S_IMODE(private_path.stat().st_mode) == 0o600


@posix_only
def test_private_key_is_never_world_readable_even_before_it_is_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[Path, int, bytes]] = []

    def spy(real: Callable[[str, str], None]) -> Callable[[str, str], None]:
        def move(src: str, dst: str) -> None:
            src_path = Path(src)
            seen.append((src_path, stat.S_IMODE(src_path.stat().st_mode), src_path.read_bytes()))
            real(src, dst)

        return move

    monkeypatch.setattr(os, "link", spy(os.link))
    monkeypatch.setattr(os, "replace", spy(os.replace))
    generate_keypair(tmp_path, "a")
    generate_keypair(tmp_path, "a", overwrite=True)
    private_moves = [(p, mode) for p, mode, data in seen if b"PRIVATE KEY" in data]
    assert len(private_moves) == 2
    for src, mode in private_moves:
        assert src.parent == tmp_path  # same directory, so the move is an atomic rename
        assert mode == 0o600


def test_generate_keypair_refuses_to_overwrite(tmp_path: Path) -> None:
    private_path, public_path = generate_keypair(tmp_path, "k")
    before = (private_path.read_bytes(), public_path.read_bytes())
    with pytest.raises(CryptoError, match="already exists"):
        generate_keypair(tmp_path, "k")
    assert (private_path.read_bytes(), public_path.read_bytes()) == before
    assert _no_temp_files_left(tmp_path)


def test_generate_keypair_refuses_if_only_the_public_file_exists(tmp_path: Path) -> None:
    (tmp_path / "k.pub").write_text("mine\n")
    with pytest.raises(CryptoError, match=r"k\.pub already exists"):
        generate_keypair(tmp_path, "k")
    assert not (tmp_path / "k.key").exists()
    assert (tmp_path / "k.pub").read_text() == "mine\n"


@posix_only
def test_generate_keypair_overwrites_when_asked(tmp_path: Path) -> None:
    private_path, public_path = generate_keypair(tmp_path, "k")
    old = _raw(load_public_key(public_path))
    assert generate_keypair(tmp_path, "k", overwrite=True) == (private_path, public_path)
    new = load_private_key(private_path).public_key()
    assert _raw(new) != old
    assert _raw(load_public_key(public_path)) == _raw(new)
    assert stat.S_IMODE(private_path.stat().st_mode) == 0o600
    assert _no_temp_files_left(tmp_path)


@pytest.mark.parametrize("name", ["", "../escape", "a/b", ".hidden", "-dash", "sp ace"])
def test_generate_keypair_refuses_bad_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(CryptoError, match="invalid key name"):
        generate_keypair(tmp_path, name)
    assert list(tmp_path.iterdir()) == []


def test_generate_keypair_needs_an_existing_directory(tmp_path: Path) -> None:
    with pytest.raises(CryptoError, match="not a directory"):
        generate_keypair(tmp_path / "missing")


@posix_only
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o700 | 0o001])
def test_private_key_accessible_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    private_path, _ = generate_keypair(tmp_path)
    private_path.chmod(mode)
    with pytest.raises(CryptoError) as info:
        load_private_key(private_path)
    message = str(info.value)
    assert str(private_path) in message
    assert f"chmod 600 {private_path}" in message
    private_path.chmod(0o600)
    load_private_key(private_path)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def _ec_private_pem() -> bytes:
    return ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _encrypted_ed25519_pem() -> bytes:
    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"", "PEM private key"),
        (b"garbage\n", "PEM private key"),
        (bytes(range(256)), "PEM private key"),
        (b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "PEM private key"),
        (b"ed25519 " + base64.b64encode(bytes(32)) + b"\n", "PEM private key"),
        (b"x" * (1024 * 1024), "too big"),
        (_ec_private_pem(), "not an Ed25519"),
        (_encrypted_ed25519_pem(), "encrypted"),
    ],
)
def test_garbage_private_key_files_give_crypto_error_naming_the_file(
    tmp_path: Path, content: bytes, why: str
) -> None:
    path = _write(tmp_path / "bad.key", content)
    with pytest.raises(CryptoError, match=why) as info:
        load_private_key(path)
    assert str(path) in str(info.value)


def test_missing_or_odd_key_files_give_crypto_error_naming_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.key"
    for load in (load_private_key, load_public_key):
        with pytest.raises(CryptoError, match="does not exist") as info:
            load(missing)
        assert str(missing) in str(info.value)
        with pytest.raises(CryptoError, match="not a regular file") as info:
            load(tmp_path)
        assert str(tmp_path) in str(info.value)


def test_load_public_key_accepts_pem_spki(tmp_path: Path) -> None:
    public = Ed25519PrivateKey.generate().public_key()
    pem = public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    path = tmp_path / "k.pem"
    path.write_bytes(pem)
    assert _raw(load_public_key(path)) == _raw(public)


def test_load_public_key_accepts_the_line_without_a_newline(tmp_path: Path) -> None:
    public = Ed25519PrivateKey.generate().public_key()
    path = tmp_path / "k.pub"
    path.write_text(public_key_text(public))
    assert _raw(load_public_key(path)) == _raw(public)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"", "two fields"),
        (b"garbage", "two fields"),
        (b"\xff\xfe\x00", "not text"),
        (b"ed25519 " + base64.b64encode(bytes(31)), "32 bytes"),
        (b"ssh-ed25519 " + base64.b64encode(bytes(32)), "unsupported key type"),
        (b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n", "PEM public key"),
        (
            ec.generate_private_key(ec.SECP256R1())
            .public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
            "not an Ed25519",
        ),
        (_ec_private_pem(), "holds a private key"),
    ],
)
def test_garbage_public_key_files_give_crypto_error_naming_the_file(
    tmp_path: Path, content: bytes, why: str
) -> None:
    path = tmp_path / "bad.pub"
    path.write_bytes(content)
    with pytest.raises(CryptoError, match=why) as info:
        load_public_key(path)
    assert str(path) in str(info.value)


def test_keys_from_files_sign_and_verify(tmp_path: Path) -> None:
    private_path, public_path = generate_keypair(tmp_path, "source")
    signature = sign_config(load_private_key(private_path), FAMILY, VERSION, SHA)
    public = load_public_key(public_path)
    assert verify_config(signature, FAMILY, VERSION, SHA, [public]) == key_id(public)
