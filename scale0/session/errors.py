"""The client library's exceptions: one type per way a request can fail (protocol.md §3).

Every error carries the ``service`` and ``request_id`` it concerns (``None`` when it concerns the
connection rather than one request), the S0P/1 ``status`` code (``None`` for a timeout, which no
broker reported) and the human ``message``. :func:`error_for_reply` maps an error REPLY.
"""

from __future__ import annotations

from typing import ClassVar

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


class Scale0Error(Exception):
    """Base of every error a Scale0 client raises for a request or its connection."""

    #: The status a subclass stands for; instances may carry another (see WorkerFailed).
    STATUS: ClassVar[int | None] = None

    def __init__(
        self,
        message: str,
        *,
        service: str | None = None,
        request_id: bytes | None = None,
        status: int | None = None,
    ) -> None:
        self.message = message
        self.service = service
        self.request_id = request_id
        self.status = self.STATUS if status is None else status
        super().__init__(message)

    def __str__(self) -> str:
        where = f" (service {self.service!r})" if self.service is not None else ""
        code = f"{self.status}: " if self.status is not None else ""
        return f"{code}{self.message}{where}"


class Forbidden(Scale0Error):
    """403: this client's CURVE key may not call the service (the network config's grants)."""

    STATUS = 403


class ServiceNotFound(Scale0Error):
    """404: no broker in the family knows the service."""

    STATUS = 404


class ServiceUnavailable(Scale0Error):
    """503: no worker for the service took the request before its deadline."""

    STATUS = 503


class WorkerLost(Scale0Error):
    """504: the worker died with the request and the broker could not retry it."""

    STATUS = 504


class WorkerFailed(Scale0Error):
    """500 (or any other non-200 status without a class of its own): the worker reported failure."""

    STATUS = 500


class RequestTimeout(Scale0Error):
    """No answer within the caller's timeout (after every retry); ``status`` is ``None``."""


class BrokerRefused(Scale0Error):
    """The broker answered DISCONNECTERROR; ``status`` is its code (protocol.md §8)."""


_BY_STATUS: dict[int, type[Scale0Error]] = {
    403: Forbidden,
    404: ServiceNotFound,
    503: ServiceUnavailable,
    504: WorkerLost,
}


def error_for_reply(service: str, request_id: bytes, status: int, message: str) -> Scale0Error:
    """The exception for an error REPLY with ``status`` (any non-200) and its body's message."""
    cls = _BY_STATUS.get(status, WorkerFailed)
    return cls(message, service=service, request_id=request_id, status=status)
