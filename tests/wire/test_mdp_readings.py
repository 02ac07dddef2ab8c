"""The two other readings of MDP/0.2 a broker meets (docs/protocol.md §10): 18/MDP's own framing
(no empty frame 0) and majortomo's (client commands numbered like the worker's, replies without
the service frame). Each is read, and written back, in the framing its peer spoke."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scale0.wire import mdp
from scale0.wire.errors import ProtocolError
from scale0.wire.frames import Message
from scale0.wire.registry import BACKEND_SIGNATURES, FRONTEND_SIGNATURES, decode_to_broker

LIMIT = 1 << 16
names = st.sampled_from(["echo", "a.b", "svc-1"])
bodies = st.lists(st.binary(max_size=20), max_size=3).map(tuple)
tickets = st.binary(min_size=1, max_size=20)

to_broker = st.one_of(
    st.builds(mdp.MdpClientRequest, names, bodies, delimited=st.just(False)),
    st.builds(mdp.MdpWorkerReady, names, delimited=st.just(False)),
    st.builds(mdp.MdpWorkerReply, tickets, bodies, delimited=st.just(False)),
    st.builds(mdp.MdpWorkerPartial, tickets, bodies, delimited=st.just(False)),
    st.builds(mdp.MdpWorkerHeartbeat, delimited=st.just(False)),
    st.builds(mdp.MdpWorkerDisconnect, delimited=st.just(False)),
    st.builds(mdp.MdpClientRequest, names, bodies, majortomo=st.just(True)),
)


def decode(frames: list[bytes]) -> Message:
    client = frames[0] == mdp.MDPC02 or (len(frames) > 1 and frames[1] == mdp.MDPC02)
    signatures = FRONTEND_SIGNATURES if client else BACKEND_SIGNATURES
    return decode_to_broker(frames, max_frame_bytes=LIMIT, signatures=signatures)


@given(to_broker)
def test_each_reading_reads_back_as_it_was_written(message: Message) -> None:
    frames = message.to_frames()
    assert bool(frames[0]) is not getattr(message, "delimited", True)  # frame 0 left out or not
    assert decode(frames) == message


def test_rfc18_frames_have_no_empty_frame_0_both_ways() -> None:
    request = decode([mdp.MDPC02, mdp.C02_REQUEST, b"echo", b"hi"])
    assert request == mdp.MdpClientRequest("echo", (b"hi",), delimited=False)
    reply = mdp.MdpClientReply("echo", (b"hi",), delimited=False)
    assert reply.to_frames() == [mdp.MDPC02, mdp.C02_FINAL, b"echo", b"hi"]
    work = mdp.MdpWorkerRequest(b"T1", (b"x",), delimited=False)
    assert work.to_frames() == [mdp.MDPW02, mdp.W_REQUEST, b"T1", b"", b"x"]


def test_majortomo_requests_and_replies() -> None:
    request = decode([b"", mdp.MDPC02, b"\x02", b"echo", b"hi"])
    assert request == mdp.MdpClientRequest("echo", (b"hi",), majortomo=True)
    final = mdp.MdpClientReply("echo", (b"ok",), majortomo=True)
    assert final.to_frames() == [b"", mdp.MDPC02, b"\x04", b"ok"]
    partial = mdp.MdpClientPartial("echo", (b"p",), majortomo=True)
    assert partial.to_frames() == [b"", mdp.MDPC02, b"\x03", b"p"]


@pytest.mark.parametrize(
    "frames",
    [
        [mdp.MDPC02, mdp.C02_REQUEST],  # no service
        [mdp.MDPW02, mdp.W02_FINAL, b"T1"],  # no empty frame after the client address
        [mdp.MDPW02, b"\x09"],  # unknown command
        [mdp.MDPC01, b"echo"],  # 7/MDP always has frame 0
    ],
)
def test_a_malformed_message_without_frame_0_is_a_protocol_error(frames: list[bytes]) -> None:
    with pytest.raises(ProtocolError):
        decode(frames)
