"""Password guessing against a real scale0-broker (docs/management.md "Guessing", §8): the
error score is the source address's, so a guesser who opens a new connection for every try is
still banned, on MANAGEMENTREQ and HTTP alike; and failures per auth_id slow down new addresses
while the admin's own address gets in. Several loopback source addresses (127.0.0.x) stand for
several hosts: libzmq connects from one with ``tcp://SOURCE:0;HOST:PORT``."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from scale0.core.guard import AUTH_FREE_FAILURES, address_key
from scale0.net.admin import NoAnswer, Refused, call
from scale0.testing import Family, running_family

pytestmark = pytest.mark.system

TIMEOUT_S = 10.0


def endpoint_from(source: str, frontend: str) -> str:
    """``frontend`` (tcp://127.0.0.1:PORT) connected from the address ``source``."""
    return f"tcp://{source}:0;" + frontend.removeprefix("tcp://")


def try_login(family: Family, source: str, password: str, auth_id: str = "admin") -> int:
    """One MANAGEMENTREQ over a new connection (a new routing id) from ``source``: its code."""
    frontend = endpoint_from(source, family["b1"].endpoints["frontend"])
    try:
        return call(frontend, auth_id, password, "whoami", timeout_s=TIMEOUT_S / 2).code
    except Refused as refused:
        return refused.code  # DISCONNECTERROR: 429 at the ban


def http_login(family: Family, password: str) -> int:
    parts = urlsplit(family["b1"].management)
    host = f"{parts.hostname}:{parts.port}"
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=TIMEOUT_S)
    try:
        connection.request(
            "POST",
            "/api/login",
            body=json.dumps({"auth_id": "admin", "password": password}),
            headers={"Host": host, "Origin": f"http://{host}", "Content-Type": "application/json"},
        )
        return connection.getresponse().status
    finally:
        connection.close()


@pytest.fixture
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Family]:
    with running_family(
        tmp_path_factory.mktemp("guess"),
        size=1,
        error_threshold=3,
        error_window_s=300.0,  # every try counts, however slow the machine checks them
        error_ban_s=300.0,
    ) as started:
        yield started


def test_a_guesser_reconnecting_for_every_try_is_banned_by_address(strict: Family) -> None:
    password = strict.admins["admin"][0]
    codes = [try_login(strict, "127.0.0.2", f"guess-{n}") for n in range(4)]
    assert codes == [401, 401, 401, 429]  # four connections, one score: the address's
    # The ban holds for the address whatever the connection, even with the right password...
    with pytest.raises(NoAnswer):
        call(
            endpoint_from("127.0.0.2", strict["b1"].endpoints["frontend"]),
            "admin",
            password,
            "whoami",
            timeout_s=1.0,
        )
    # ...and the right password from another address is served.
    assert try_login(strict, "127.0.0.1", password) == 200
    text = strict["b1"].stderr_path.read_text().splitlines()
    lines = [json.loads(line) for line in text if line.startswith("{")]
    banned = [line for line in lines if line.get("event") == "sender_banned"]
    assert [line["sender"] for line in banned] == [address_key("127.0.0.2").hex()]


def test_http_and_managementreq_share_the_address_score(strict: Family) -> None:
    # Guesses over HTTP from 127.0.0.1 and over MANAGEMENTREQ from 127.0.0.1: one score.
    assert http_login(strict, "wrong-1") == 401
    assert try_login(strict, "127.0.0.1", "wrong-2") == 401
    assert http_login(strict, "wrong-3") == 401
    assert try_login(strict, "127.0.0.1", "wrong-4") == 429
    assert http_login(strict, strict.admins["admin"][0]) == 403  # banned on HTTP too


@pytest.fixture
def lenient(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Family]:
    with running_family(tmp_path_factory.mktemp("slow"), size=1, error_threshold=1000) as started:
        yield started


def test_failures_per_auth_id_slow_new_addresses_but_not_the_admins_own(lenient: Family) -> None:
    password = lenient.admins["admin"][0]
    assert try_login(lenient, "127.0.0.1", password) == 200  # the admin's usual address
    # An attacker spreads over addresses, below any address's threshold.
    for n in range(AUTH_FREE_FAILURES):
        assert try_login(lenient, f"127.0.1.{n + 1}", "wrong") == 401
    # The account is slowed down now: a new address is told to wait, the password unchecked.
    frontend = endpoint_from("127.0.2.1", lenient["b1"].endpoints["frontend"])
    reply = call(frontend, "admin", password, "whoami", timeout_s=TIMEOUT_S / 2)
    assert reply.code == 429 and "too many failed logins" in (reply.message or "")
    # The admin's own address is not locked out.
    assert try_login(lenient, "127.0.0.1", password) == 200
    # Another account is not affected.
    assert try_login(lenient, "127.0.2.2", lenient.admins["viewer"][0], auth_id="viewer") == 200
