"""Management messages on the client channel: MANAGEMENTREQ, MANAGEMENTREP (protocol.md §7)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Final, Self

from scale0.wire.frames import (
    SIG_CLIENT,
    JsonValue,
    Message,
    control_frames,
    control_options,
    decode_json,
    encode_json,
    opt_int,
    opt_match,
    opt_name,
    opt_object,
    opt_str,
)

#: Management command names: lower-case words joined by ``_`` (the core owns the actual table).
COMMAND_NAME: Final = re.compile(r"[a-z][a-z0-9_]{0,63}")
#: Passwords are bounded so a broker never runs scrypt over megabytes (docs/protocol.md §7.1).
MAX_PASSWORD_CHARS: Final = 1024


@dataclass(frozen=True, slots=True)
class ManagementRequest(Message):
    """MANAGEMENTREQ client → broker: credentials and one management command (§7.1).

    ``args`` is a JSON object (not hashable: messages are compared, never hashed).
    """

    COMMAND: ClassVar[bytes] = b"MANAGEMENTREQ"
    PROTOCOL: ClassVar[bytes] = SIG_CLIENT

    auth_id: str
    auth_password: str
    command: str
    request_id: str
    args: dict[str, JsonValue] = field(default_factory=dict)

    def to_frames(self) -> list[bytes]:
        return control_frames(
            SIG_CLIENT,
            self.COMMAND,
            {
                "auth_id": self.auth_id,
                "auth_password": self.auth_password,
                "command": self.command,
                "args": self.args or None,
                "request_id": self.request_id,
            },
        )

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        opts = control_options(frames)
        return cls(
            opt_name(opts, "auth_id"),
            opt_str(opts, "auth_password", max_chars=MAX_PASSWORD_CHARS),
            opt_match(opts, "command", COMMAND_NAME, "a command name ([a-z][a-z0-9_]{0,63})"),
            opt_name(opts, "request_id"),
            opt_object(opts, "args"),
        )


@dataclass(frozen=True, slots=True)
class ManagementReply(Message):
    """MANAGEMENTREP broker → client: ``code`` (200 = ok, else §9) and a JSON ``result`` frame."""

    COMMAND: ClassVar[bytes] = b"MANAGEMENTREP"
    PROTOCOL: ClassVar[bytes] = SIG_CLIENT

    request_id: str
    code: int
    result: JsonValue = None
    message: str | None = None

    def to_frames(self) -> list[bytes]:
        return control_frames(
            SIG_CLIENT,
            self.COMMAND,
            {"request_id": self.request_id, "code": self.code, "message": self.message},
            encode_json(self.result),
        )

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        opts = control_options(frames, ("result",))
        return cls(
            opt_name(opts, "request_id"),
            opt_int(opts, "code", minimum=100, maximum=599),
            decode_json(frames[4], 4, "result"),
            opt_str(opts, "message", None),
        )
