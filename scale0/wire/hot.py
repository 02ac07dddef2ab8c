"""Raw-frame readers of the two hot messages a broker receives: client REQUEST and worker REPLY.

The typed decoders (:func:`scale0.wire.registry.decode_to_broker`) build a message object per
frame list; on the hot path (docs/performance.md) that object lives for a few microseconds. These
readers return the same fields as a tuple instead, and are deliberately conservative: they
accept only the plain, valid form (protocol.md §3.3, §4.3) and answer ``None`` for anything else,
valid or not, so the caller falls back to the typed decoder, which gives the exact error (§2.4)
or the rarer forms. They never raise. Whenever they return fields, those are the fields
``ClientRequest.from_frames`` / ``WorkerReply.from_frames`` would have produced (a property test
holds them to it).

Both take the frames as a ROUTER socket hands them over: the routing id first, then frame 0 (the
empty delimiter) and on; so no list is sliced before it is known to be a hot message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from scale0.wire.frames import MAX_ID_BYTES, SIG_CLIENT, SIG_WORKER, valid_name

__all__ = ["client_request_fields", "worker_reply_fields"]

_REQUEST: Final = b"REQUEST"
_REPLY: Final = b"REPLY"
# The status frame is exactly 3 ASCII digits 100..599 (§2.3): a table lookup checks and parses.
_STATUS: Final[dict[bytes, int]] = {b"%d" % code: code for code in range(100, 600)}


def client_request_fields(
    frames: Sequence[bytes], max_frame_bytes: int
) -> tuple[str, bytes, tuple[bytes, ...]] | None:
    """``(service, request_id, body)`` of a plain S0C1 REQUEST, or None (use the typed decoder).

    The service name is checked by :func:`scale0.wire.frames.valid_name`, the typed decoder's
    own rules (remembered after the first time): an invalid one is None, for the typed decoder's
    exact error.
    """
    if (
        len(frames) < 6
        or frames[1]
        or frames[2] != SIG_CLIENT
        or frames[3] != _REQUEST
        or max(map(len, frames)) > max_frame_bytes
    ):
        return None
    service = valid_name(frames[4])
    request_id = frames[5]
    if service is None or not 0 < len(request_id) <= MAX_ID_BYTES:
        return None
    return service, request_id, tuple(frames[6:])


def worker_reply_fields(
    frames: Sequence[bytes], max_frame_bytes: int
) -> tuple[bytes, int, tuple[bytes, ...]] | None:
    """``(ticket, status, body)`` of a plain S0W1 REPLY, or None (use the typed decoder)."""
    if (
        len(frames) < 6
        or frames[1]
        or frames[2] != SIG_WORKER
        or frames[3] != _REPLY
        or max(map(len, frames)) > max_frame_bytes
    ):
        return None
    ticket = frames[4]
    status = _STATUS.get(frames[5])
    if status is None or not 0 < len(ticket) <= MAX_ID_BYTES:
        return None
    return ticket, status, tuple(frames[6:])
