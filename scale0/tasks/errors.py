"""The task coordinator's error codes, shared by both protocols (docs/tasks.md §5)."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["ErrorCode", "Refused"]


class ErrorCode(IntEnum):
    """JSON-RPC 2.0's own codes, then the coordinator's (-32000..-32099, "server errors")."""

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    ID_TAKEN = -32001
    UNKNOWN_CLIENT = -32002
    UNKNOWN_NODE = -32003
    UNKNOWN_TASK = -32004
    INVALID_ID = -32005
    STALE_ATTEMPT = -32006
    NOT_FINISHED = -32007
    FORBIDDEN = -32008
    TASK_FAILED = -32009
    INVALID_TASK = -32010

    @property
    def slug(self) -> str:
        """The vespid spelling: ``id-taken``, ``stale-attempt``..."""
        return self.name.lower().replace("_", "-")


class Refused(Exception):
    """An operation the coordinator refuses; nothing was changed."""

    def __init__(self, code: ErrorCode, message: str, data: object = None) -> None:
        self.code = code
        self.message = message
        self.data = data
        super().__init__(f"{code.slug}: {message}")
