"""Admin password hashes: scrypt hashing, the stored hash format, and constant-time checks.

A stored hash is one ASCII line::

    scrypt$n=<N>,r=<R>,p=<P>$<salt>$<hash>

- ``N``, ``R``, ``P``: the scrypt cost parameters, plain decimal (no sign, no leading zeros);
  ``N`` is a power of two >= 2, ``R`` and ``P`` are >= 1. Parameters above the bounds below
  (:data:`MAX_N`, :data:`MAX_R`, :data:`MAX_P`, :data:`MAX_MEMORY_BYTES`, :data:`MAX_WORK_BYTES`)
  are refused, by hashing and by verification alike, so a hostile stored hash cannot make a
  broker allocate gigabytes or spin for minutes.
- ``<salt>``: exactly 16 bytes, ``<hash>``: exactly 32 bytes (scrypt output, ``dklen=32``), both
  in standard base64 (``A-Z a-z 0-9 + /``) *with* ``=`` padding and canonical (the salt is
  always 24 characters ending ``==``, the hash 44 characters ending ``=``).

The password is hashed as its UTF-8 bytes, without normalization. (As in every scrypt, whose
PBKDF2-HMAC step zero-pads short keys, trailing NUL characters do not change the hash.) Example::

    scrypt$n=16384,r=8,p=1$c2FsdHNhbHRzYWx0c2FsdA==$<44 characters>
"""

from __future__ import annotations

import hmac
import os
import re
from dataclasses import dataclass

from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from scale0.crypto.keys import CryptoError, _b64decode_canonical, _b64encode

__all__ = [
    "DEFAULT_N",
    "DEFAULT_P",
    "DEFAULT_R",
    "MAX_MEMORY_BYTES",
    "MAX_N",
    "MAX_P",
    "MAX_R",
    "MAX_WORK_BYTES",
    "dummy_verify",
    "hash_password",
    "is_password_hash",
    "verify_password",
]

DEFAULT_N = 2**14
DEFAULT_R = 8
DEFAULT_P = 1

MAX_N = 2**20
MAX_R = 32
MAX_P = 16
MAX_MEMORY_BYTES = 2**27
"""Bound on scrypt's memory, ``128 * n * r`` bytes (128 MiB; the default costs 16 MiB)."""
MAX_WORK_BYTES = 2**29
"""Bound on scrypt's total mixing, ``128 * n * r * p`` bytes (4x the memory bound)."""

SALT_LEN = 16
HASH_LEN = 32

_PREFIX = "scrypt"
# [0-9], not \d: \d also matches non-ASCII digits. At most 8 digits keeps int() trivially cheap.
_FORMAT_RE = re.compile(
    r"scrypt\$n=([1-9][0-9]{0,7}),r=([1-9][0-9]{0,7}),p=([1-9][0-9]{0,7})"
    r"\$([A-Za-z0-9+/=]{1,64})\$([A-Za-z0-9+/=]{1,64})"
)


@dataclass(frozen=True, slots=True)
class _Parsed:
    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes


def _params_problem(n: int, r: int, p: int) -> str | None:
    """Why (n, r, p) are unacceptable, or None if they are fine."""
    if n < 2 or n & (n - 1):
        return f"n must be a power of two >= 2, got {n}"
    if n > MAX_N:
        return f"n must be <= {MAX_N}, got {n}"
    if not 1 <= r <= MAX_R:
        return f"r must be in 1..{MAX_R}, got {r}"
    if not 1 <= p <= MAX_P:
        return f"p must be in 1..{MAX_P}, got {p}"
    if 128 * n * r > MAX_MEMORY_BYTES:
        return f"128*n*r = {128 * n * r} bytes exceeds the memory bound {MAX_MEMORY_BYTES}"
    if 128 * n * r * p > MAX_WORK_BYTES:
        return f"128*n*r*p = {128 * n * r * p} exceeds the work bound {MAX_WORK_BYTES}"
    return None


