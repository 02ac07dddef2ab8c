"""Tests for scale0.crypto.passwords: scrypt hashes, their format, and verification."""

from __future__ import annotations

import base64
import hashlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scale0.crypto import passwords
from scale0.crypto.keys import CryptoError
from scale0.crypto.passwords import dummy_verify, hash_password, is_password_hash, verify_password

FAST = 2**10  # n for most tests: same code paths, a fraction of the default cost
SALT = bytes(range(16))
FORMAT = re.compile(r"scrypt\$n=(\d+),r=(\d+),p=(\d+)\$([A-Za-z0-9+/]{22}==)\$([A-Za-z0-9+/]{43}=)")


@pytest.fixture(scope="module")
def stored() -> str:
    return hash_password("correct horse", n=FAST, salt=SALT)


def _no_scrypt(*args: object) -> bytes:
    raise AssertionError("scrypt must not run for this stored hash")


def test_hash_then_verify(stored: str) -> None:
    assert verify_password("correct horse", stored)


def test_wrong_password_fails(stored: str) -> None:
    # Not "correct horse\x00": scrypt keys HMAC-SHA256 with the password, and HMAC pads short
    # keys with zero bytes, so trailing NULs never change a scrypt hash (in any implementation).
    for wrong in ("correct horsE", "correct horse ", "", "correct", "correct horse\x01"):
        assert not verify_password(wrong, stored)


@pytest.mark.parametrize("password", ["", "pässwörd ✓", "x" * 10_000, "\x00\n\t"])
def test_any_password_round_trips(password: str) -> None:
    stored = hash_password(password, n=FAST)
    assert verify_password(password, stored)
    assert not verify_password(password + "!", stored)


def test_default_parameters_and_format() -> None:
    stored = hash_password("pw")
    assert stored.startswith("scrypt$n=16384,r=8,p=1$")
    assert FORMAT.fullmatch(stored)
    assert verify_password("pw", stored)


def test_hash_format_parses(stored: str) -> None:
    match = FORMAT.fullmatch(stored)
    assert match is not None
    n, r, p = (int(match.group(i)) for i in (1, 2, 3))
    assert (n, r, p) == (FAST, 8, 1)
    salt = base64.b64decode(match.group(4), validate=True)
    digest = base64.b64decode(match.group(5), validate=True)
    assert salt == SALT
    # An independent implementation (OpenSSL through hashlib) agrees on the digest.
    assert digest == hashlib.scrypt(b"correct horse", salt=salt, n=n, r=r, p=p, dklen=32)
    assert is_password_hash(stored)


def test_parameters_are_recorded_and_used() -> None:
    stored = hash_password("pw", n=2**8, r=4, p=3, salt=SALT)
    assert stored.startswith("scrypt$n=256,r=4,p=3$")
    assert verify_password("pw", stored)
    digest = base64.b64decode(stored.rsplit("$", 1)[1])
    assert digest == hashlib.scrypt(b"pw", salt=SALT, n=256, r=4, p=3, dklen=32)


def test_two_hashes_of_one_password_differ() -> None:
    first = hash_password("same", n=FAST)
    second = hash_password("same", n=FAST)
    assert first != second
    assert first.split("$")[2] != second.split("$")[2]  # the salts
    assert verify_password("same", first)
    assert verify_password("same", second)


def test_a_given_salt_makes_the_hash_deterministic() -> None:
    assert hash_password("pw", n=FAST, salt=SALT) == hash_password("pw", n=FAST, salt=SALT)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n": 1000},
        {"n": 1},
        {"n": 0},
        {"n": 2**21},
        {"n": 2**20, "r": 8},  # 1 GiB of memory
        {"r": 0},
        {"r": 33},
        {"p": 0},
        {"p": 17},
        {"n": 2**17, "r": 8, "p": 5},  # over the total-work bound
        {"n": True},
        {"salt": b"short"},
        {"salt": bytes(17)},
    ],
)
def test_hash_password_refuses_bad_parameters(kwargs: dict[str, object]) -> None:
    with pytest.raises(CryptoError):
        hash_password("pw", **kwargs)  # type: ignore[arg-type]


def test_unencodable_password() -> None:
    with pytest.raises(CryptoError, match="UTF-8"):
        hash_password("lone \udc80 surrogate", n=FAST)
    assert not verify_password("lone \udc80 surrogate", hash_password("x", n=FAST))


def test_plain_text_is_not_a_password_hash() -> None:
    for text in ("", "hunter2", "scrypt", "scrypt$", "$scrypt$n=16384,r=8,p=1$$"):
        assert not is_password_hash(text)


