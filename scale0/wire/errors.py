"""The one exception of the wire layer: ProtocolError, "the peer sent garbage" (protocol.md §9)."""

from __future__ import annotations

from typing import Final

#: A message that is structurally wrong: bad frame count, bad JSON, bad option, bad id.
MALFORMED: Final = 400
#: A signature or command this implementation does not know (docs/protocol.md §9).
UNKNOWN: Final = 501


class ProtocolError(Exception):
    """Untrusted frames could not be decoded.

    ``code`` is the S0P/1 error code the broker answers with (DISCONNECTERROR, docs/protocol.md
    §9): 400 for malformed input, 501 for an unknown signature or command. ``frame`` is the index
    of the offending frame (0 = the empty delimiter after the routing id), or ``None`` when the
    problem is the message as a whole. ``str(error)`` always starts with ``frame N:`` when known.
    """

    __slots__ = ("code", "frame", "reason")

    def __init__(self, code: int, reason: str, *, frame: int | None = None) -> None:
        self.code = code
        self.frame = frame
        self.reason = reason
        super().__init__(reason if frame is None else f"frame {frame}: {reason}")

    @classmethod
    def malformed(cls, frame: int | None, reason: str) -> ProtocolError:
        """A 400: the message is not well formed."""
        return cls(MALFORMED, reason, frame=frame)

    @classmethod
    def unknown(cls, frame: int | None, reason: str) -> ProtocolError:
        """A 501: unknown signature or command."""
        return cls(UNKNOWN, reason, frame=frame)
