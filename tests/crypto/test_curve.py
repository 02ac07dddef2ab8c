"""CURVE key files and Z85: the same keys and text as libzmq and pyzmq's zmq.auth, safe files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import zmq
import zmq.auth
from hypothesis import given
from hypothesis import strategies as st
from zmq.utils import z85

from scale0.crypto.curve import (
    curve_key_problem,
    generate_curve_keypair,
    load_curve_public_key,
    load_curve_secret_key,
    public_from_secret,
    z85_decode,
    z85_encode,
)
from scale0.crypto.keys import CryptoError


@given(st.binary(max_size=64).filter(lambda b: len(b) % 4 == 0))
def test_z85_is_pyzmqs_z85_both_ways(data: bytes) -> None:
    text = z85_encode(data)
    assert text == z85.encode(data).decode("ascii")
    assert z85_decode(text) == data


@pytest.mark.parametrize("text", ["abc", "abcd~", "%%%%%", "#####"])
def test_z85_decode_refuses_what_is_not_z85(text: str) -> None:
    assert z85_decode(text) is None


def test_public_from_secret_is_libzmqs_curve_public() -> None:
    public, secret = zmq.curve_keypair()
    assert public_from_secret(secret.decode()) == public.decode()


def test_generated_files_are_zmq_certificates_and_the_secret_one_is_0600(tmp_path: Path) -> None:
    secret_path, public_path, pair = generate_curve_keypair(tmp_path, "b1")
    assert stat.S_IMODE(secret_path.stat().st_mode) == 0o600
    public, secret = zmq.auth.load_certificate(secret_path)
    assert (public.decode(), secret.decode() if secret else None) == (pair.public, pair.secret)
    assert zmq.auth.load_certificate(public_path) == (pair.public.encode(), None)
    assert load_curve_public_key(public_path) == pair.public
    assert load_curve_secret_key(secret_path) == pair
    assert pair.secret not in repr(pair)


def test_an_existing_pair_is_never_overwritten_without_overwrite(tmp_path: Path) -> None:
    secret_path, _public_path, pair = generate_curve_keypair(tmp_path, "w")
    with pytest.raises(CryptoError, match="already exists"):
        generate_curve_keypair(tmp_path, "w")
    assert load_curve_secret_key(secret_path) == pair
    _, _, fresh = generate_curve_keypair(tmp_path, "w", overwrite=True)
    assert load_curve_secret_key(secret_path) == fresh != pair


def test_a_secret_file_others_can_read_is_refused_with_the_fix(tmp_path: Path) -> None:
    secret_path, _, _ = generate_curve_keypair(tmp_path, "c")
    os.chmod(secret_path, 0o644)
    with pytest.raises(CryptoError, match="chmod 600"):
        load_curve_secret_key(secret_path)


def test_the_public_file_is_not_a_secret_key(tmp_path: Path) -> None:
    _, public_path, _ = generate_curve_keypair(tmp_path, "c")
    os.chmod(public_path, 0o600)
    with pytest.raises(CryptoError, match="no secret-key"):
        load_curve_secret_key(public_path)


def test_a_secret_file_whose_public_key_is_not_its_own_is_refused(tmp_path: Path) -> None:
    secret_path, _, pair = generate_curve_keypair(tmp_path, "c")
    other = zmq.curve_keypair()[0].decode()
    secret_path.write_text(secret_path.read_text().replace(pair.public, other))
    with pytest.raises(CryptoError, match="not the public key of its secret-key"):
        load_curve_secret_key(secret_path)


def test_a_damaged_key_in_a_file_names_file_line_and_problem(tmp_path: Path) -> None:
    _, public_path, pair = generate_curve_keypair(tmp_path, "c")
    public_path.write_text(public_path.read_text().replace(pair.public, pair.public[:-1]))
    with pytest.raises(CryptoError, match=r"c\.curve\.pub:\d+: public-key: a CURVE key is 40"):
        load_curve_public_key(public_path)
    with pytest.raises(CryptoError, match="does not exist"):
        load_curve_public_key(tmp_path / "missing.curve.pub")


def test_curve_key_problem_names_what_is_wrong() -> None:
    good = zmq.curve_keypair()[0].decode()
    assert curve_key_problem(good) is None
    assert "40 Z85 characters, got 39" in str(curve_key_problem(good[:-1]))
    assert "not Z85" in str(curve_key_problem("~" * 40))
    assert "got int" in str(curve_key_problem(7))
