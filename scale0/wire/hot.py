"""Raw-frame readers of the hot messages a broker receives: REQUEST, REPLY and HEARTBEAT, and
the Majordomo client REQUEST and worker final reply (§10).

The typed decoders (:func:`scale0.wire.registry.decode_to_broker`) build a message object per
frame list; on the hot path (docs/performance.md) that object lives for a few microseconds. These
readers return the same fields as a tuple instead, and are deliberately conservative: they
accept only the plain, valid form (protocol.md §3.3, §4.3) and answer ``None`` for anything else,
valid or not, so the caller falls back to the typed decoder, which gives the exact error (§2.4)
or the rarer forms. They never raise. Whenever they return fields, those are the fields
``ClientRequest.from_frames`` / ``WorkerReply.from_frames`` would have produced (a property test
holds them to it).

All take the frames as a ROUTER socket hands them over: the routing id first, then frame 0 (the
empty delimiter) and on; so no list is sliced before it is known to be a hot message.

HEARTBEAT is not on the request path, but a broker with thousands of idle clients and workers
receives one from each every interval (docs/performance.md, "Liveness"): its reader matches the
options frame as the plain JSON object ``{"time":<number>,"config_version":<int>}``, or with
``"interval_ms":<int>`` after them (idle beating, §3.4; in that order, JSON whitespace allowed)
with one regular expression instead of the strict JSON decoder.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Final

from scale0.wire.frames import MAX_ID_BYTES, SIG_CLIENT, SIG_WORKER, valid_name
from scale0.wire.mdp import (
    C02_REQUEST,
    MAJORTOMO_REQUEST,
    MDPC01,
    MDPC02,
    MDPW01,
    MDPW02,
    W01_REPLY,
    W02_FINAL,
)

__all__ = [
    "MAJORTOMO_READING",
    "MDP01_READING",
    "MDP02_READING",
    "Beat",
    "MdpReading",
    "client_request_fields",
    "heartbeat_fields",
    "heartbeat_items",
    "hot_items",
    "mdp_client_request_fields",
    "mdp_worker_reply_fields",
    "worker_reply_fields",
]

_REQUEST: Final = b"REQUEST"
_REPLY: Final = b"REPLY"
# The status frame is exactly 3 ASCII digits 100..599 (§2.3): a table lookup checks and parses.
_STATUS: Final[dict[bytes, int]] = {b"%d" % code: code for code in range(100, 600)}
_HEARTBEAT: Final = b"HEARTBEAT"
# The options of a plain HEARTBEAT to the broker: time, a JSON number with a fraction (what
# time.time() gives; an integer time takes the typed path, which turns it into a float), and
# config_version, a JSON integer of at most 18 digits (within int64, the typed limit), then
# optionally interval_ms, a JSON integer 1..999 999 999 (within the typed 1..2^31-1: any other
# value takes the typed path, which names the problem). JSON whitespace is allowed where JSON
# allows it; nothing else (no hbeatinterval_ms, no other key).
_WS: Final = rb"[ \t\n\r]*"
_BEAT_OPTIONS: Final = re.compile(
    rb"\{%(ws)s\"time\"%(ws)s:%(ws)s((?:0|[1-9][0-9]*)\.[0-9]+(?:[eE][-+]?[0-9]+)?)%(ws)s,"
    rb"%(ws)s\"config_version\"%(ws)s:%(ws)s(0|[1-9][0-9]{0,17})%(ws)s"
    rb"(?:,%(ws)s\"interval_ms\"%(ws)s:%(ws)s([1-9][0-9]{0,8})%(ws)s)?\}%(ws)s" % {b"ws": _WS}
)


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


def heartbeat_fields(
    frames: Sequence[bytes], signature: bytes, max_frame_bytes: int
) -> tuple[float, int, int] | None:
    """``(time, config_version, interval_ms)`` of a plain HEARTBEAT in ``signature`` (S0C1 or
    S0W1), or None; ``interval_ms`` 0 when the HEARTBEAT has none.

    Exactly the 5 frames of the control command (routing id, empty, signature, HEARTBEAT,
    options); the options frame as above, ``time`` finite. ``Heartbeat.from_frames`` would read
    the same values (a property test holds it to it; its ``interval_ms`` None for 0), and
    ``hbeatinterval_ms`` as None.
    """
    if (
        len(frames) != 5
        or frames[1]
        or frames[2] != signature
        or frames[3] != _HEARTBEAT
        or len(frames[4]) > max_frame_bytes
    ):
        return None
    match = _BEAT_OPTIONS.fullmatch(frames[4])
    if match is None:
        return None
    sent = float(match[1])
    if not math.isfinite(sent):  # "1.0e999": the typed decoder names the problem
        return None
    promise = match[3]
    return sent, int(match[2]), 0 if promise is None else int(promise)


#: A plain HEARTBEAT read: ``(routing_id, time, config_version, interval_ms)`` (0: none).
Beat = tuple[bytes, float, int, int]
#: An item of :func:`heartbeat_items`: a message's frames, or a plain HEARTBEAT read.
BeatItem = list[bytes] | Beat


def heartbeat_items(
    batch: list[list[bytes]], signature: bytes, max_frame_bytes: int
) -> list[BeatItem]:
    """``batch`` (a ROUTER's messages, as ``recv_batch`` gives them), each plain HEARTBEAT in
    ``signature`` (:func:`heartbeat_fields`) as a :data:`Beat`, ``(routing_id, time,
    config_version, interval_ms)``, every other message as it is. The broker hands a run of
    HEARTBEATs to the core in one call (docs/performance.md, "Liveness");
    ``scale0.net._zmqio.heartbeat_items`` is this function in C (a parity test holds them to
    each other)."""
    items: list[BeatItem] = []
    append = items.append
    for frames in batch:
        beat = heartbeat_fields(frames, signature, max_frame_bytes)
        append(frames if beat is None else (frames[0], beat[0], beat[1], beat[2]))
    return items


#: An item of :func:`hot_items`: a message's frames, a plain HEARTBEAT read (a :data:`Beat`,
#: told by its float time), or a plain REQUEST or REPLY read (routing id, then
#: :func:`client_request_fields` or :func:`worker_reply_fields`).
HotItem = (
    list[bytes]
    | Beat
    | tuple[bytes, str, bytes, tuple[bytes, ...]]
    | tuple[bytes, bytes, int, tuple[bytes, ...]]
)


def hot_items(
    batch: list[list[bytes]], signature: bytes, max_frame_bytes: int, names: dict[bytes, str]
) -> list[HotItem]:
    """``batch`` (a client's or worker's ROUTER messages, as ``recv_batch`` gives them), each
    plain HEARTBEAT in ``signature`` as :func:`heartbeat_items` reads it, and each plain
    message of the request path as ``(routing_id, *fields)``: with ``signature`` S0C1 a REQUEST
    as ``(routing_id, service, request_id, body)`` (:func:`client_request_fields`), with S0W1 a
    REPLY as ``(routing_id, ticket, status, body)`` (:func:`worker_reply_fields`); every other
    message as it is. A REQUEST's service must be in ``names`` (the names already checked:
    :data:`scale0.wire.frames._NAME_CACHE`), else it is passed through, and the caller's
    :func:`client_request_fields` checks it and remembers it for the next time. The broker
    hands each run of one kind to the core in one call (docs/performance.md, "Runs of
    REQUESTs and REPLYs in one call"); ``scale0.net._zmqio.hot_items`` is this function in C
    (a parity test holds them to each other)."""
    items: list[HotItem] = []
    append = items.append
    client = signature == SIG_CLIENT
    for frames in batch:
        n = len(frames)
        if n >= 6 and frames[3] == (_REQUEST if client else _REPLY):
            if (
                not frames[1]
                and frames[2] == signature
                and max(map(len, frames)) <= max_frame_bytes
                and 0 < len(frames[4]) <= MAX_ID_BYTES
            ):
                if client:
                    service = names.get(frames[4])
                    request_id = frames[5]
                    if service is not None and 0 < len(request_id) <= MAX_ID_BYTES:
                        append((frames[0], service, request_id, tuple(frames[6:])))
                        continue
                else:
                    status = _STATUS.get(frames[5])
                    if status is not None:
                        append((frames[0], frames[4], status, tuple(frames[6:])))
                        continue
        elif n == 5:
            beat = heartbeat_fields(frames, signature, max_frame_bytes)
            if beat is not None:
                append((frames[0], beat[0], beat[1], beat[2]))
                continue
        append(frames)
    return items


# --- Majordomo (docs/protocol.md §10) ---------------------------------------------------------
# The delimited readings only (7/MDP; 18/MDP with frame 0, as majortomo and most libraries send
# it): 18/MDP's undelimited text, and anything odd, takes the typed path.

#: A Majordomo client's reading of the protocol: (signature, delimited, majortomo's numbering).
MdpReading = tuple[bytes, bool, bool]
MDP01_READING: Final[MdpReading] = (MDPC01, True, False)
MDP02_READING: Final[MdpReading] = (MDPC02, True, False)
MAJORTOMO_READING: Final[MdpReading] = (MDPC02, True, True)
_MDPC02_COMMANDS: Final[dict[bytes, MdpReading]] = {
    C02_REQUEST: MDP02_READING,
    MAJORTOMO_REQUEST: MAJORTOMO_READING,
}
#: The final-reply command of each worker signature (MDPW01 REPLY, MDPW02 FINAL).
_MDP_FINAL: Final[dict[bytes, bytes]] = {MDPW01: W01_REPLY, MDPW02: W02_FINAL}


def mdp_client_request_fields(
    frames: Sequence[bytes], max_frame_bytes: int
) -> tuple[MdpReading, str, tuple[bytes, ...]] | None:
    """``(reading, service, body)`` of a plain Majordomo client REQUEST, or None.

    MDPC01: ``empty, MDPC01, service, body...``; MDPC02: ``empty, MDPC02, 0x01 (0x02 in
    majortomo's numbering), service, body...``. ``MdpClientRequest.from_frames`` reads the same
    (its protocol, delimited, majortomo fields are the reading).
    """
    if len(frames) < 4 or frames[1] or max(map(len, frames)) > max_frame_bytes:
        return None
    signature = frames[2]
    if signature == MDPC02:
        reading = _MDPC02_COMMANDS.get(frames[3])
        if reading is None or len(frames) < 5:
            return None
        index = 4
    elif signature == MDPC01:
        reading, index = MDP01_READING, 3
    else:
        return None
    service = valid_name(frames[index])
    if service is None:
        return None
    return reading, service, tuple(frames[index + 1 :])


def mdp_worker_reply_fields(
    frames: Sequence[bytes], max_frame_bytes: int
) -> tuple[bytes, tuple[bytes, ...]] | None:
    """``(ticket, body)`` of a plain Majordomo worker final reply, or None: ``empty, MDPW01,
    0x03`` or ``empty, MDPW02, 0x04``, then ``ticket (the client address slot), empty, body...``.
    """
    if (
        len(frames) < 6
        or frames[1]
        or _MDP_FINAL.get(frames[2]) != frames[3]
        or frames[5]
        or max(map(len, frames)) > max_frame_bytes
    ):
        return None
    ticket = frames[4]
    if not 0 < len(ticket) <= MAX_ID_BYTES:
        return None
    return ticket, tuple(frames[6:])