def _parse(text: str) -> _Parsed | None:
    """The parsed stored hash, or None if ``text`` is not exactly the documented format."""
    match = _FORMAT_RE.fullmatch(text)
    if match is None:
        return None
    n, r, p = (int(match.group(i)) for i in (1, 2, 3))
    if _params_problem(n, r, p) is not None:
        return None
    salt = _b64decode_canonical(match.group(4))
    digest = _b64decode_canonical(match.group(5))
    if salt is None or len(salt) != SALT_LEN or digest is None or len(digest) != HASH_LEN:
        return None
    return _Parsed(n, r, p, salt, digest)


def _scrypt(password: bytes, salt: bytes, n: int, r: int, p: int) -> bytes:
    return Scrypt(salt=salt, length=HASH_LEN, n=n, r=r, p=p).derive(password)


def _format(n: int, r: int, p: int, salt: bytes, digest: bytes) -> str:
    return f"{_PREFIX}$n={n},r={r},p={p}${_b64encode(salt)}${_b64encode(digest)}"


def hash_password(
    password: str,
    *,
    n: int = DEFAULT_N,
    r: int = DEFAULT_R,
    p: int = DEFAULT_P,
    salt: bytes | None = None,
) -> str:
    """Hash ``password`` with scrypt; returns ``"scrypt$n=..,r=..,p=..$<salt>$<hash>"``.

    See the module docstring for the exact format. ``salt`` (16 bytes) is random unless given.
    CryptoError if the parameters are out of bounds, the salt is not 16 bytes, or the password
    is not encodable as UTF-8 (it holds a lone surrogate).
    """
    for label, value in (("n", n), ("r", r), ("p", p)):
        if type(value) is not int:
            raise CryptoError(f"{label} must be an int, got {value!r}")
    problem = _params_problem(n, r, p)
    if problem is not None:
        raise CryptoError(f"invalid scrypt parameters: {problem}")
    if salt is None:
        salt = os.urandom(SALT_LEN)
    elif not isinstance(salt, bytes) or len(salt) != SALT_LEN:
        raise CryptoError(f"salt must be {SALT_LEN} bytes")
    try:
        secret = password.encode("utf-8")
    except UnicodeEncodeError:
        raise CryptoError("password is not encodable as UTF-8") from None
    return _format(n, r, p, salt, _scrypt(secret, salt, n, r, p))


def is_password_hash(text: str) -> bool:
    """True iff ``text`` is exactly a stored hash in the documented format, within bounds.

    Config validation uses this to refuse plain-text passwords. Never raises.
    """
    return isinstance(text, str) and _parse(text) is not None


def verify_password(password: str, stored: str) -> bool:
    """True iff ``password`` matches the stored hash; compares in constant time.

    A malformed or out-of-bounds stored hash, or a password not encodable as UTF-8, gives
    False; this never raises on bad input.
    """
    parsed = _parse(stored) if isinstance(stored, str) else None
    if parsed is None or not isinstance(password, str):
        return False
    try:
        secret = password.encode("utf-8")
    except UnicodeEncodeError:
        return False
    candidate = _scrypt(secret, parsed.salt, parsed.n, parsed.r, parsed.p)
    return hmac.compare_digest(candidate, parsed.digest)


# A fixed, well-formed hash at the default cost. Its digest matches no password anyone can find
# (it is not the scrypt output of anything we know), which is all dummy_verify needs.
_DUMMY_STORED = _format(
    DEFAULT_N, DEFAULT_R, DEFAULT_P, b"scale0-dummy-slt", bytes(range(0x40, 0x40 + HASH_LEN))
)


def dummy_verify(password: str) -> None:
    """Spend the work of verify_password against a default-cost hash, and discard the result.

    Call it when the auth id is unknown, so the response time does not tell an unknown id from
    a wrong password. It matches the cost of hashes made with the default parameters.
    """
    verify_password(password, _DUMMY_STORED)