def _mutants(stored: str) -> list[str]:
    """Near misses of a valid stored hash: each one breaks the format in one way."""
    prefix, params, salt, digest = stored.split("$")
    salt_b64 = base64.b64encode
    return [
        stored + "\n",
        " " + stored,
        stored + "$",
        stored.upper(),
        stored.replace("scrypt", "bcrypt"),
        stored.replace("$", ":"),
        f"{prefix}${params}${salt}",
        f"{prefix}${params}${digest}${salt}",
        f"{prefix}$n=1024,p=1,r=8${salt}${digest}",
        f"{prefix}$n=01024,r=8,p=1${salt}${digest}",
        f"{prefix}$n=+1024,r=8,p=1${salt}${digest}",
        f"{prefix}$n=1024,r=8,p=1,x=1${salt}${digest}",
        f"{prefix}$n=١٠٢٤,r=8,p=1${salt}${digest}",  # Arabic-Indic digits: int() takes them
        f"{prefix}$n=1000,r=8,p=1${salt}${digest}",
        f"{prefix}$n=1,r=8,p=1${salt}${digest}",
        f"{prefix}$n=0,r=8,p=1${salt}${digest}",
        f"{prefix}$n=1024,r=0,p=1${salt}${digest}",
        f"{prefix}$n=1024,r=8,p=0${salt}${digest}",
        f"{prefix}$n=1024,r=8,p=1${salt.rstrip('=')}${digest}",
        f"{prefix}$n=1024,r=8,p=1${salt}${digest.rstrip('=')}",
        f"{prefix}$n=1024,r=8,p=1${salt_b64(bytes(15)).decode()}${digest}",
        f"{prefix}$n=1024,r=8,p=1${salt_b64(bytes(17)).decode()}${digest}",
        f"{prefix}$n=1024,r=8,p=1${salt}${salt_b64(bytes(31)).decode()}",
        f"{prefix}$n=1024,r=8,p=1${salt}${salt_b64(bytes(33)).decode()}",
        f"{prefix}$n=1024,r=8,p=1${salt[:-3]}B==${digest}",  # non-canonical trailing bits
        f"{prefix}$n=1024,r=8,p=1${salt.replace('A', '-')}${digest}",
    ]


def test_malformed_stored_hashes_are_refused(stored: str) -> None:
    assert stored.startswith("scrypt$n=1024,r=8,p=1$")
    for mutant in _mutants(stored):
        assert not is_password_hash(mutant), mutant
        assert not verify_password("correct horse", mutant), mutant


@pytest.mark.parametrize(
    "params",
    [
        "n=1073741824,r=8,p=1",
        "n=2097152,r=1,p=1",  # n over MAX_N
        "n=1048576,r=32,p=1",  # each within its own bound, but 4 GiB of memory
        "n=1048576,r=8,p=1",  # 1 GiB
        "n=131072,r=8,p=16",  # 128 MiB, 16 times over
        "n=1024,r=33,p=1",
        "n=1024,r=8,p=17",
        "n=99999999,r=99999999,p=99999999",
        "n=" + "9" * 5000 + ",r=8,p=1",  # beyond int()'s digit limit
    ],
)
def test_hostile_cost_parameters_are_refused_without_running_scrypt(
    params: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    salt = base64.b64encode(SALT).decode()
    digest = base64.b64encode(bytes(32)).decode()
    hostile = f"scrypt${params}${salt}${digest}"
    monkeypatch.setattr(passwords, "_scrypt", _no_scrypt)
    assert not is_password_hash(hostile)
    assert not verify_password("pw", hostile)


def test_the_largest_allowed_memory_is_accepted() -> None:
    salt = base64.b64encode(SALT).decode()
    digest = base64.b64encode(bytes(32)).decode()
    assert is_password_hash(f"scrypt$n=131072,r=8,p=1${salt}${digest}")
    assert is_password_hash(f"scrypt$n=1048576,r=1,p=1${salt}${digest}")


_b64 = st.binary(min_size=14, max_size=18).map(lambda b: base64.b64encode(b).decode())
_b64_digest = st.binary(min_size=30, max_size=34).map(lambda b: base64.b64encode(b).decode())
_param = st.sampled_from(["0", "1", "2", "3", "8", "16", "33", "1024", "-1", "01", "", "2" * 30])


@st.composite
def near_hashes(draw: st.DrawFn) -> str:
    """Strings shaped like stored hashes, with hostile or malformed fields, kept cheap to verify
    (n stays small when the rest is valid)."""
    n, r, p = draw(_param), draw(_param), draw(_param)
    salt = draw(st.one_of(_b64, st.text(max_size=30)))
    digest = draw(st.one_of(_b64_digest, st.text(max_size=50)))
    return f"scrypt$n={n},r={r},p={p}${salt}${digest}"


@given(st.one_of(st.text(), near_hashes(), st.from_regex(passwords._FORMAT_RE, fullmatch=True)))
def test_arbitrary_text_never_raises(text: str) -> None:
    assert isinstance(is_password_hash(text), bool)
    assert verify_password("pw", text) is False or is_password_hash(text)
    assert isinstance(verify_password(text, text), bool)


@given(st.text(max_size=40))
def test_arbitrary_passwords_never_raise_on_verify(password: str) -> None:
    assert isinstance(verify_password(password, "scrypt$n=2,r=1,p=1$x$y"), bool)


def test_dummy_verify_does_the_work_of_a_default_cost_verify(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[int, int, int]] = []
    real = passwords._scrypt

    def spy(password: bytes, salt: bytes, n: int, r: int, p: int) -> bytes:
        calls.append((n, r, p))
        return real(password, salt, n, r, p)

    monkeypatch.setattr(passwords, "_scrypt", spy)
    assert dummy_verify("anything") is None  # type: ignore[func-returns-value]
    assert calls == [(2**14, 8, 1)]
    # It verifies against a well-formed hash that the password does not match.
    assert is_password_hash(passwords._DUMMY_STORED)
    assert not verify_password("anything", passwords._DUMMY_STORED)
