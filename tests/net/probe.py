"""Bounded waits for the socket tests: poll a condition, or what a broker's management reports."""

from __future__ import annotations

from typing import Any

from scale0.config.model import Admin
from scale0.crypto.passwords import hash_password
from scale0.net.admin import call
from scale0.testing import BrokerProcess

WAIT_S = 10.0
#: A read-only admin the tests put in the network config (``running_broker(..., **PROBE)``).
PROBE_ID, PROBE_PASSWORD = "probe", "probe-secret"
PROBE: dict[str, Any] = {"admins": (Admin(PROBE_ID, hash_password(PROBE_PASSWORD), "read"),)}


def management_rows(broker: BrokerProcess, table: str) -> list[dict[str, Any]]:
    """The rows of the ``clients`` or ``workers`` table as the broker reports them right now."""
    reply = call(broker.endpoints["frontend"], PROBE_ID, PROBE_PASSWORD, f"list_{table}")
    assert reply.code == 200, reply
    assert isinstance(reply.result, dict)
    rows = reply.result[table]
    assert isinstance(rows, list)
    return [row for row in rows if isinstance(row, dict)]
