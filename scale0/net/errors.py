"""The client library's exceptions where users import them from (scale0.session.errors)."""

from __future__ import annotations

from scale0.session.errors import (
    BrokerRefused,
    Forbidden,
    RequestTimeout,
    Scale0Error,
    ServiceNotFound,
    ServiceUnavailable,
    WorkerFailed,
    WorkerLost,
    error_for_reply,
)

__all__ = [
    "BrokerRefused",
    "Forbidden",
    "RequestTimeout",
    "Scale0Error",
    "ServiceNotFound",
    "ServiceUnavailable",
    "WorkerFailed",
    "WorkerLost",
    "error_for_reply",
]
