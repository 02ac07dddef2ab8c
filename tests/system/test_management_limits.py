"""The HTTP management server's body limit, as a client meets it: 413 with a JSON reason, not a
reset connection (issue 11), on a real scale0-broker process."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from scale0.mgmt.server import MAX_BODY_BYTES
from scale0.testing import Family, running_family

pytestmark = pytest.mark.system

TIMEOUT_S = 15.0


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Family]:
    with running_family(tmp_path_factory.mktemp("limits"), size=1) as started:
        yield started


def post(base: str, body: bytes) -> tuple[int, bytes]:
    parts = urlsplit(base)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    connection = http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)
    try:
        connection.request(
            "POST",
            "/api/login",
            body=body,
            headers={
                "Host": f"{host}:{port}",
                "Origin": f"http://{host}:{port}",
                "Content-Type": "application/json",
            },
        )
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_a_body_over_the_limit_is_answered_413(family: Family) -> None:
    base = family["b1"].management
    padding = "x" * (MAX_BODY_BYTES + 10)
    status, payload = post(base, json.dumps({"auth_id": padding, "password": "p"}).encode())
    assert status == 413, payload
    document = json.loads(payload)
    assert document["code"] == 413
    assert f"the limit is {MAX_BODY_BYTES}" in document["message"]
    # The server still serves the next request (a login with bad credentials: 401).
    status, payload = post(base, json.dumps({"auth_id": "admin", "password": "no"}).encode())
    assert status == 401, payload


def test_a_body_at_the_limit_is_read(family: Family) -> None:
    base = family["b1"].management
    body = json.dumps({"auth_id": "nobody", "password": "p"}).encode()
    body += b" " * (MAX_BODY_BYTES - len(body))
    status, payload = post(base, body)
    assert status in (400, 401), payload
